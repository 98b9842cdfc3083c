#!/usr/bin/python3
"""Mount test: shardfs --direct-io (issue 12, item 3).

Committed files are opened with FUSE direct_io, and the daemon adds
FUSE_DIRECT_IO_ALLOW_MMAP to libfuse's INIT reply so that mmap keeps
working. Checked on a store of two copies of one generated checkpoint (one
with a flipped payload byte) and a checkpoint written through the mount:
  - the mode is real: after a whole read() the file has no page in the
    mount's page cache (cachestat(2)), while a mapping's pages do land
    there; a default mount caches what read() read;
  - every tensor, npy/ file, model.safetensors and some slices equal the
    reference, whole and by preads of 1 byte to 200 KB (across the end);
  - mmap(MAP_SHARED) of tensors, model.safetensors and numpy.memmap of
    npy/ equal the reference, also a second time (a new mapping drops the
    cached pages no mapping holds) and mixed with read() on one handle;
  - 4 threads of small preads at once read the right bytes;
  - a flipped payload byte: read() and a 1-byte pread of its block fail
    with EIO, a mapping of it gets SIGBUS (in a child: nothing
    unverified reaches the reader), the rest of the tensor reads;
  - writing a checkpoint through the mount and committing it works as
    without the option, and it reads back.
Also the default mount of a store that is one checkpoint (issue 12, item
4): mounted read-only with FUSE's no_open (the daemon answers the first
OPEN with ENOSYS; the kernel then opens files itself and sends no OPEN,
FLUSH or RELEASE): /proc/mounts says ro, files opened again and again read
right, by read() and mmap, stay in the page cache between opens, and
opening for writing fails with EROFS.
"""

import ctypes
import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

GEN = dict(layout="mixed", ranks=3, size="6M", seed=71, block_size="16K")
SYS_CACHESTAT = 451  # x86_64 and most others; Linux 6.5+


class CacheStat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


class CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def cached_pages(path):
    """Pages of path in the page cache (cachestat), or None without it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        cs, cr = CacheStat(), CacheRange(0, 0)
        rc = _libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(cr), ctypes.byref(cs), 0)
        if rc != 0:
            return None
        return cs.nr_cache
    finally:
        os.close(fd)



def check_page_cache(ck, mnt_direct, mnt_cached, name):
    """read() leaves nothing in the page cache under --direct-io; a mapping
    does; a default mount caches read()'s pages."""
    p = sm.tensor_path(os.path.join(mnt_direct, "a"), name)
    if cached_pages(p) is None:
        print("cachestat(2) unavailable: page-cache checks skipped")
        return
    sm.read_file(p)
    ck.eq(cached_pages(p), 0, "--direct-io: no page of tensors/%s cached after read()" % name)
    sm.mmap_bytes(p)
    ck.ok(cached_pages(p) > 0, "--direct-io: a mapping's pages of tensors/%s are cached" % name)
    q = sm.tensor_path(os.path.join(mnt_cached, "a"), name)
    sm.read_file(q)
    ck.ok(cached_pages(q) > 0, "default mount: read() of tensors/%s is cached" % name)


def check_bytes(env, ck, root, ref, st_want, label):
    rng = env.rng
    names = sorted(ref.tensors)
    for name in names:
        p = sm.tensor_path(root, name)
        want = ref.tensor_bytes(name)
        try:
            ck.bytes_eq(sm.read_file(p), want, "%s: read tensors/%s" % (label, name))
            ck.bytes_eq(sm.mmap_bytes(p), want, "%s: mmap tensors/%s" % (label, name))
            ck.bytes_eq(sm.mmap_bytes(p), want, "%s: mmap tensors/%s again" % (label, name))
        except OSError as e:
            ck.ok(False, "%s: tensors/%s: %s" % (label, name, e))
    for _ in range(80):
        name = rng.choice(names)
        want = ref.tensor_bytes(name)
        size = len(want)
        off = rng.randrange(0, size + 4096)
        length = rng.choice([1, 3, 4096, 5000, 65543, 200000, size + 7])
        if rng.random() < 0.3 and size:
            off = max(0, size - rng.randrange(1, 3000))
        try:
            got = sm.pread_all(sm.tensor_path(root, name), off, length)
        except OSError as e:
            ck.ok(False, "%s: pread(%s, %d, %d): %s" % (label, name, off, length, e))
            continue
        ck.bytes_eq(got, want[off:off + length], "%s: pread(%s, off %d, len %d)" % (
            label, name, off, length))
    # model.safetensors: read, preads, mapped, and read + mmap on one handle
    stp = os.path.join(root, "model.safetensors")
    ck.bytes_eq(sm.read_file(stp), st_want, "%s: read model.safetensors" % label)
    ck.bytes_eq(sm.mmap_bytes(stp), st_want, "%s: mmap model.safetensors" % label)
    with open(stp, "rb", buffering=0) as f:
        with mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            half = len(st_want) // 2
            ck.bytes_eq(m[:half], st_want[:half], "%s: mapped first half" % label)
            f.seek(half)
            ck.bytes_eq(f.read(), st_want[half:], "%s: read() second half, same handle" % label)
            ck.bytes_eq(m[half:], st_want[half:], "%s: mapped second half" % label)
    # npy/ by numpy.load and numpy.memmap
    nnpy = 0
    for name in names:
        p = sm.npy_path(root, name)
        want = ref.tensor_bytes(name)
        if not want or not os.path.exists(p):
            continue
        ck.bytes_eq(np.load(p).tobytes(), want, "%s: np.load npy/%s" % (label, name))
        am = np.load(p, mmap_mode="r")
        ck.bytes_eq(np.ascontiguousarray(am).tobytes(), want,
                    "%s: np.load(mmap_mode='r') npy/%s" % (label, name))
        del am
        nnpy += 1
    ck.ok(nnpy > 0, "%s: npy/ files read" % label)
    # slices: a box of each 2-d tensor
    nslices = 0
    for name in names:
        want = ref.array(name)
        if want.ndim != 2 or min(want.shape) < 3:
            continue
        r0, r1 = 1, want.shape[0] - 1
        c0, c1 = 1, want.shape[1] // 2 + 1
        p = sm.tensor_path(root, name, "%d:%d,%d:%d" % (r0, r1, c0, c1))
        box = np.ascontiguousarray(want[r0:r1, c0:c1]).tobytes()
        ck.bytes_eq(sm.read_file(p), box, "%s: slice of %s" % (label, name))
        ck.bytes_eq(sm.mmap_bytes(p), box, "%s: mapped slice of %s" % (label, name))
        nslices += 1
    ck.ok(nslices > 0, "%s: slices read" % label)


def check_threads(env, ck, root, ref):
    names = sorted(ref.tensors)
    errors = []
    seeds = [env.rng.randrange(1 << 30) for _ in range(4)]

    def worker(seed):
        import random
        r = random.Random(seed)
        for _ in range(150):
            name = r.choice(names)
            want = ref.tensor_bytes(name)
            off = r.randrange(0, len(want) + 1)
            length = r.choice([512, 4096, 9000, 65536])
            try:
                got = sm.pread_all(sm.tensor_path(root, name), off, length)
            except OSError as e:
                errors.append("%s: %s" % (name, e))
                continue
            if got != want[off:off + length]:
                errors.append("%s off %d len %d: wrong bytes" % (name, off, length))
    ts = [threading.Thread(target=worker, args=(s,)) for s in seeds]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ck.eq(errors[:5], [], "4 threads of preads under --direct-io")


MMAP_CHILD = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
sys.stdout.write("%d" % m[int(sys.argv[2])])
"""


def check_flip(env, ck, m, store, ref):
    man = sm.manifest_of(os.path.join(store, "flip"))
    bs = man["block_size"]
    # the largest flat-range shard of a tensor without overlapping shards
    best = None
    for name in sorted(ref.tensors):
        shards = man["tensors"][name]["shards"]
        if sum(s["nbytes"] for s in shards) != ref.nbytes(name):
            continue
        for s in shards:
            if "flat" in s and s["nbytes"] >= 3 * bs and (
                    best is None or s["nbytes"] > best[1]["nbytes"]):
                best = (name, s)
    if not ck.ok(best, "flip: a flat shard of >= 3 blocks to damage"):
        return
    name, s = best
    within = bs + 5
    with open(os.path.join(store, "flip", s["file"]), "r+b") as f:
        f.seek(s["file_offset"] + within)
        b = f.read(1)
        f.seek(s["file_offset"] + within)
        f.write(bytes([b[0] ^ 0x5A]))
    at = s["flat"][0] + within
    p = sm.tensor_path(os.path.join(m.mnt, "flip"), name)
    ck.raises(errno.EIO, lambda: sm.read_file(p), "flip: read() of %s" % name)
    ck.raises(errno.EIO, lambda: sm.pread_all(p, at, 1), "flip: 1-byte pread of the bad byte")
    r = subprocess.run([sys.executable, "-c", MMAP_CHILD, p, str(at)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    ck.eq(r.returncode, -signal.SIGBUS, "flip: a mapping of the bad block gets SIGBUS "
          "(stdout %r)" % r.stdout[:20])
    want = ref.tensor_bytes(name)
    blk0 = s["flat"][0] + bs  # the damaged block is [blk0, blk0 + bs) of the tensor
    ck.bytes_eq(sm.pread_all(p, 0, blk0), want[:blk0], "flip: bytes before the bad block")
    ck.bytes_eq(sm.pread_all(p, blk0 + bs, len(want)), want[blk0 + bs:],
                "flip: bytes after the bad block")
    ck.ok(any("flip" in l and name in l for l in m.log_lines()),
          "flip: the daemon logs the bad block")


def check_write(env, ck, m, store):
    p, raw = sm.write_commit_tensor(env, ck, m.mnt, "commit through a --direct-io mount")
    ck.bytes_eq(sm.read_file(p), raw, "written tensor reads back (read)")
    ck.bytes_eq(sm.mmap_bytes(p), raw, "written tensor reads back (mmap)")


def mount_opts(mnt):
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[1] == mnt:
                return fields[3].split(",")
    return []


def check_single(env, ck, ckpt_dir, ref, st_want):
    # -d: the daemon logs every request, so the log shows which came
    with sm.Mount(env, ckpt_dir, opts=["-d"], name="single") as m:
        ck.ok("ro" in mount_opts(m.mnt), "single checkpoint: mounted ro (%s)" % mount_opts(m.mnt))
        names = sorted(ref.tensors, key=lambda n: -ref.nbytes(n))
        for rnd in range(3):
            for name in names[:8]:
                p = sm.tensor_path(m.mnt, name)
                ck.bytes_eq(sm.read_file(p), ref.tensor_bytes(name),
                            "single: read tensors/%s (round %d)" % (name, rnd))
                if rnd == 1 and ref.nbytes(name):
                    ck.bytes_eq(sm.mmap_bytes(p), ref.tensor_bytes(name),
                                "single: mmap tensors/%s" % name)
        big = sm.tensor_path(m.mnt, names[0])
        n = cached_pages(big)
        if n is not None:
            ck.ok(n > 0, "single: tensors/%s stays cached between opens" % names[0])
        ck.bytes_eq(sm.read_file(os.path.join(m.mnt, "model.safetensors")), st_want,
                    "single: model.safetensors")
        ck.raises(errno.EROFS, lambda: os.open(big, os.O_WRONLY), "single: open for writing")
        ck.raises(errno.EROFS, lambda: os.open(big, os.O_RDWR), "single: open read-write")
        ck.ok(m.alive(), "single: the daemon serves on")
        ops = [l.split("opcode: ")[1].split()[0] for l in m.log_lines() if "opcode: " in l]
        ck.ok(ops.count("READ") > 0, "single: the debug log shows the requests")
        ck.ok(ops.count("OPEN") <= 1 and ops.count("RELEASE") <= 1 and ops.count("FLUSH") <= 1,
              "single: at most one OPEN, RELEASE, FLUSH for %d opens (OPEN %d, RELEASE %d, "
              "FLUSH %d)" % (3 * 8 + 3, ops.count("OPEN"), ops.count("RELEASE"),
                             ops.count("FLUSH")))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "a"), **GEN)
    env.gen(os.path.join(store, "flip"), ref=False, **GEN)
    st_want_path = env.path("a.safetensors")
    env.shardctl_run("export", "--safetensors", st_want_path, os.path.join(store, "a"))
    with open(st_want_path, "rb") as f:
        st_want = f.read()
    with sm.Mount(env, store, opts=["--direct-io"], name="direct") as m, \
            sm.Mount(env, store, name="cached") as mc:
        ck.ok(not any("ALLOW_MMAP" in l for l in m.log_lines()),
              "the kernel granted FUSE_DIRECT_IO_ALLOW_MMAP (no warning): %s"
              % m.log_lines()[-3:])
        names = sorted(ref.tensors, key=lambda n: -ref.nbytes(n))
        check_page_cache(ck, m.mnt, mc.mnt, names[0])
        check_bytes(env, ck, os.path.join(m.mnt, "a"), ref, st_want, "direct")
        check_threads(env, ck, os.path.join(m.mnt, "a"), ref)
        check_flip(env, ck, m, store, ref)
        check_write(env, ck, m, store)
        ck.ok(m.alive(), "the daemon serves on")
    check_single(env, ck, os.path.join(store, "a"), ref, st_want)


if __name__ == "__main__":
    sys.exit(sm.main(run))
