#!/usr/bin/python3
"""MPI, the live union (issue 26, 1; SPEC section 2): the mounts show one
namespace, the union of every daemon's store, kept live.

3 daemons, node-local stores ustore0..2, started with one shardfs/1
checkpoint `pre` in store 0 only. While they run:

  1. `pre` (present at start, in store 0 only) is shown and read
     byte-exact by every daemon;
  2. a shardfs/1 checkpoint (`shardctl gen`) is copied into store 1 only,
     its files first and manifest.json last: not shown by any daemon while
     manifest.json is missing; once it is there, shown by every daemon
     within 2 s and read byte-exact (every tensor) through every daemon;
  3. a DCP checkpoint written by Debian's torch 1.13 (four data files) is
     copied in pieces into stores 0 and 1 (.metadata last, into store 0):
     not shown while its .metadata is missing, then shown complete (every
     tensor, byte-exact) by every daemon within 2 s, rank 2 holding none
     of its files;
  4. removing both from the stores removes them from every mount within
     2 s, and `pre` is still there and reads; a DCP checkpoint split over
     stores 0 and 1 before the start (`predcp`) reads as before throughout.

Then a dead daemon (`mpirun --enable-recovery`, rank 2 killed with
SIGKILL): the checkpoint only its store held stays listed by the others,
a read of it fails with EIO, and a checkpoint copied into store 0
afterwards is still shown by rank 1 within 2 s (nobody waits for the dead
rank's scan).
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NR = 3
WITHIN_S = 2.0        # SPEC section 2
POLL_S = 0.05
DTYPE_TO_NP = {"F32": "<f4", "I64": "<i8", "F64": "<f8"}


def shown(c, name):
    """The ranks whose mount lists name."""
    out = []
    for r in range(NR):
        try:
            if name in os.listdir(c.mnt(r)):
                out.append(r)
        except OSError:
            pass
    return out


def wait_all(c, name, present, limit_s=10.0):
    """Seconds until every mount lists name (present) or none does, or
    None after limit_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        s = shown(c, name)
        if (present and len(s) == NR) or (not present and not s):
            return time.monotonic() - t0
        time.sleep(POLL_S)
    return None


def check_gen(ck, c, name, ref, label):
    for r in range(NR):
        root = os.path.join(c.mnt(r), name)
        for t in sorted(ref.tensors):
            try:
                got = sm.read_file(sm.tensor_path(root, t))
            except OSError as e:
                ck.ok(False, "%s: rank %d reads %s: %s" % (label, r, t, e))
                continue
            ck.bytes_eq(got, ref.tensor_bytes(t),
                        "%s: rank %d %s byte-exact" % (label, r, t))


def check_dcp(ck, c, name, tensors, label):
    for r in range(NR):
        root = os.path.join(c.mnt(r), name)
        try:
            names = sorted(os.listdir(os.path.join(root, "tensors")))
        except OSError as e:
            names = "unlistable: %s" % e
        ck.eq(names, sorted(tensors), "%s: rank %d shows every tensor" % (label, r))
        for t, (_dt, _shape, hexb) in sorted(tensors.items()):
            try:
                got = sm.read_file(sm.tensor_path(root, t))
            except OSError as e:
                ck.ok(False, "%s: rank %d reads %s: %s" % (label, r, t, e))
                continue
            ck.bytes_eq(got, bytes.fromhex(hexb),
                        "%s: rank %d %s byte-exact" % (label, r, t))


def copy_files(src, dst, names):
    os.makedirs(dst, exist_ok=True)
    for fn in names:
        shutil.copy2(os.path.join(src, fn), os.path.join(dst, fn))


def write_dcp(env, ck, name):
    """torch 1.13's DCP checkpoint in outside/name: (dir, tensors, data
    files), or None."""
    d = env.path("outside", name)
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "dcp113_parts.py"),
                        d], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    if not ck.ok(r.returncode == 0, "torch 1.13 writes DCP checkpoint %s: %s" % (
            name, r.stderr.decode(errors="replace")[-2000:])):
        return None
    out = json.loads(r.stdout)
    data = [f for f in out["files"] if f.endswith(".distcp")]
    ck.eq(len(data), 4, "torch 1.13 wrote four data files (%s)" % out["files"])
    return d, out["tensors"], data


def run(env, ck):
    part_live(env, ck)
    part_dead(env, ck)


def part_live(env, ck):
    pattern = env.path("ustore%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    w = write_dcp(env, ck, "predcp")
    if w is None:
        return
    pre_dcp, pre_tensors, pre_data = w
    copy_files(pre_dcp, os.path.join(sfmpi.expand(pattern, 1), "predcp"), pre_data[:2])
    copy_files(pre_dcp, os.path.join(sfmpi.expand(pattern, 0), "predcp"),
               pre_data[2:] + [".metadata"])
    pre_ref = env.gen(os.path.join(sfmpi.expand(pattern, 0), "pre"),
                      layout="llama", ranks=2, size="256K", seed=3)
    gen_ref = env.gen(env.path("outside", "gen1"), layout="mixed", ranks=2,
                      size="512K", seed=5)
    w = write_dcp(env, ck, "dcp1")
    if w is None:
        return
    dcp_src, dcp_tensors, data = w

    with sfmpi.Cluster(env, pattern, nranks=NR, name="union") as c:
        # present at start, split over stores 0 and 1: as before
        ck.eq(shown(c, "predcp"), list(range(NR)), "predcp shown by every daemon at start")
        check_dcp(ck, c, "predcp", pre_tensors, "predcp")

        # 1. present at start, in one store: every daemon (the others
        # from the union once they serve)
        dt = wait_all(c, "pre", True)
        ck.ok(dt is not None and dt <= WITHIN_S,
              "pre (store 0 only) shown by every daemon within %.0f s of the "
              "mounts (%s)" % (WITHIN_S, dt))
        check_gen(ck, c, "pre", pre_ref, "pre")

        # 2. shardfs/1 into store 1 only, manifest.json last
        src = env.path("outside", "gen1")
        dst = os.path.join(sfmpi.expand(pattern, 1), "gen1")
        ents = sorted(os.listdir(src))
        os.makedirs(dst)
        for e in ents:
            if e == "manifest.json":
                continue
            if os.path.isdir(os.path.join(src, e)):
                shutil.copytree(os.path.join(src, e), os.path.join(dst, e))
            else:
                shutil.copy2(os.path.join(src, e), os.path.join(dst, e))
        time.sleep(1.0)
        ck.eq(shown(c, "gen1"), [], "gen1 without manifest.json: shown by no daemon")
        shutil.copy2(os.path.join(src, "manifest.json"), os.path.join(dst, "manifest.json"))
        dt = wait_all(c, "gen1", True)
        print("gen1 (store 1 only) shown by every daemon after %s s" % (
            "%.2f" % dt if dt is not None else "never"))
        ck.ok(dt is not None and dt <= WITHIN_S,
              "gen1 shown by every daemon within %.0f s (%s)" % (WITHIN_S, dt))
        if dt is not None:
            check_gen(ck, c, "gen1", gen_ref, "gen1")

        # 3. DCP in pieces over stores 0 and 1, .metadata last
        d0 = os.path.join(sfmpi.expand(pattern, 0), "dcp1")
        d1 = os.path.join(sfmpi.expand(pattern, 1), "dcp1")
        copy_files(dcp_src, d1, data[:1])
        copy_files(dcp_src, d0, data[2:3])
        time.sleep(0.5)
        copy_files(dcp_src, d1, data[1:2])
        copy_files(dcp_src, d0, data[3:])
        time.sleep(1.0)
        ck.eq(shown(c, "dcp1"), [], "dcp1 without .metadata: shown by no daemon")
        copy_files(dcp_src, d0, [".metadata"])
        dt = wait_all(c, "dcp1", True)
        print("dcp1 (stores 0 and 1) shown by every daemon after %s s" % (
            "%.2f" % dt if dt is not None else "never"))
        ck.ok(dt is not None and dt <= WITHIN_S,
              "dcp1 shown by every daemon within %.0f s (%s)" % (WITHIN_S, dt))
        if dt is not None:
            check_dcp(ck, c, "dcp1", dcp_tensors, "dcp1")

        # 4. removed from the stores: from every mount
        shutil.rmtree(dst)
        dt = wait_all(c, "gen1", False)
        print("gen1 removed: gone from every mount after %s s" % dt)
        ck.ok(dt is not None and dt <= WITHIN_S,
              "gen1 gone from every mount within %.0f s (%s)" % (WITHIN_S, dt))
        shutil.rmtree(d1)
        shutil.rmtree(d0)
        dt = wait_all(c, "dcp1", False)
        print("dcp1 removed: gone from every mount after %s s" % dt)
        ck.ok(dt is not None and dt <= WITHIN_S,
              "dcp1 gone from every mount within %.0f s (%s)" % (WITHIN_S, dt))
        ck.eq(shown(c, "pre"), list(range(NR)), "pre still shown by every daemon")
        check_gen(ck, c, "pre", pre_ref, "pre at the end")
        check_dcp(ck, c, "predcp", pre_tensors, "predcp at the end")


def part_dead(env, ck):
    pattern = env.path("dstore%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    ref = env.gen(os.path.join(sfmpi.expand(pattern, 2), "only2"),
                  layout="llama", ranks=2, size="256K", seed=7)
    w = write_dcp(env, ck, "after")
    if w is None:
        return
    after_src, after_tensors, _ = w
    c = sfmpi.Cluster(env, pattern, ["--peer-timeout", "2"], nranks=NR,
                      name="udead", mpirun_opts=["--enable-recovery"])
    c.start()
    try:
        dt = wait_all(c, "only2", True)
        ck.ok(dt is not None, "only2 (store 2 only) shown by every daemon (%s)" % dt)
        pid = c.rank_pid(2)
        if not ck.ok(pid is not None, "found rank 2's daemon"):
            return
        os.kill(pid, signal.SIGKILL)
        time.sleep(2.5)
        t = sorted(ref.tensors)[0]
        for r in range(2):
            ck.ok("only2" in os.listdir(c.mnt(r)),
                  "rank %d still lists only2 after rank 2 died" % r)
            t0 = time.monotonic()
            try:
                sm.read_file(sm.tensor_path(os.path.join(c.mnt(r), "only2"), t))
                got = "read"
            except OSError as e:
                got = errno.errorcode.get(e.errno, e.errno)
            ck.eq(got, "EIO", "rank %d: a read of only2 (rank 2's files) fails "
                  "with EIO (after %.1f s)" % (r, time.monotonic() - t0))
        copy_files(after_src, os.path.join(sfmpi.expand(pattern, 0), "after"),
                   sorted(os.listdir(after_src)))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and "after" not in os.listdir(c.mnt(1)):
            time.sleep(POLL_S)
        dt = time.monotonic() - t0
        print("after (store 0, rank 2 dead) shown by rank 1 after %.2f s" % dt)
        ck.ok(dt <= WITHIN_S, "with rank 2 dead, a checkpoint copied into "
              "store 0 is shown by rank 1 within %.0f s (%.2f s)" % (WITHIN_S, dt))
        for r in range(2):
            root = os.path.join(c.mnt(r), "after")
            for tn, (_d, _s, hexb) in sorted(after_tensors.items()):
                try:
                    got = sm.read_file(sm.tensor_path(root, tn))
                except OSError as e:
                    got = str(e).encode()
                ck.bytes_eq(got, bytes.fromhex(hexb),
                            "after: rank %d %s byte-exact" % (r, tn))
        for r in range(2):
            subprocess.run(["fusermount3", "-u", c.mnt(r)], timeout=30)
        subprocess.run(["umount", "-l", c.mnt(2)], timeout=30)
        try:
            c.proc.wait(timeout=60)
            ck.ok(True, "the live daemons left with rank 2 dead")
        except subprocess.TimeoutExpired:
            ck.ok(False, "the live daemons did not leave within 60 s with rank 2 dead")
    finally:
        c.stop(raise_on_crash=False)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
