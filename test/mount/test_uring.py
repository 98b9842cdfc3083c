#!/usr/bin/python3
"""Mount test: the FUSE-over-io_uring transport (issue 29, part 1).

The kernel's /sys/module/fuse/parameters/enable_uring is set for the test
and put back as it was at exit (whatever happens). Checked:
  - enable_uring 0: -o transport=auto mounts through /dev/fuse with ONE
    log line saying why (enable_uring), and reads right; -o transport=uring
    refuses to mount, saying so;
  - enable_uring 1: -o transport=uring and -o transport=dev mounts of the
    same store at once: the uring daemon logs its queues and, at unmount,
    that the ring served the requests; every tensor, npy/ file and
    model.safetensors of a generated checkpoint reads byte-exact against
    the reference AND the dev mount (read() and mmap), random preads, 4
    threads of preads at once; DCP checkpoints torch 2.15 wrote
    (test/fixtures/dcp) read byte-exact, every file of the tree, through
    both transports; a flipped payload byte gives EIO through the ring
    (checksums still verified) and the rest of the tensor reads; a tensor
    written through the ring (WRITE payloads, xattrs) commits and reads
    back; readers killed mid-read leave it serving; -o transport=auto
    takes the ring, no option (the default) and -s
    do not; each daemon exits cleanly at unmount and at SIGTERM (no hung
    ring thread: both are bounded).
Skips (exit 77) only where the kernel truly lacks FUSE over io_uring (no
enable_uring parameter), the test is not root (it must write the
parameter), or shardfs was built without liburing; each says so.
"""

import errno
import mmap
import os
import re
import shutil
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

PARAM = "/sys/module/fuse/parameters/enable_uring"
TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DCP = os.path.join(TOP, "test", "fixtures", "dcp", "torch-2.15")
PAGE = os.sysconf("SC_PAGESIZE")
GEN = dict(layout="mixed", ranks=3, size="6M", seed=29, block_size="16K")


def read_param():
    with open(PARAM) as f:
        return f.read().strip()


def write_param(v):
    with open(PARAM, "w") as f:
        f.write(v)



def files_under(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            out.append(os.path.relpath(os.path.join(d, f), root))
    return out


def transport_lines(m):
    return [l for l in m.log_lines() if "fs: transport" in l]


def check_fallback(env, ck, store):
    """enable_uring 0: auto falls back with one line; uring refuses."""
    write_param("0")
    with sm.Mount(env, store, opts=["-o", "transport=auto,log_level=info"],
                  name="auto0") as m:
        lines = transport_lines(m)
        ck.eq(len(lines), 1, "auto, enable_uring 0: one transport line (%s)" % lines)
        ck.ok(lines and "/dev/fuse" in lines[0] and "enable_uring" in lines[0],
              "auto, enable_uring 0: the line says /dev/fuse and why: %s" % lines)
        p = os.path.join(m.mnt, "a", "model.safetensors")
        ck.ok(len(sm.read_file(p)) > 0, "auto, enable_uring 0: reads through /dev/fuse")
    os.makedirs(env.path("never2"), exist_ok=True)
    rc, out, err = sm.run_cmd([env.shardfs, "-f", "-o", "transport=uring", store,
                               env.path("never2")], timeout=60)
    ck.ok(rc != 0 and "enable_uring" in err,
          "transport=uring, enable_uring 0: refused, saying why (rc %d, %r)" % (rc, err[-300:]))
    rc, out, err = sm.run_cmd([env.shardfs, "-f", "-o", "transport=bogus", store,
                               env.path("never2")], timeout=60)
    ck.ok(rc == 2 and "transport" in err, "transport=bogus: a usage error (rc %d)" % rc)


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
            length = r.choice([512, 4096, 9000, 65536, 1 << 20])
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
    ck.eq(errors[:5], [], "uring: 4 threads of preads at once")


def check_gen(env, ck, mu, md, ref, st_want):
    """Every tensor of the generated checkpoint, both transports."""
    ru, rd = os.path.join(mu.mnt, "a"), os.path.join(md.mnt, "a")
    for name in sorted(ref.tensors):
        want = ref.tensor_bytes(name)
        pu, pd = sm.tensor_path(ru, name), sm.tensor_path(rd, name)
        got = sm.read_file(pu)
        ck.bytes_eq(got, want, "uring: tensors/%s vs the reference" % name)
        ck.bytes_eq(got, sm.read_file(pd), "uring: tensors/%s vs /dev/fuse" % name)
        ck.bytes_eq(sm.mmap_bytes(pu), want, "uring: mmap tensors/%s" % name)
        npy = sm.npy_path(ru, name)
        if os.path.exists(npy):
            ck.bytes_eq(sm.read_file(npy), sm.read_file(sm.npy_path(rd, name)),
                        "uring: npy/%s vs /dev/fuse" % name)
    stp = os.path.join(ru, "model.safetensors")
    ck.bytes_eq(sm.read_file(stp), st_want, "uring: model.safetensors")
    ck.bytes_eq(sm.mmap_bytes(stp), st_want, "uring: mmap model.safetensors")
    names = sorted(ref.tensors)
    for _ in range(60):
        name = env.rng.choice(names)
        want = ref.tensor_bytes(name)
        off = env.rng.randrange(0, len(want) + 4096)
        length = env.rng.choice([1, 7, 4096, 65543, 300000, len(want) + 3])
        ck.bytes_eq(sm.pread_all(sm.tensor_path(ru, name), off, length),
                    want[off:off + length], "uring: pread(%s, %d, %d)" % (name, off, length))
    check_threads(env, ck, ru, ref)


def check_fixtures(ck, mu, md):
    """DCP checkpoints torch 2.15 wrote: every file, both transports."""
    n = 0
    for ck_name in sorted(os.listdir(os.path.join(mu.mnt))):
        if not ck_name.startswith("dcp-"):
            continue
        ru, rd = os.path.join(mu.mnt, ck_name), os.path.join(md.mnt, ck_name)
        fu, fd = files_under(ru), files_under(rd)
        ck.eq(fu, fd, "%s: the same files through both transports" % ck_name)
        for rel in fu:
            ck.bytes_eq(sm.read_file(os.path.join(ru, rel)),
                        sm.read_file(os.path.join(rd, rel)),
                        "%s/%s: uring vs /dev/fuse" % (ck_name, rel))
            n += 1
    ck.ok(n >= 20, "DCP fixtures: files compared through both transports (%d)" % n)


def flip_byte(ck, store, ref):
    """Flip one payload byte of checkpoint 'flip': (tensor, its offset in
    the tensor, where the bad block starts in the tensor, block size)."""
    man = sm.manifest_of(os.path.join(store, "flip"))
    bs = man["block_size"]
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
        return None
    name, s = best
    within = bs + 5
    with open(os.path.join(store, "flip", s["file"]), "r+b") as f:
        f.seek(s["file_offset"] + within)
        b = f.read(1)
        f.seek(s["file_offset"] + within)
        f.write(bytes([b[0] ^ 0x5A]))
    return name, s["flat"][0] + within, s["flat"][0] + bs, bs


def check_flip(ck, m, flip, ref, label):
    name, at, blk0, bs = flip
    p = sm.tensor_path(os.path.join(m.mnt, "flip"), name)
    ck.raises(errno.EIO, lambda: sm.read_file(p), "%s flip: read() of %s" % (label, name))
    ck.raises(errno.EIO, lambda: sm.pread_all(p, at, 1), "%s flip: 1-byte pread" % label)
    want = ref.tensor_bytes(name)
    # the pages wholly outside the bad block read (the page cache reads pages)
    lo = blk0 // PAGE * PAGE
    hi = (blk0 + bs + PAGE - 1) // PAGE * PAGE
    ck.bytes_eq(sm.pread_all(p, 0, lo), want[:lo],
                "%s flip: the pages before the bad block" % label)
    ck.bytes_eq(sm.pread_all(p, hi, len(want)), want[hi:],
                "%s flip: the pages after the bad block" % label)


def check_write(env, ck, m):
    p, raw = sm.write_commit_tensor(env, ck, m.mnt, "uring: commit through the mount")
    ck.bytes_eq(sm.read_file(p), raw, "uring: the written tensor reads back")


def check_killed_readers(ck, m, st_want):
    """Readers killed in the middle of their reads (their requests
    interrupted, replies to readers gone): the ring serves on."""
    import subprocess
    import time
    p = os.path.join(m.mnt, "a", "model.safetensors")
    for i in range(8):
        procs = [subprocess.Popen(["dd", "if=" + p, "of=/dev/null", "bs=4k",
                                   "iflag=direct" if j % 2 else "bs=4k"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for j in range(3)]
        time.sleep(0.01 * (i % 4))
        for q in procs:
            q.kill()
        for q in procs:
            q.wait(timeout=30)
    ck.bytes_eq(sm.read_file(p), st_want, "uring: model.safetensors after killed readers")
    ck.ok(m.alive(), "uring: the daemon serves on after killed readers")


def served(m):
    for l in m.log_lines():
        mm = re.search(r"io_uring: (\d+) requests served", l)
        if mm:
            return int(mm.group(1))
    return None


def run(env, ck):
    if os.geteuid() != 0:
        print("SKIP: not root: the test must set %s" % PARAM)
        sys.exit(sm.SKIP)
    if not os.path.exists(PARAM):
        print("SKIP: this kernel has no FUSE over io_uring (%s absent: "
              "6.14+ with CONFIG_FUSE_IO_URING)" % PARAM)
        sys.exit(sm.SKIP)
    old = read_param()
    sm._cleanups.append(lambda: write_param(old))
    print("enable_uring was %s (put back at exit)" % old)
    # with enable_uring 0 transport=uring refuses before mounting: a
    # daemon built without liburing says so instead
    write_param("0")
    os.makedirs(env.path("never"))
    os.makedirs(env.path("empty-store"))
    rc, out, err = sm.run_cmd([env.shardfs, "-f", "-o", "transport=uring",
                               env.path("empty-store"), env.path("never")], timeout=60)
    if "without liburing" in err:
        print("SKIP: shardfs was built without liburing: %s" % err.strip()[-200:])
        sys.exit(sm.SKIP)

    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "a"), **GEN)
    env.gen(os.path.join(store, "flip"), ref=False, **GEN)
    for d in sorted(os.listdir(DCP)):
        if os.path.isdir(os.path.join(DCP, d)):
            shutil.copytree(os.path.join(DCP, d), os.path.join(store, "dcp-" + d))
    st_want_path = env.path("a.safetensors")
    env.shardctl_run("export", "--safetensors", st_want_path, os.path.join(store, "a"))
    with open(st_want_path, "rb") as f:
        st_want = f.read()

    check_fallback(env, ck, store)

    write_param("1")
    mu = sm.Mount(env, store, opts=["-o", "transport=uring,log_level=info"], name="uring")
    with mu, sm.Mount(env, store, opts=["-o", "transport=dev,log_level=info"],
                      name="dev") as md:
        lines = transport_lines(mu)
        # the queues register once INIT is answered: the first request
        sm.read_file(os.path.join(mu.mnt, "a", "model.safetensors"))
        lines = transport_lines(mu)
        ck.ok(len(lines) == 1 and "transport io_uring" in lines[0] and "queue" in lines[0],
              "transport=uring: one line, the ring's queues: %s" % lines)
        ck.eq(transport_lines(md), [], "transport=dev: no transport line")
        check_gen(env, ck, mu, md, ref, st_want)
        check_fixtures(ck, mu, md)
        flip = flip_byte(ck, store, ref)
        if flip:
            check_flip(ck, mu, flip, ref, "uring")
            check_flip(ck, md, flip, ref, "dev")
        check_write(env, ck, mu)
        check_killed_readers(ck, mu, st_want)
        ck.ok(mu.alive(), "uring: the daemon serves on")
    n = served(mu)
    ck.ok(n is not None and n > 200,
          "uring: the ring served the requests (%s logged at unmount)" % n)
    ck.eq(served(md), None, "dev: no ring")

    with sm.Mount(env, store, opts=["-o", "log_level=info"], name="default1") as m:
        sm.read_file(os.path.join(m.mnt, "a", "model.safetensors"))
        ck.eq(transport_lines(m), [], "no option, enable_uring 1: /dev/fuse (the default)")
    ck.eq(served(m), None, "no option: no ring")
    with sm.Mount(env, store, opts=["-o", "transport=auto,log_level=info"],
                  name="auto1") as m:
        ck.bytes_eq(sm.read_file(os.path.join(m.mnt, "a", "model.safetensors")), st_want,
                    "auto, enable_uring 1: model.safetensors")
        ck.ok(any("transport io_uring" in l for l in transport_lines(m)),
              "auto, enable_uring 1: the ring is taken: %s" % transport_lines(m))
    ck.ok((served(m) or 0) > 0, "auto, enable_uring 1: requests served by the ring")
    # SIGTERM while serving through the rings: the ring threads stop,
    # the daemon unmounts and exits 0 (no hung thread)
    import signal
    import subprocess
    m = sm.Mount(env, store, opts=["-o", "transport=uring,log_level=info"], name="term")
    with m:
        sm.read_file(os.path.join(m.mnt, "a", "model.safetensors"))
        m.killed = True  # its death by our signal is no crash
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = "still running after 15 s"
        ck.eq(rc, 0, "uring: SIGTERM: the daemon exits 0")
        ck.ok(not sm.is_mounted(m.mnt), "uring: SIGTERM: the daemon unmounted")
    ck.ok((served(m) or 0) > 0, "uring: SIGTERM: the ring had served")
    # -s (one thread): /dev/fuse whatever the option says
    with sm.Mount(env, store, opts=["-s", "-o", "transport=uring,log_level=info"],
                  name="single1") as m:
        ck.bytes_eq(sm.read_file(os.path.join(m.mnt, "a", "model.safetensors")), st_want,
                    "-s, transport=uring: model.safetensors")
    ck.eq(served(m), None, "-s: no ring")


if __name__ == "__main__":
    sys.exit(sm.main(run))
