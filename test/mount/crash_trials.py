#!/usr/bin/python3
"""kill -9 trials (SPEC 6): writers through a mount, a SIGKILL at a random
moment, restart, and every committed checkpoint checked byte for byte.

Each trial (its seed printed, all its choices drawn from it):
  1. 1-3 writer processes each write a new checkpoint through the mount
     with tools/shardfs_save.py (random tensors: large flat ranges cut
     anywhere, box grids, whole tensors, sometimes 100-300 small tensors so
     the commit takes longer, sometimes a root file), then commit. Each
     reports its progress (item started, item closed, commit asked, commit
     returned) on a pipe.
  2. At a random moment (once every writer process is up, uniform up to
     1.3x the mean time a writer takes from there to its commit's return,
     or, one trial in three, just after some writer asked for its commit)
     the daemon is killed with SIGKILL (four trials in five) or one
     writer is (the daemon keeps running). The kill is classified by what
     the writers were doing, first match: mid-commit (a commit asked and not
     returned), mid-write (a shard open), between shards (some closed, the
     next not opened yet), or nothing in flight (writers still starting, or
     all committed).
  3. A daemon killed is unmounted and restarted on the same store. Then
     - every checkpoint committed so far (by any earlier trial) must list as
       committed and read back byte for byte against its reference, its
       store files must be exactly those hashed when its commit returned,
       and `shardctl verify` of its store directory must pass: a failure of
       any of these counts it as a damaged committed checkpoint;
     - a checkpoint of this trial whose commit returned is checked in full
       (sfmount.check_written: tensors, slices, npy/, model.safetensors,
       root files) and joins that set;
     - an unfinished one must not be committed unless its commit had been
       asked (then it is checked in full like the above); otherwise it is
       in state `writing` and is either resumed (a new writer writes only
       the items never reported closed, commits, and the whole checkpoint
       is checked) or discarded with `shardctl rm` (gone from the mount and
       the store); it may be absent only if none of its items was closed.
  4. At most --keep-committed checkpoints are kept: the oldest is removed
     with `shardctl rm` (and must be gone from the store).
The end prints a table: trials, kills of the daemon / of a writer, kills
mid-write / between shards / mid-commit / with nothing in flight, committed checkpoints
checked, damaged committed (must be 0), committed at the kill (a commit
asked before the kill took effect), resumed, discarded, absent. Exit 1 on
any failed check.

    crash_trials.py --bin BUILD/tools [--trials N] [--seed N] [--keep-committed N] [--keep]
    crash_trials.py --child MNT NAME SEED [SKIP,...]     (one writer; internal)

Long runs: tools/crash_trials.sh [TRIALS]. ctest runs 2 trials
(mount_crash_trials_smoke).
"""

import argparse
import collections
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sfmount as sm  # noqa: E402

sfs = sm.sfs
MIB = 1 << 20
WAIT_S = 60.0          # bound on a writer finishing, or on one reaching its commit
ARGS = None
# dtypes the writers use: safetensors name -> numpy dtype of its bits
WDT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
       "I32": np.int32, "U8": np.uint8, "I8": np.int8}


# ------------------------------------------------------------ one checkpoint

def make_ckpt(seed):
    """The checkpoint of a seed: (sm.Reference, items); an item is a
    shardfs_save Shard or a root file (name, bytes). Same seed, same bytes,
    in the writer process and in the checker."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    ref = sm.Reference()
    items = []
    if rng.random() < 0.2:        # many small tensors: a longer commit
        for i in range(rng.randint(100, 300)):
            name = "layers/%d/w" % i
            dt = rng.choice(["F32", "BF16", "I8"])
            arr = sm.random_array(nprng, (rng.randint(1, 16), rng.randint(1, 64)), WDT[dt])
            ref.add(name, dt, arr)
            items.append(sfs.Shard(name, arr, dtype=dt))
    else:
        for i in range(rng.randint(1, 5)):
            name = rng.choice(["t", "emb", "a/b/w"]) + ".%d" % i
            r = rng.random()
            if r < 0.35:          # a large flat tensor, cut anywhere (even in elements)
                dt = rng.choice(["U8", "I32", "BF16"])
                isz = np.dtype(WDT[dt]).itemsize
                n = rng.randint(1, 12) * MIB // isz + rng.randrange(1000)
                arr = np.frombuffer(nprng.bytes(n * isz), dtype=WDT[dt])
                ref.add(name, dt, arr)
                raw = ref.tensors[name][2]
                cuts = sorted(set([0, len(raw)] + [rng.randrange(1, len(raw))
                                                   for _ in range(rng.randint(0, 3))]))
                rng.shuffle(cuts)  # pieces in any order
                cuts.sort()
                pieces = list(zip(cuts[:-1], cuts[1:]))
                rng.shuffle(pieces)
                for lo, hi in pieces:
                    items.append(sfs.Shard(name, raw[lo:hi], shape=[n], flat=lo, dtype=dt))
            elif r < 0.75:        # a box grid along dimension 0
                dt = rng.choice(["F32", "F16", "I64", "BF16"])
                shape = [rng.randint(64, 1024), rng.randint(16, 512)]
                arr = sm.random_array(nprng, tuple(shape), WDT[dt])
                ref.add(name, dt, arr)
                cuts = sorted(set([0, shape[0]] + [rng.randrange(1, shape[0])
                                                   for _ in range(rng.randint(0, 3))]))
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    items.append(sfs.Shard(name, arr[lo:hi], shape=shape, offsets=[lo, 0],
                                           dtype=dt))
            else:                 # a small whole tensor
                dt = rng.choice(sorted(WDT))
                shape = [rng.randint(1, 40) for _ in range(rng.randint(0, 3))]
                arr = sm.random_array(nprng, tuple(shape), WDT[dt])
                ref.add(name, dt, arr)
                items.append(sfs.Shard(name, arr, dtype=dt))
    if rng.random() < 0.3:
        body = ('{"seed": %d}' % seed).encode()
        ref.files["config.json"] = body
        items.append(("config.json", body))
    return ref, items


def child(mnt, name, seed, skip):
    """One writer process: every item not in skip, then the commit,
    reporting each step on stdout (read by the parent)."""
    _, items = make_ckpt(seed)
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    say("start")
    os.makedirs(os.path.join(mnt, name, "tensors"), exist_ok=True)
    for i, it in enumerate(items):
        if i in skip:
            continue
        say("item", i)
        if isinstance(it, sfs.Shard):
            sfs.write_shard(mnt, name, it)
        else:
            sfs.write_file(mnt, name, *it)
        say("done", i)
    say("commit")
    sfs.commit(mnt, name)
    say("committed")
    return 0


class Writer:
    """A writer process and what it has reported (its reader thread
    updates phase and done; lock guards them)."""

    def __init__(self, env, mnt, name, seed, skip=()):
        self.name = name
        self.seed = seed
        self.lock = threading.Lock()
        self.phase = "starting"     # starting, item, commit, committed, exited
        self.done = set(skip)       # items reported closed (or finished before)
        self.t_start = None         # when it reported "start" (Python is up)
        self.t_end = None
        self.errpath = env.path("writer-%s-%d.err" % (name, len(skip)))
        self.err = open(self.errpath, "wb")
        argv = ["/usr/bin/python3", os.path.abspath(__file__), "--child", mnt, name, str(seed),
                ",".join(str(i) for i in sorted(skip))]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err,
                                     stdin=subprocess.DEVNULL)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            w = line.decode().split()
            with self.lock:
                if w[0] == "done":
                    self.done.add(int(w[1]))
                    self.phase = "between"
                elif w[0] == "start":
                    self.t_start = time.monotonic()
                elif w[0] in ("item", "commit"):
                    self.phase = w[0]
                elif w[0] == "committed":
                    self.phase = "committed"
                    self.t_end = time.monotonic()

    def snapshot(self):
        with self.lock:
            return self.phase, set(self.done)

    def wait(self, timeout):
        """Exit status (None if it had to be killed)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.thread.join(timeout=5)
            self.err.close()
            return None
        self.thread.join(timeout=5)
        self.err.close()
        return self.proc.returncode

    def stderr_tail(self):
        return sm.read_text(self.errpath)[-600:]


def tree_hashes(top):
    """{relative path: sha256} of every file under top."""
    out = {}
    for dirpath, _, files in os.walk(top):
        for f in files:
            p = os.path.join(dirpath, f)
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(MIB), b""):
                    h.update(chunk)
            out[os.path.relpath(p, top)] = h.hexdigest()
    return out


# ------------------------------------------------------------ the trials

class Trials:
    def __init__(self, env, ck):
        self.env = env
        self.ck = ck
        self.store = env.path("store")
        os.makedirs(self.store)
        self.m = None
        self.nmount = 0
        self.committed = collections.OrderedDict()  # name -> (seed, store hashes)
        self.refs = {}
        self.counts = collections.Counter()
        self.damaged = set()
        self.write_s = []           # how long uninterrupted writers took

    def ref(self, seed):
        if seed not in self.refs:
            self.refs[seed] = make_ckpt(seed)[0]
        return self.refs[seed]

    def mount(self):
        self.nmount += 1
        self.m = sm.Mount(self.env, self.store, name="c%d" % self.nmount)
        self.m.start()

    def est_write_s(self):
        recent = self.write_s[-20:]
        return sum(recent) / len(recent) if recent else 1.5

    def confirm(self, name, seed, label, trng):
        """A checkpoint now committed: check it in full, hash its store files."""
        before = len(self.ck.failures)
        sm.check_written(trng, self.ck, os.path.join(self.m.mnt, name), self.ref(seed), label)
        r = self.env.shardctl_run("verify", os.path.join(self.store, name), check=False)
        self.ck.eq(r.returncode, 0, "%s: shardctl verify: %s" % (
            label, r.stderr.decode(errors="replace")[-300:]))
        if len(self.ck.failures) != before:
            self.damaged.add(name)
        self.committed[name] = (seed, tree_hashes(os.path.join(self.store, name)))

    def check_committed(self, label):
        """Every checkpoint committed so far: intact, byte for byte."""
        names = set(os.listdir(self.m.mnt))
        for name, (seed, hashes) in self.committed.items():
            before = len(self.ck.failures)
            lb = "%s: committed %s" % (label, name)
            self.counts["committed_checks"] += 1
            if self.ck.ok(name in names, "%s: listed" % lb):
                root = os.path.join(self.m.mnt, name)
                self.ck.eq(sfs.state(self.m.mnt, name), "committed", "%s: state" % lb)
                ref = self.ref(seed)
                for t in sorted(ref.tensors):
                    try:
                        self.ck.bytes_eq(sm.read_file(sm.tensor_path(root, t)),
                                         ref.tensors[t][2], "%s: tensors/%s" % (lb, t))
                    except OSError as e:
                        self.ck.ok(False, "%s: tensors/%s: %s" % (lb, t, e))
            self.ck.eq(tree_hashes(os.path.join(self.store, name)), hashes,
                       "%s: store files unchanged" % lb)
            r = self.env.shardctl_run("verify", os.path.join(self.store, name), check=False)
            self.ck.eq(r.returncode, 0, "%s: shardctl verify: %s" % (
                lb, r.stderr.decode(errors="replace")[-300:]))
            if len(self.ck.failures) != before:
                self.damaged.add(name)

    def rm(self, name, label):
        r = self.env.shardctl_run("rm", os.path.join(self.m.mnt, name), check=False)
        self.ck.eq(r.returncode, 0, "%s: shardctl rm %s: %s" % (
            label, name, r.stderr.decode(errors="replace")[-300:]))
        self.ck.ok(not os.path.exists(os.path.join(self.store, name)),
                   "%s: %s gone from the store after rm" % (label, name))

    def trial(self, k, tseed):
        ck, env = self.ck, self.env
        trng = random.Random(tseed)
        label = "trial %d (seed %d)" % (k, tseed)
        while len(self.committed) > ARGS.keep_committed:
            old = next(iter(self.committed))
            self.rm(old, label)
            del self.committed[old]
        mnt = self.m.mnt
        ws = [Writer(env, mnt, "k%d-w%d" % (k, i), trng.randrange(1, 1 << 30))
              for i in range(trng.randint(1, 3))]
        victim = "daemon" if trng.random() < 0.8 else "writer"
        at_commit = trng.random() < 1 / 3
        delay = trng.uniform(0, 1.3 * self.est_write_s())
        t0 = time.monotonic()
        # the moment is drawn from when every writer's Python is up (the
        # start-up takes seconds on a loaded machine)
        while (time.monotonic() < t0 + WAIT_S
               and any(w.t_start is None and w.proc.poll() is None for w in ws)):
            time.sleep(0.005)
        t0 = time.monotonic()
        if at_commit:             # just after some writer asks for its commit
            while (time.monotonic() < t0 + WAIT_S
                   and not any(w.snapshot()[0] in ("commit", "committed") for w in ws)
                   and any(w.proc.poll() is None for w in ws)):
                time.sleep(0.001)
            time.sleep(trng.uniform(0, 0.02))
        else:
            time.sleep(delay)
        phases = [w.snapshot()[0] for w in ws]
        if victim == "daemon":
            self.m.kill9()
            self.counts["kill_daemon"] += 1
        else:
            busy = [w for w in ws if w.proc.poll() is None and w.snapshot()[0] != "committed"]
            target = trng.choice(busy) if busy else None
            if target is not None:
                target.proc.kill()
                phases = [target.snapshot()[0]]
            else:
                phases = []
            self.counts["kill_writer"] += 1
        kind = ("mid-commit" if "commit" in phases else
                "mid-write" if "item" in phases else
                "between" if "between" in phases else "idle")
        self.counts["kill_" + kind] += 1
        print("%s: kill -9 of the %s after %.2fs, %s; writers: %s" % (
            label, victim, time.monotonic() - t0, kind,
            " ".join("%s=%s" % (w.name, w.snapshot()[0]) for w in ws)), flush=True)
        for w in ws:
            rc = w.wait(WAIT_S)
            if w.snapshot()[0] == "committed":      # it ran to the end: a timing
                self.write_s.append(w.t_end - w.t_start)
            elif victim == "writer" and w.proc.returncode != -signal.SIGKILL:
                ck.ok(False, "%s: writer %s failed though the daemon lives (rc %s): %s" % (
                    label, w.name, rc, w.stderr_tail()))
        if victim == "daemon":
            self.m.stop(raise_on_crash=False)   # died by our SIGKILL: expected
            ck.ok(not sm.is_mounted(self.m.mnt), "%s: the dead mount is gone" % label)
            self.mount()
        self.check_committed(label)
        names = set(os.listdir(self.m.mnt))
        for w in ws:
            phase, done = w.snapshot()
            lb = "%s: %s" % (label, w.name)
            if phase == "committed":
                self.confirm(w.name, w.seed, lb, trng)
                continue
            if w.name not in names:
                ck.ok(not done, "%s: absent after the kill though %d item(s) were closed" % (
                    lb, len(done)))
                self.counts["absent"] += 1
                continue
            st = sfs.state(self.m.mnt, w.name)
            if st == "committed":
                # the commit took effect before the kill: only if it was asked
                ck.eq(phase, "commit", "%s: committed, but no commit was asked" % lb)
                self.counts["committed_at_kill"] += 1
                self.confirm(w.name, w.seed, lb, trng)
                continue
            if not ck.eq(st, "writing", "%s: state of the unfinished checkpoint" % lb):
                continue
            if trng.random() < 0.5:
                self.rm(w.name, lb)
                ck.ok(w.name not in os.listdir(self.m.mnt), "%s: listed after rm" % lb)
                self.counts["discarded"] += 1
                continue
            r = Writer(env, self.m.mnt, w.name, w.seed, skip=done)
            rc = r.wait(WAIT_S * 2)
            if ck.eq(rc, 0, "%s: resuming (%d of the items closed before the kill): %s" % (
                    lb, len(done), r.stderr_tail())):
                self.counts["resumed"] += 1
                self.confirm(w.name, w.seed, lb + " (resumed)", trng)
        ck.ok(self.m.alive(), "%s: daemon alive" % label)

    def run(self):
        self.mount()
        master = random.Random(self.env.seed)
        t_start = time.monotonic()
        try:
            for k in range(ARGS.trials):
                self.trial(k, master.randrange(1, 1 << 30))
                self.counts["trials"] += 1
            self.check_committed("at the end")
        finally:
            self.m.stop(raise_on_crash=False)
        c = self.counts
        print("\nshardfs kill -9 trials: %d trials in %.0fs, seed %d" % (
            c["trials"], time.monotonic() - t_start, self.env.seed))
        print()
        print("| trials | kills: daemon / writer | mid-write | between shards | mid-commit | nothing in flight "
              "| committed checkpoints checked | damaged committed | committed at the kill "
              "| resumed | discarded | absent |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("| %d | %d / %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
            c["trials"], c["kill_daemon"], c["kill_writer"], c["kill_mid-write"],
            c["kill_between"], c["kill_mid-commit"], c["kill_idle"], c["committed_checks"], len(self.damaged),
            c["committed_at_kill"], c["resumed"], c["discarded"], c["absent"]))
        self.ck.eq(sorted(self.damaged), [], "damaged committed checkpoints")
        self.ck.eq(c["trials"], ARGS.trials, "trials run")


def run(env, ck):
    Trials(env, ck).run()


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "--child":
        skip = {int(s) for s in (sys.argv[5] if len(sys.argv) > 5 else "").split(",") if s}
        sys.exit(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), skip))
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--keep-committed", type=int, default=6,
                    help="committed checkpoints kept (the oldest is removed)")
    ARGS, rest = ap.parse_known_args()
    sys.exit(sm.main(run, rest))
