#!/usr/bin/python3
"""Soak test: a randomized mix of concurrent clients against ONE
single-process shardfs mount, for --duration seconds.

The store starts with a few checkpoints from `shardctl gen --ref` (mixed
layouts and dtypes, small). Client threads then run until the time is up:
  readers   whole tensors, random preads, mmap, random slice paths, npy/
            views, ranges of model.safetensors, user.shardfs.* xattrs, of
            the generated checkpoints and of the committed ones the writers
            made; every byte is compared with the reference;
  writers   new checkpoints through the mount with tools/shardfs_save.py
            (random dtypes and shapes; whole, box, box-grid, flat and
            replicated shards; sometimes 2-3 writer threads on one
            checkpoint), then committed and read back whole
            (sfmount.check_written), or left uncommitted and discarded with
            `shardctl rm`;
  deleter   `shardctl rm` of a committed written checkpoint while it holds
            files of it open: reads of those must return the right bytes or
            fail cleanly, new opens must fail with ENOENT;
  lister    readdir of the root and of tensors/ trees: every entry stats or
            fails with ENOENT (only in a checkpoint that may be going away).
--crashes times (evenly spread) the daemon is killed with SIGKILL while a
writer is in the middle of a shard, restarted on the same store, and then
every committed checkpoint must read back intact, every checkpoint being
written must come back in state "writing" with its finished shards (only
the unfinished ones are written again before its commit, so a lost or a
wrong resumed shard fails the commit or the read-back), and deleted ones
must stay deleted.

At the end: no mismatch, no daemon crash or sanitizer report (sfmount),
no hung operation (a watchdog bounds every client operation), the
daemon's peak RSS (VmHWM) under a cap and its open descriptors bounded,
and a summary line of operations per kind. Every --sample-s seconds the
daemon's RSS (VmRSS) and open descriptors are sampled; the samples and,
per daemon incarnation, first / last / max after the first minute are
printed (to judge whether they stay flat; not asserted). Random choices come from
--seed (printed); thread scheduling is not replayed, but the seed gives
the same checkpoints, shapes and operation mix.

    test_soak.py --bin BUILD/tools [--duration S] [--seed N] [--crashes N]
                 [--readers N] [--writers N] [--cache-mb N] [--rss-cap-mb N]
                 [--sample-s S] [--keep]
--readers and --writers (default 3 and 2) are the client threads; one
deleter and one lister always run besides them.
"""

import argparse
import collections
import errno
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

sfs = sm.sfs

# The generated checkpoints: (name, layout, ranks, size, dtype, block size).
GEN = [
    ("g-mixed", "mixed", 4, "3M", None, "64K"),
    ("g-llama", "llama", 2, "4M", "BF16", "128K"),
    ("g-fsdp", "fsdp", 3, "2M", "F32", "16K"),
    ("g-repl", "replicated", 2, "1M", "F16", "64K"),
]
# dtypes the writers use: safetensors name -> numpy dtype of its bits
WDT = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
       "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
       "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "BOOL": np.bool_}

ARGS = None               # the soak's own options (see __main__)
STALE_S = 2.0             # bound on a deleted checkpoint still stat-able
MAX_WRITTEN = 8           # committed written checkpoints kept: writers wait
                          # above it, so the store stays small however long


class Target:
    """A committed checkpoint the readers may use: generated (never
    deleted) or written by a writer (may be deleted under the reader)."""

    def __init__(self, name, written, tensors, arrays, st=None, shards=None):
        self.name = name
        self.written = written
        self.tensors = tensors      # NAME -> (dtype, shape)
        self._arrays = arrays       # NAME -> callable giving the array view
        self._bytes = {}
        self.st = st                # verified model.safetensors bytes (generated)
        self.shards = shards        # NAME -> shard count (generated)

    def array(self, t):
        return self._arrays(t)

    def tbytes(self, t):
        b = self._bytes.get(t)
        if b is None:
            b = self._bytes[t] = self.array(t).tobytes()
        return b


def gen_target(ref, name, st, man):
    return Target(name, False, {t: (v["dtype"], v["shape"]) for t, v in ref.tensors.items()},
                  ref.array, st=st,
                  shards={t: len(v["shards"]) for t, v in man["tensors"].items()})


def written_target(ref, name):
    return Target(name, True, {t: (v[0], v[1]) for t, v in ref.tensors.items()}, ref.array)


class Inflight:
    """A checkpoint a writer is working on (until committed and checked,
    or discarded)."""

    def __init__(self, name, ref, shards, files):
        self.name = name
        self.ref = ref
        self.shards = shards        # [Shard], then root files as (name, bytes)
        self.files = files
        self.done = set()           # indices whose close() returned
        self.commit_started = False
        self.rm_started = False


class World:
    """What every client shares; `lock` guards the sets and counters."""

    def __init__(self, env, ck, store):
        self.env = env
        self.ck = ck
        self.store = store
        self.lock = threading.Lock()
        self.targets = {}           # name -> Target (committed, readable)
        self.gen = set()            # names of the generated checkpoints
        self.known = set()          # every name that may appear in the root
        self.doomed = set()         # names being deleted or deleted
        self.rm_inflight = set()    # committed names whose rm is running
        self.inflight = {}          # name -> Inflight
        self.counts = collections.Counter()
        self.ignored = 0            # failures of ops the kill -9 cut short
        self.busy = {}              # client -> (what, since)
        self.writing_now = 0        # shard writes in progress
        self.stop = threading.Event()
        self.dying = threading.Event()
        self.seq = 0
        self.max_stale = 0.0        # longest a deleted checkpoint still stat'ed

    def count(self, kind, n=1):
        with self.lock:
            self.counts[kind] += n

    def finish(self, kind, opck):
        with self.lock:
            self.counts[kind] += 1
            if self.dying.is_set():
                self.ignored += len(opck.failures)
                return
            self.ck.passed += opck.passed
            for f in opck.failures:
                self.ck.failures.append(f)
                print("FAIL:", f)

    def new_name(self, prefix):
        with self.lock:
            self.seq += 1
            name = "%s%d" % (prefix, self.seq)
            self.known.add(name)
        return name


# ------------------------------------------------------------ the clients

class Client(threading.Thread):
    def __init__(self, world, mnt, kind, idx, seed):
        super().__init__(name="%s%d" % (kind, idx), daemon=True)
        self.w = world
        self.mnt = mnt
        self.rng = random.Random(seed)
        self.nprng = np.random.default_rng(seed)

    def ops(self):
        raise NotImplementedError

    def run(self):
        w = self.w
        ops = self.ops()
        kinds = [k for k, _, _ in ops]
        weights = [p for _, _, p in ops]
        fns = {k: f for k, f, _ in ops}
        while not w.stop.is_set() and not w.dying.is_set():
            kind = self.rng.choices(kinds, weights)[0]
            opck = sm.Checker(quiet=True)
            w.busy[self.name] = (kind, time.monotonic())
            try:
                fns[kind](opck)
            except Exception as e:
                opck.ok(False, "%s: %s: unexpected %s: %s" % (
                    self.name, kind, type(e).__name__, e))
                if not w.dying.is_set():
                    traceback.print_exc()
            w.busy.pop(self.name, None)
            w.finish(kind, opck)


class Reader(Client):
    def ops(self):
        return [("whole", self.op_whole, 3), ("pread", self.op_pread, 4),
                ("mmap", self.op_mmap, 1), ("slice", self.op_slice, 4),
                ("npy", self.op_npy, 2), ("st_range", self.op_st, 2),
                ("xattr", self.op_xattr, 2)]

    def pick(self):
        """(Target, tensor name); written ones a third of the time."""
        with self.w.lock:
            ts = list(self.w.targets.values())
        wr = [t for t in ts if t.written]
        if wr and self.rng.random() < 0.33:
            t = self.rng.choice(wr)
        else:
            t = self.rng.choice([t for t in ts if not t.written])
        return t, self.rng.choice(sorted(t.tensors))

    def guard(self, opck, t, what, fn):
        """fn() may fail only when t is a written checkpoint being deleted."""
        try:
            fn()
        except OSError as e:
            with self.w.lock:
                doomed = t.name in self.w.doomed
            if doomed:
                self.w.count("read_err_after_rm")
            else:
                opck.ok(False, "%s: %s/%s: %s" % (self.name, t.name, what, e))

    def op_whole(self, opck):
        t, n = self.pick()
        p = sm.tensor_path(os.path.join(self.mnt, t.name), n)

        def go():
            opck.bytes_eq(sm.read_file(p), t.tbytes(n), "%s: whole %s/%s" % (self.name, t.name, n))
            opck.eq(os.stat(p).st_size, len(t.tbytes(n)), "%s: st_size %s/%s" % (self.name, t.name, n))
        self.guard(opck, t, n, go)

    def op_pread(self, opck):
        t, n = self.pick()
        p = sm.tensor_path(os.path.join(self.mnt, t.name), n)
        want = t.tbytes(n)

        def go():
            fd = os.open(p, os.O_RDONLY)
            try:
                for _ in range(self.rng.randint(1, 8)):
                    off = self.rng.randrange(0, len(want) + 64)
                    ln = self.rng.choice([1, 7, 512, 4096, 65536, 200000,
                                          self.rng.randrange(1, len(want) + 2)])
                    got = os.pread(fd, ln, off)
                    # FUSE may return short reads only at EOF
                    opck.bytes_eq(got, want[off:off + ln], "%s: pread %s/%s off %d len %d" % (
                        self.name, t.name, n, off, ln))
            finally:
                os.close(fd)
        self.guard(opck, t, n, go)

    def op_mmap(self, opck):
        t, n = self.pick()
        p = sm.tensor_path(os.path.join(self.mnt, t.name), n)
        want = t.tbytes(n)

        def go():
            with open(p, "rb") as f:
                with mmap.mmap(f.fileno(), len(want), prot=mmap.PROT_READ) as mm:
                    opck.bytes_eq(mm[:], want, "%s: mmap %s/%s" % (self.name, t.name, n))
        if want:
            self.guard(opck, t, n, go)

    def op_slice(self, opck):
        t, n = self.pick()
        shape = t.tensors[n][1]
        if not shape:
            return
        dims = [sm.random_dim(self.rng, d) for d in shape]
        spec = ",".join(d[0] for d in dims)
        want = t.array(n)[tuple(d[1] for d in dims)].tobytes()
        p = sm.tensor_path(os.path.join(self.mnt, t.name), n, spec)

        def go():
            if self.rng.random() < 0.5:
                got = sm.read_file(p)
            else:
                got = sm.pread_all(p, 0, len(want) + 10)
            opck.bytes_eq(got, want, "%s: slice %s/%s@%s" % (self.name, t.name, n, spec))
        self.guard(opck, t, "%s@%s" % (n, spec), go)

    def op_npy(self, opck):
        t, n = self.pick()
        dt, shape = t.tensors[n]
        if sm.DTYPES[dt][1] is None:
            return
        p = sm.npy_path(os.path.join(self.mnt, t.name), n)

        def go():
            try:
                a = np.load(p)
            except ValueError as e:
                opck.ok(False, "%s: npy %s/%s: %s" % (self.name, t.name, n, e))
                return
            opck.ok(a.dtype == np.dtype(sm.DTYPES[dt][1]) and list(a.shape) == list(shape)
                    and a.tobytes() == t.tbytes(n), "%s: npy %s/%s" % (self.name, t.name, n))
        self.guard(opck, t, "npy/" + n, go)

    def op_st(self, opck):
        t, _ = self.pick()
        p = os.path.join(self.mnt, t.name, "model.safetensors")
        if t.st is not None:       # generated: ranges of the verified bytes
            def go():
                for _ in range(self.rng.randint(1, 6)):
                    off = self.rng.randrange(0, len(t.st) + 64)
                    ln = self.rng.choice([8, 100, 4096, 70000, 1 << 20])
                    opck.bytes_eq(sm.pread_all(p, off, ln), t.st[off:off + ln],
                                  "%s: %s/model.safetensors off %d len %d" % (
                                      self.name, t.name, off, ln))
        else:                      # written: whole file, parsed, every tensor
            def go():
                buf = sm.read_file(p)
                header, base = sm.parse_safetensors(buf)
                opck.eq(sorted(header), sorted(t.tensors), "%s: %s/model.safetensors names" % (
                    self.name, t.name))
                for n, e in header.items():
                    if n in t.tensors:
                        b, end = e["data_offsets"]
                        opck.bytes_eq(buf[base + b:base + end], t.tbytes(n),
                                      "%s: %s/model.safetensors %s" % (self.name, t.name, n))
        self.guard(opck, t, "model.safetensors", go)

    def op_xattr(self, opck):
        t, n = self.pick()
        root = os.path.join(self.mnt, t.name)
        p = sm.tensor_path(root, n)
        dt, shape = t.tensors[n]

        def go():
            opck.eq(os.getxattr(p, "user.shardfs.dtype").decode(), dt,
                    "%s: dtype of %s/%s" % (self.name, t.name, n))
            opck.eq(json.loads(os.getxattr(p, "user.shardfs.shape")), list(shape),
                    "%s: shape of %s/%s" % (self.name, t.name, n))
            shards = json.loads(os.getxattr(p, "user.shardfs.shards"))
            if t.shards is not None:
                opck.eq(len(shards), t.shards[n], "%s: shards of %s/%s" % (self.name, t.name, n))
            state = os.getxattr(root, "user.shardfs.state")
            if state != b"committed":      # "deleted" only once rm has run
                with self.w.lock:
                    doomed = t.name in self.w.doomed
                opck.ok(doomed and state == b"deleted", "%s: state of %s: %r" % (
                    self.name, t.name, state))
        self.guard(opck, t, "xattrs of " + n, go)


class Lister(Client):
    def ops(self):
        return [("list", self.op_list, 1)]

    def op_list(self, opck):
        w = self.w
        names = os.listdir(self.mnt)
        with w.lock:
            known, gen = set(w.known), set(w.gen)
        opck.eq(sorted(set(names) - known), [], "%s: unknown names in the root" % self.name)
        opck.eq(sorted(gen - set(names)), [], "%s: generated checkpoints missing" % self.name)
        for n in names:
            try:
                os.stat(os.path.join(self.mnt, n))
            except OSError as e:
                opck.ok(e.errno == errno.ENOENT and n not in gen,
                        "%s: stat of listed %s: %s" % (self.name, n, e))
        pick = self.rng.sample(names, min(len(names), 2))
        for n in pick:
            top = os.path.join(self.mnt, n, "tensors")
            errs = []
            listed = {}
            for dirpath, _, files in os.walk(top, onerror=errs.append):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        listed[os.path.relpath(p, top)] = os.stat(p).st_size
                    except OSError as e:
                        errs.append(e)
            self.w.count("list_entries", len(listed))
            for e in errs:
                opck.ok(e.errno == errno.ENOENT and n not in gen,
                        "%s: walking %s: %s" % (self.name, top, e))
            if n in gen:
                t = w.targets[n]
                opck.eq(listed, {k: len(t.tbytes(k)) for k in t.tensors},
                        "%s: tensors/ of %s (names, sizes)" % (self.name, n))


class Writer(Client):
    def ops(self):
        return [("write", self.op_write, 1)]

    def make(self):
        """A random checkpoint: (Reference, [Shard], {file: bytes})."""
        rng, nprng = self.rng, self.nprng
        ref = sm.Reference()
        shards = []
        for i in range(rng.randint(1, 4)):
            name = rng.choice(["w", "layers/%d/attn.wq" % i, "emb", "a/b/c"]) + ".%d" % i
            dt = rng.choice(sorted(WDT))
            r = rng.random()
            if r < 0.05:
                shape = []
            elif r < 0.15:
                shape = [rng.randint(64, 400), rng.randint(64, 300)]
            else:
                shape = [rng.randint(1, 40) for _ in range(rng.choice([1, 2, 2, 3]))]
            arr = sm.random_array(nprng, tuple(shape), WDT[dt])
            ref.add(name, dt, arr)
            raw = ref.tensors[name][2]
            how = rng.choice(["whole", "box", "box", "grid", "flat", "flat", "repl", "boxflat"])
            if not shape or (how == "grid" and len(shape) < 2):
                how = "whole"
            if how == "whole":
                shards.append(sfs.Shard(name, arr, dtype=dt))
            elif how == "repl":
                shards += [sfs.Shard(name, arr, dtype=dt), sfs.Shard(name, arr, dtype=dt)]
            elif how == "boxflat":    # a whole box over a whole flat copy
                shards += [sfs.Shard(name, arr, shape=shape, offsets=[0] * len(shape), dtype=dt),
                           sfs.Shard(name, raw, shape=shape, flat=0, dtype=dt)]
            elif how == "flat":       # cuts anywhere, even inside elements
                cuts = sorted(set([0, len(raw)] + [rng.randrange(1, len(raw))
                                                   for _ in range(rng.randint(0, 4))
                                                   if len(raw) > 1]))
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    shards.append(sfs.Shard(name, raw[lo:hi], shape=shape, flat=lo, dtype=dt))
            else:
                dims = [rng.randrange(len(shape))] if how == "box" else [0, 1]
                boxes = [[(0, d) for d in shape]]
                for d in dims:
                    n = shape[d]
                    cuts = sorted(set([0, n] + [rng.randrange(1, n) for _ in range(rng.randint(0, 3))
                                                if n > 1]))
                    boxes = [b[:d] + [(lo, hi)] + b[d + 1:] for b in boxes
                             for lo, hi in zip(cuts[:-1], cuts[1:])]
                for b in boxes:
                    piece = arr[tuple(slice(lo, hi) for lo, hi in b)]
                    shards.append(sfs.Shard(name, piece, shape=shape,
                                            offsets=[lo for lo, _ in b], dtype=dt))
        files = {}
        if rng.random() < 0.3:
            files["config.json"] = json.dumps({"seed": rng.randrange(1 << 30)}).encode()
            ref.files.update(files)
        return ref, shards, files

    def write_part(self, rec, idxs, errs):
        """One writer thread: its share of rec's shards and files."""
        w = self.w
        items = rec.shards + sorted(rec.files.items())
        try:
            for i in idxs:
                if w.dying.is_set():
                    return
                with w.lock:
                    w.writing_now += 1
                try:
                    if i < len(rec.shards):
                        sfs.write_shard(self.mnt, rec.name, items[i])
                    else:
                        sfs.write_file(self.mnt, rec.name, *items[i])
                finally:
                    with w.lock:
                        w.writing_now -= 1
                with w.lock:
                    rec.done.add(i)
        except Exception as e:
            errs.append(e)

    def op_write(self, opck):
        w = self.w
        while not w.stop.is_set() and not w.dying.is_set():   # backpressure
            with w.lock:
                nwritten = sum(1 for t in w.targets.values() if t.written)
            if nwritten < MAX_WRITTEN:
                break
            time.sleep(0.02)
        else:
            return
        ref, shards, files = self.make()
        name = w.new_name("w%s-" % self.name[len("writer"):])
        rec = Inflight(name, ref, shards, files)
        with w.lock:
            w.inflight[name] = rec
        os.makedirs(os.path.join(self.mnt, name, "tensors"), exist_ok=True)
        n = len(shards) + len(files)
        order = list(range(n))
        self.rng.shuffle(order)
        nthreads = min(n, self.rng.choice([1, 1, 2, 3]))
        errs = []
        parts = [order[k::nthreads] for k in range(nthreads)]
        if nthreads == 1:
            self.write_part(rec, parts[0], errs)
        else:
            ths = [threading.Thread(target=self.write_part, args=(rec, p, errs), daemon=True)
                   for p in parts]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            w.count("write_multi")
        w.count("shards_written", len(rec.done))
        for e in errs:
            opck.ok(False, "%s: writing %s: %s" % (self.name, name, e))
        if errs or w.dying.is_set():
            return
        finish_inflight(w, opck, self.mnt, rec, self.rng, "%s: %s" % (self.name, name),
                        commit=self.rng.random() < 0.75)


class Deleter(Client):
    def ops(self):
        return [("delete", self.op_delete, 1)]

    def op_delete(self, opck):
        w = self.w
        with w.lock:
            cands = sorted(n for n, t in w.targets.items() if t.written)
        if len(cands) < MAX_WRITTEN // 2:
            time.sleep(self.rng.uniform(0.05, 0.5))
            return
        name = self.rng.choice(cands)
        t = w.targets[name]
        root = os.path.join(self.mnt, name)
        held = []                  # (fd, expected bytes, label)
        try:
            for n in self.rng.sample(sorted(t.tensors), min(3, len(t.tensors))):
                fd = os.open(sm.tensor_path(root, n), os.O_RDONLY)
                held.append((fd, t.tbytes(n), n))
                b = t.tbytes(n)
                opck.bytes_eq(os.pread(fd, len(b) // 2, 0), b[:len(b) // 2],
                              "%s: %s/%s before rm" % (self.name, name, n))
            fd = os.open(os.path.join(root, "model.safetensors"), os.O_RDONLY)
            st = sm.pread_all(os.path.join(root, "model.safetensors"), 0, 1 << 30)
            held.append((fd, st, "model.safetensors"))
            with w.lock:
                w.doomed.add(name)
                w.rm_inflight.add(name)
                del w.targets[name]
            r = w.env.shardctl_run("rm", root, check=False)
            with w.lock:
                if w.dying.is_set():   # cut by the kill -9: the restart decides
                    return
                w.rm_inflight.discard(name)
            opck.eq(r.returncode, 0, "%s: shardctl rm %s: %s" % (
                self.name, name, r.stderr.decode(errors="replace")[-300:]))
            # open files: right bytes or a clean error, never wrong bytes
            for fd, want, n in held:
                for _ in range(3):
                    off = self.rng.randrange(0, len(want) + 1)
                    ln = self.rng.choice([1, 4096, 65536, len(want)])
                    try:
                        got = os.pread(fd, ln, off)
                    except OSError as e:
                        w.count("open_read_err_after_rm")
                        opck.ok(e.errno in (errno.EIO, errno.ENOENT, errno.ESTALE),
                                "%s: read of open %s/%s after rm: %s" % (self.name, name, n, e))
                        break
                    w.count("open_read_ok_after_rm")
                    opck.bytes_eq(got, want[off:off + ln], "%s: read of open %s/%s after rm" % (
                        self.name, name, n))
            opck.raises(errno.ENOENT, lambda: os.open(sm.tensor_path(root, held[0][2]), os.O_RDONLY),
                        "%s: open in %s after rm" % (self.name, name))
            # The kernel may keep the directory's entry (and attributes) a
            # moment after rm returns: the daemon invalidates it after its
            # reply, and its entry timeout is 1 s. (A readdirplus snapshot
            # taken before the delete used to hand the entry out again,
            # for good: 5 s and more in 300 s runs.) Bounded by STALE_S,
            # the longest is reported.
            t0 = time.monotonic()
            while os.path.exists(root) and time.monotonic() < t0 + STALE_S:
                time.sleep(0.01)
            stale = time.monotonic() - t0
            if stale > 0.01:
                w.count("rm_stale_stat")
            with w.lock:
                w.max_stale = max(w.max_stale, stale)
            opck.raises(errno.ENOENT, lambda: os.stat(root), "%s: stat %s %.0fs after rm" % (
                self.name, name, STALE_S))
            opck.ok(name not in os.listdir(self.mnt), "%s: %s listed after rm" % (self.name, name))
            opck.ok(not os.path.exists(os.path.join(w.store, name)),
                    "%s: %s still in the store after rm" % (self.name, name))
        finally:
            for fd, _, _ in held:
                os.close(fd)


def finish_inflight(w, ck, mnt, rec, rng, label, commit):
    """Commit rec and read it back whole (then readers may use it), or
    discard it with shardctl rm."""
    root = os.path.join(mnt, rec.name)
    if commit:
        rec.commit_started = True
        try:
            sfs.commit(mnt, rec.name)
        except sfs.CommitError as e:
            ck.ok(False, "%s: commit: %s (%s)" % (label, e, e.reason))
            return
        before = len(ck.failures)
        sm.check_written(rng, ck, root, rec.ref, label)
        if len(ck.failures) == before and not w.dying.is_set():
            with w.lock:
                w.targets[rec.name] = written_target(rec.ref, rec.name)
                w.inflight.pop(rec.name, None)
        w.count("commit")
    else:
        ck.eq(sfs.state(mnt, rec.name), "writing", "%s: state before discarding" % label)
        rec.rm_started = True
        r = w.env.shardctl_run("rm", root, check=False)
        if w.dying.is_set():
            return
        ck.eq(r.returncode, 0, "%s: shardctl rm (discard): %s" % (
            label, r.stderr.decode(errors="replace")[-300:]))
        ck.raises(errno.ENOENT, lambda: os.stat(root), "%s: stat after discard" % label)
        ck.ok(not os.path.exists(os.path.join(w.store, rec.name)),
              "%s: still in the store after discard" % label)
        with w.lock:
            w.inflight.pop(rec.name, None)
            w.doomed.add(rec.name)
        w.count("discard")


# ------------------------------------------------------------ set-up, restart

def setup(env, w, store):
    """Generate the checkpoints; their refs and manifests."""
    out = {}
    for k, (name, layout, ranks, size, dtype, bs) in enumerate(GEN):
        ref = env.gen(os.path.join(store, name), layout=layout, ranks=ranks, size=size,
                      dtype=dtype, seed=env.rng.randrange(1, 1 << 30), block_size=bs)
        out[name] = (ref, sm.manifest_of(os.path.join(store, name)))
        w.gen.add(name)
        w.known.add(name)
    return out


def load_gen(w, ck, mnt, gens):
    """Read model.safetensors of each generated checkpoint once, check it
    against the reference, keep it for the readers' ranges."""
    for name, (ref, man) in sorted(gens.items()):
        buf = sm.read_file(os.path.join(mnt, name, "model.safetensors"))
        header, base = sm.parse_safetensors(buf)
        ck.eq(sorted(header), sorted(ref.tensors), "%s: model.safetensors names" % name)
        for n, e in header.items():
            b, end = e["data_offsets"]
            ck.bytes_eq(buf[base + b:base + end], ref.tensor_bytes(n),
                        "%s: model.safetensors bytes of %s" % (name, n))
        w.targets[name] = gen_target(ref, name, buf, man)


def check_after_restart(w, ck, mnt, rng):
    """Everything committed intact, everything unfinished resumed."""
    names = set(os.listdir(mnt))
    ck.eq(sorted(names - w.known), [], "after restart: unknown names in the root")
    for name, t in sorted(w.targets.items()):
        label = "after restart: %s" % name
        if not ck.ok(name in names, "%s: listed" % label):
            continue
        ck.eq(os.getxattr(os.path.join(mnt, name), "user.shardfs.state"), b"committed",
              "%s: state" % label)
        for n in sorted(t.tensors):
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(mnt, name), n)),
                            t.tbytes(n), "%s: tensors/%s" % (label, n))
            except OSError as e:
                ck.ok(False, "%s: tensors/%s: %s" % (label, n, e))
    for name in sorted(w.rm_inflight):       # rm cut short: gone, or still there
        w.count("restart_rm_cut")
        if name in names:
            r = w.env.shardctl_run("rm", os.path.join(mnt, name), check=False)
            ck.eq(r.returncode, 0, "after restart: rm again of %s" % name)
    gone = w.doomed - set(w.inflight) - w.rm_inflight
    w.rm_inflight.clear()
    ck.eq(sorted(gone & names), [], "after restart: deleted checkpoints came back")
    for name, rec in sorted(w.inflight.items()):
        label = "after restart: %s" % name
        if name not in names:
            # nothing finished yet: there may be nothing to resume
            ck.ok(not rec.done or rec.rm_started, "%s: unfinished checkpoint with %d finished "
                  "shards not resumed" % (label, len(rec.done)))
            w.count("restart_absent")
            w.doomed.add(name)
            continue
        st = sfs.state(mnt, name)
        if rec.rm_started:
            w.count("restart_rm_cut")
            r = w.env.shardctl_run("rm", os.path.join(mnt, name), check=False)
            ck.eq(r.returncode, 0, "%s: rm again (state %s)" % (label, st))
            w.doomed.add(name)
            continue
        if st == "committed":
            ck.ok(rec.commit_started, "%s: committed, but no commit was asked" % label)
            w.count("restart_committed")
            sm.check_written(rng, ck, os.path.join(mnt, name), rec.ref, label)
            w.targets[name] = written_target(rec.ref, name)
            continue
        ck.eq(st, "writing", "%s: state of the unfinished checkpoint" % label)
        w.count("restart_resumed")
        items = rec.shards + sorted(rec.files.items())
        for i in sorted(rec.done):
            if i < len(rec.shards):
                p = sm.tensor_path(os.path.join(mnt, name), items[i].name)
                ck.eq(os.getxattr(p, "user.shardfs.dtype").decode(),
                      rec.ref.tensors[items[i].name][0], "%s: declaration of %s survives" % (
                          label, items[i].name))
        if rng.random() < 0.25:
            finish_inflight(w, ck, mnt, rec, rng, label, commit=False)
            continue
        # write only what was not finished: the resumed shards must be
        # complete and right, or the commit (gap, overlap with different
        # bytes) or the read-back fails
        todo = [i for i in range(len(items)) if i not in rec.done]
        w.count("restart_rewritten", len(todo))
        for i in todo:
            if i < len(rec.shards):
                sfs.write_shard(mnt, name, items[i])
            else:
                sfs.write_file(mnt, name, *items[i])
        finish_inflight(w, ck, mnt, rec, rng, label, commit=True)
    w.inflight.clear()


def start_clients(w, mnt, rng, nreaders, nwriters):
    cl = [Reader(w, mnt, "reader", i, rng.randrange(1 << 30)) for i in range(nreaders)]
    cl += [Writer(w, mnt, "writer", i, rng.randrange(1 << 30)) for i in range(nwriters)]
    cl += [Deleter(w, mnt, "deleter", 0, rng.randrange(1 << 30)),
           Lister(w, mnt, "lister", 0, rng.randrange(1 << 30))]
    for c in cl:
        c.start()
    return cl


def join_clients(w, ck, clients, bound_s):
    end = time.monotonic() + bound_s
    for c in clients:
        c.join(timeout=max(0.1, end - time.monotonic()))
        if c.is_alive():
            what = w.busy.get(c.name, ("?", time.monotonic()))
            ck.ok(False, "client %s did not stop within %.0fs (in %s for %.0fs): hang" % (
                c.name, bound_s, what[0], time.monotonic() - what[1]))


def dump_daemon(m):
    """On a hang: every daemon thread's state (R: runnable, so starved of
    CPU; S/D: waiting) and kernel wait channel, and its stacks (gdb, when
    installed) in /tmp/soak-hang-PID.txt, kept after the run."""
    pid = m.proc.pid
    states = collections.Counter()
    rows = []
    for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
            with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                wchan = f.read().strip()
        except OSError:
            continue
        states[st] += 1
        rows.append("%s %s %s" % (tid, st, wchan))
    out = "/tmp/soak-hang-%d.txt" % pid
    with open(out, "w") as f:
        f.write("threads (tid state wchan):\n%s\n\n" % "\n".join(rows))
        f.flush()
        try:
            subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                           stdout=f, stderr=subprocess.STDOUT, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            f.write("gdb: %s\n" % e)
    print("soak: hang: daemon threads by state %s; states, wait channels and stacks in %s" % (
        dict(states), out))


def watchdog(w, ck, hang_s, m=None):
    """False (and a failure) when some client operation runs too long."""
    now = time.monotonic()
    for name, (what, t0) in list(w.busy.items()):
        if now - t0 > hang_s:
            with w.lock:
                ck.ok(False, "client %s: %s has run %.0fs (bound %.0fs): hang" % (
                    name, what, now - t0, hang_s))
                print("soak: client operations in flight: %s" % ", ".join(
                    "%s %s %.0fs" % (c, wh, now - t) for c, (wh, t) in sorted(w.busy.items())))
            if m is not None:
                dump_daemon(m)
            return False
    return True


def rss_kb(m):
    """The daemon's resident set now (VmRSS, kB), None if it is gone."""
    try:
        with open("/proc/%d/status" % m.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def report_samples(samples, warmup_s=60.0):
    """Print the RSS / descriptor samples [(t, incarnation, kB, fds)] and,
    per incarnation, first / last / max once warmed up."""
    print("soak: samples (t s, incarnation, RSS MiB, fds): %s" % " ".join(
        "%.0f/%d/%.1f/%s" % (t, inc, (kb or 0) / 1024, fds) for t, inc, kb, fds in samples))
    for inc in sorted(set(s[1] for s in samples)):
        mine = [s for s in samples if s[1] == inc]
        t_first = mine[0][0]
        warm = [s for s in mine if s[0] >= t_first + warmup_s]
        what = "%d samples after its first %.0fs" % (len(warm), warmup_s)
        if not warm:
            warm, what = mine, "all %d samples (it ran under %.0fs)" % (len(mine), warmup_s)
        kbs = [s[2] or 0 for s in warm]
        fds = [s[3] or 0 for s in warm]
        print("soak: incarnation %d, %.0f-%.0fs, %s: RSS MiB first %.1f "
              "last %.1f max %.1f; fds first %d last %d max %d" % (
                  inc, warm[0][0], warm[-1][0], what, kbs[0] / 1024,
                  kbs[-1] / 1024, max(kbs) / 1024, fds[0], fds[-1], max(fds)))


def run(env, ck):
    args = ARGS
    store = env.path("store")
    os.makedirs(store)
    w = World(env, ck, store)
    gens = setup(env, w, store)
    opts = ["--cache-mb", str(args.cache_mb)]
    if args.transport:
        opts += ["--transport", args.transport]
        param = "/sys/module/fuse/parameters/enable_uring"
        if args.transport != "dev" and os.path.exists(param):
            # FUSE over io_uring needs the kernel's switch: on for the
            # soak, put back at exit
            with open(param) as f:
                old = f.read().strip()
            sm._cleanups.append(lambda: open(param, "w").write(old))
            with open(param, "w") as f:
                f.write("1")
    t_start = time.monotonic()
    end = t_start + args.duration
    crash_at = [t_start + args.duration * (k + 1) / (args.crashes + 1)
                for k in range(args.crashes)]
    hwm = []                       # (incarnation, VmHWM kB)
    samples = []                   # (t s, incarnation, VmRSS kB, fds)
    next_sample = t_start
    ncrash = 0
    m = sm.Mount(env, store, opts, name="soak0")
    m.start()
    sanitized = m.sanitized()
    cap_mb = args.rss_cap_mb or (args.cache_mb + (1536 if sanitized else 256))
    hang_s = 240.0 if sanitized else 90.0
    print("soak: %.0fs, %d readers, %d writers, %d kill -9 restarts, --cache-mb %d, "
          "RSS cap %d MiB%s" % (args.duration, args.readers, args.writers, args.crashes,
                                args.cache_mb, cap_mb, " (ASan daemon)" if sanitized else ""))
    load_gen(w, ck, m.mnt, gens)
    clients = start_clients(w, m.mnt, env.rng, args.readers, args.writers)
    try:
        while time.monotonic() < end:
            time.sleep(0.2)
            if args.sample_s > 0 and time.monotonic() >= next_sample:
                next_sample += args.sample_s
                samples.append((time.monotonic() - t_start, ncrash, rss_kb(m), m.open_fds()))
            if not watchdog(w, ck, hang_s, m):
                break
            if m.proc.poll() is not None:
                ck.ok(False, "daemon died during the soak (rc %s)" % m.proc.returncode)
                break
            if crash_at and time.monotonic() >= crash_at[0]:
                crash_at.pop(0)
                # kill in the middle of a shard write (bounded wait for one)
                t0 = time.monotonic()
                while w.writing_now == 0 and time.monotonic() < t0 + 10:
                    time.sleep(0.005)
                mid = w.writing_now > 0
                w.dying.set()
                hwm.append((m.mnt, m.rss_peak_kb()))
                m.kill9()
                ncrash += 1
                print("soak: t=%.0fs kill -9 #%d (%s), %d unfinished checkpoint(s)" % (
                    time.monotonic() - t_start, ncrash,
                    "mid shard write" if mid else "no shard write in flight", len(w.inflight)))
                w.count("kill9_mid_write" if mid else "kill9_idle")
                join_clients(w, ck, clients, 60)
                m.stop(raise_on_crash=False)
                problems = [f for f in (sm.read_text(m.logpath),) if any(
                    k in f for k in ("AddressSanitizer", "LeakSanitizer", "runtime error:"))]
                ck.eq(problems, [], "sanitizer report before the kill -9 (%s)" % m.logpath)
                w.dying.clear()
                m = sm.Mount(env, store, opts, name="soak%d" % ncrash)
                m.start()
                check_after_restart(w, ck, m.mnt, env.rng)
                clients = start_clients(w, m.mnt, env.rng, args.readers, args.writers)
    finally:
        w.stop.set()
        join_clients(w, ck, clients, hang_s)
        fds = m.open_fds()
        # Descriptors on deleted files (payloads, journals of deleted or
        # committed checkpoints) must all be closed once every client closed
        # its files: they would keep the deleted files' space. RELEASE is
        # asynchronous, so allow the last ones a moment.
        deadline = time.monotonic() + 5
        gone = m.deleted_fds()
        while gone and time.monotonic() < deadline:
            time.sleep(0.1)
            gone = m.deleted_fds()
        ck.eq(gone, [], "no daemon descriptor on a deleted file at the end")
        fds_deleted = len(gone) if gone is not None else None
        hwm.append((m.mnt, m.rss_peak_kb()))
        samples.append((time.monotonic() - t_start, ncrash, rss_kb(m), fds))
        ck.ok(m.alive(), "daemon alive at the end of the soak")
        m.stop()
    elapsed = time.monotonic() - t_start
    peak = max(kb or 0 for _, kb in hwm)
    report_samples(samples)
    print("soak: daemon VmHWM per incarnation (MiB): %s" % ", ".join(
        "%.1f" % ((kb or 0) / 1024) for _, kb in hwm))
    ck.ok(all(kb is not None for _, kb in hwm), "daemon VmHWM readable")
    ck.ok(peak <= cap_mb * 1024, "daemon peak RSS %.1f MiB under the cap %d MiB" % (
        peak / 1024, cap_mb))
    ck.ok(fds is not None and fds < 1024 + 64, "daemon open fds bounded at the end (%s)" % fds)
    with w.lock:
        counts = dict(w.counts)
    ops = sum(v for k, v in counts.items() if k in (
        "whole", "pread", "mmap", "slice", "npy", "st_range", "xattr", "list", "write", "delete"))
    ck.ok(ops > 0 and counts.get("write", 0) > 0, "the soak did reads and writes")
    print("soak summary: %.1fs, seed %s, %d ops (%s), %d kill -9, peak RSS %.1f MiB, "
          "%d daemon fds at the end (%s on deleted files), deleted checkpoint stat-able up to %.2fs after rm, "
          "%d failure(s) of ops cut by kill -9 ignored" % (
              elapsed, env.seed, ops, " ".join("%s=%d" % kv for kv in sorted(counts.items())),
              ncrash, peak / 1024, fds or -1, fds_deleted, w.max_stale, w.ignored))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of soak")
    ap.add_argument("--crashes", type=int, default=None,
                    help="kill -9 + restart cycles (default: one per 75 s, at least 1)")
    ap.add_argument("--cache-mb", type=int, default=16, help="daemon --cache-mb (small: evictions)")
    ap.add_argument("--rss-cap-mb", type=int, default=0,
                    help="cap on the daemon's VmHWM (default: cache + 256, + 1536 under ASan)")
    ap.add_argument("--transport", choices=("auto", "dev", "uring"), default=None,
                    help="daemon --transport (auto, uring: enable_uring set for the soak)")
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--sample-s", type=float, default=10.0,
                    help="seconds between samples of the daemon's RSS and fds (0: none)")
    ARGS, rest = ap.parse_known_args()
    if ARGS.crashes is None:
        ARGS.crashes = max(1, int(ARGS.duration // 75))
    sys.exit(sm.main(run, rest))
