#!/usr/bin/python3
"""Mount test: a framework re-saving a step is never delayed or failed by
a reader of the mount (issue 30, item 7).

Debian's torch 1.13 saves a state dict twice with the same names and
shapes (dcp_resave.py): the first save into the store, the second beside
it, as a job re-saving the same step would write it. `big` (16 MiB of
float32: four 4 MiB blocks, each of which the engine would serve from a
mapping of the .distcp) is read through the mount by a reader that keeps
it open and mmapped. Then, with the daemon serving, another writer of the
framework's .distcp
  nonblock  opens it O_WRONLY|O_NONBLOCK (a lease makes that EAGAIN),
  trunc     truncates it to half (a lease makes that wait),
  rewrite   opens it O_WRONLY|O_TRUNC and writes the second save's bytes,
            then the second save's .metadata (a lease makes the open wait),
each on a fresh mount with a fresh reader, and once more (`stopped`) the
rewrite's open with the daemon stopped (SIGSTOP: a lease would make it
wait for the kernel's lease-break-time, 45 s by default). Each must
succeed and wait under 100 ms more than the same call takes on a copy
of the file that no mount reads (the kernel's own cost of freeing 16 MiB
of page cache: tens of ms on a loaded VM; the open/truncate call itself;
stopped: under 1 s including a child's start), and the daemon must hold no lease
on the file (/proc/locks) while the reader has the tensor mapped.
Afterwards (the reader's mapping closed and the mount's page cache of
the tensor dropped) every read of `big` gives either EIO or exactly the
bytes the file now holds (the second save's after a rewrite), never the
old bytes, whole or mixed with new ones; `small` (in the same file)
likewise; the daemon keeps serving.

Last (`zstd`), torch 2.15's committed per-rank zstd checkpoint
(test/fixtures/dcp/torch-2.15-ext/perrank2_zstd): every tensor read (its
streams decoded and kept), then rank 0's .distcp cut in half: every
tensor reads as before or fails with EIO, and at least one fails (a
stream decoded before the change is not served again).
"""

import errno
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.environ.get("SHARDFS_FIXTURES") or os.path.join(TOP, "test", "fixtures")
ZSTD = os.path.join(FIX, "dcp", "torch-2.15-ext", "perrank2_zstd")
PY = "/usr/bin/python3"
N = 4 << 20                      # elements of big: 16 MiB of float32
BOUND_S = 0.1                    # the bound on the writer's wait
STOPPED_BOUND_S = 1.0            # a child's open, daemon stopped


def values():
    a = np.arange(N, dtype=np.float32)
    small = (np.arange(6, dtype=np.int64) * -3).astype("<i8").tobytes()
    return a.astype("<f4").tobytes(), (-a - 7).astype("<f4").tobytes(), small


def restore(src, dst):
    """dst's files made the first save's again (no mount running)."""
    for f in os.listdir(src):
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


def leases_on(path):
    """/proc/locks lines of leases on path's inode."""
    st = os.stat(path)
    key = ":%d " % st.st_ino
    with open("/proc/locks") as f:
        return [l.strip() for l in f if "LEASE" in l and key in l + " "]


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_after(ck, root, name, want, old, label):
    """A read of tensors/name: EIO or exactly want; never old (nor a mix)."""
    p = sm.tensor_path(root, name)
    drop_cache(p)
    try:
        got = sm.read_file(p)
    except OSError as e:
        ck.eq(e.errno, errno.EIO, "%s: tensors/%s fails only with EIO" % (label, name))
        return "EIO"
    if want is not None:
        ck.bytes_eq(got, want, "%s: tensors/%s holds the file's new bytes" % (label, name))
    elif old is not None:
        ck.ok(got != old, "%s: tensors/%s is not served as the old bytes" % (label, name))
    return "bytes"


def hold_reader(ck, root, v1, label):
    """Open tensors/big, map it, read it whole: (fd, mapping)."""
    fd = os.open(sm.tensor_path(root, "big"), os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    ck.bytes_eq(mm[:], v1, "%s: the reader's mapping of tensors/big" % label)
    return fd, mm


def op_nonblock(path, side):
    t0 = time.monotonic()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        return time.monotonic() - t0, "open(O_WRONLY|O_NONBLOCK): %s" % sm.errname(e.errno)
    dt = time.monotonic() - t0
    os.close(fd)
    return dt, None


def op_trunc(path, side):
    size = os.path.getsize(path)
    t0 = time.monotonic()
    try:
        os.truncate(path, size // 2)
    except OSError as e:
        return time.monotonic() - t0, "truncate: %s" % sm.errname(e.errno)
    return time.monotonic() - t0, None


def op_rewrite(path, side):
    with open(os.path.join(side, os.path.basename(path)), "rb") as f:
        data = f.read()
    t0 = time.monotonic()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return time.monotonic() - t0, "open(O_WRONLY|O_TRUNC): %s" % sm.errname(e.errno)
    dt = time.monotonic() - t0
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    # the framework writes its .metadata last (the same bytes: same step)
    shutil.copyfile(os.path.join(side, ".metadata"),
                    os.path.join(os.path.dirname(path), ".metadata"))
    return dt, None


def run(env, ck):
    store, side, pristine = env.path("store"), env.path("side"), env.path("pristine")
    os.makedirs(store)
    ckdir = os.path.join(store, "ck")
    r = subprocess.run([PY, os.path.join(HERE, "dcp_resave.py"), ckdir,
                        os.path.join(side, "ck"), str(N)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if not ck.eq(r.returncode, 0, "dcp_resave.py ran: %s" % r.stderr.decode()[-2000:]):
        return
    files = json.loads(r.stdout)["files"]
    distcp = [f for f in files if f.endswith(".distcp")]
    if not ck.ok(distcp, "torch 1.13 wrote .distcp files: %s" % files):
        return
    # the largest holds big (and may hold small: checked after each change)
    distcp = [max(distcp, key=lambda f: os.path.getsize(os.path.join(ckdir, f)))]
    target = os.path.join(ckdir, distcp[0])
    shutil.copytree(ckdir, pristine)
    v1, v2, small = values()

    ops = (("nonblock", op_nonblock), ("trunc", op_trunc), ("rewrite", op_rewrite))
    for label, op in ops:
        restore(pristine, ckdir)
        os.makedirs(env.path("baseline"), exist_ok=True)
        restore(pristine, env.path("baseline"))
        baseline = os.path.join(env.path("baseline"), distcp[0])
        with sm.Mount(env, store, opts=["--log-level", "info"], name=label) as m:
            root = os.path.join(m.mnt, "ck")
            fd, mm = hold_reader(ck, root, v1, label)
            try:
                held = leases_on(target)
                ck.eq(held, [], "%s: the daemon holds no lease on the framework's %s "
                      "while the reader has tensors/big mapped" % (label, distcp[0]))
                base, _ = op(baseline, os.path.join(side, "ck"))
                dt, err = op(target, os.path.join(side, "ck"))
                print("%s: the writer waited %.4f s (%.4f s on an unmounted copy)%s"
                      % (label, dt, base, ", " + err if err else ""))
                ck.ok(err is None, "%s: the writer's call succeeds (%s)" % (label, err))
                ck.ok(dt < BOUND_S + base, "%s: the writer waited %.4f s (< %.1f s + %.4f s)"
                      % (label, dt, BOUND_S, base))
            finally:
                mm.close()
                os.close(fd)
            if label == "nonblock":
                read_after(ck, root, "big", v1, None, label)
                read_after(ck, root, "small", small, None, label)
            elif label == "trunc":
                # the tail of the file is gone: big cannot be whole
                ck.eq(read_after(ck, root, "big", None, v1, label), "EIO",
                      "trunc: tensors/big fails with EIO")
            else:
                read_after(ck, root, "big", v2, v1, label)
                read_after(ck, root, "small", small, None, label)
            ck.ok(m.alive(), "%s: the daemon serves" % label)

    # The daemon stopped: the writer depends on nothing it does.
    restore(pristine, ckdir)
    with sm.Mount(env, store, name="stopped") as m:
        root = os.path.join(m.mnt, "ck")
        fd, mm = hold_reader(ck, root, v1, "stopped")
        os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            code = "import os,sys; os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))"
            t0 = time.monotonic()
            try:
                c = subprocess.run([sys.executable, "-c", code, target], timeout=5)
                rc = c.returncode
            except subprocess.TimeoutExpired:
                rc = "timed out"
            dt = time.monotonic() - t0
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)
            mm.close()
            os.close(fd)
        print("stopped: the writer's child took %.3f s (rc %s)" % (dt, rc))
        ck.eq(rc, 0, "stopped: open(O_WRONLY|O_TRUNC) with the daemon stopped succeeds")
        ck.ok(dt < STOPPED_BOUND_S, "stopped: it took %.3f s (< %.1f s)"
              % (dt, STOPPED_BOUND_S))
        ck.eq(read_after(ck, root, "big", None, v1, "stopped"), "EIO",
              "stopped: tensors/big (its file now empty) fails with EIO")
        ck.ok(m.alive(), "stopped: the daemon serves")
    zstd(env, ck)


def zstd(env, ck):
    store = env.path("store-zstd")
    zdir = os.path.join(store, "z")
    shutil.copytree(ZSTD, zdir)
    with sm.Mount(env, store, name="zstd") as m:
        tdir = os.path.join(m.mnt, "z", "tensors")
        names = []
        for dirpath, _, fnames in os.walk(tdir):
            names += [os.path.relpath(os.path.join(dirpath, f), tdir) for f in fnames]
        if not ck.ok(names, "zstd: tensors listed"):
            return
        before = {n: sm.read_file(os.path.join(tdir, n)) for n in sorted(names)}
        target = os.path.join(zdir, "__0_0.distcp")
        t0 = time.monotonic()
        os.truncate(target, os.path.getsize(target) // 2)
        print("zstd: the truncation took %.4f s" % (time.monotonic() - t0))
        eio = 0
        for n in sorted(names):
            p = os.path.join(tdir, n)
            drop_cache(p)
            try:
                got = sm.read_file(p)
            except OSError as e:
                ck.eq(e.errno, errno.EIO, "zstd: tensors/%s fails only with EIO" % n)
                eio += 1
                continue
            ck.bytes_eq(got, before[n], "zstd: tensors/%s as before (its stream whole)" % n)
        ck.ok(eio > 0, "zstd: the tensors of the cut streams fail (%d of %d)"
              % (eio, len(names)))
        ck.ok(m.alive(), "zstd: the daemon serves")


if __name__ == "__main__":
    sys.exit(sm.main(run))
