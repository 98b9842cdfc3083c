#!/usr/bin/python3
"""MPI, a daemon killed (SIGKILL) while a framework saves through the
mounts (issue 26 item 5, SPEC 8): `mpirun --enable-recovery` with 2
daemons (node-local stores), torch 1.13's save_state_dict from 2 gloo
processes, rank r through daemon r's mount; rank 1 stops before its
data, then daemon 1 is killed with SIGKILL:

  1. rank 1's process (its mount gone) and rank 0 (left in torch's
     collective) end once rank 1 is killed: no daemon holds them;
  2. daemon 0 never shows the save complete (4 s later), keeps its own
     files of it in store 0, answers at once (state, listing) and still
     serves its other checkpoints;
  3. daemon 0 leaves at unmount with daemon 1 dead.
"""

import hashlib
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402
import savelib  # noqa: E402
from savelib import state  # noqa: E402

NR = 2
PEER_TIMEOUT_S = 3
ANSWER_S = 2.0                       # a daemon's answer with a dead peer
EXIT_BOUND_S = PEER_TIMEOUT_S + 15   # unmount to mpirun's exit


def run(env, ck):
    pattern = env.path("store%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    c = sfmpi.Cluster(env, pattern, ["--peer-timeout", str(PEER_TIMEOUT_S)],
                      nranks=NR, name="dkill", mpirun_opts=["--enable-recovery"])
    c.start()
    try:
        # a checkpoint saved through both mounts before the kill
        procs = savelib.start_ranks(env.path("init-before"),
                                    [os.path.join(c.mnt(r), "before") for r in range(NR)])
        ok = savelib.wait_ranks(procs, 120)
        ck.ok(ok, "before: saved through both mounts")
        ck.ok(savelib.wait_until(lambda: state(os.path.join(c.mnt(0), "before")) ==
                                 "committed", 4.0) is not None, "before: complete on rank 0")

        pid = c.rank_pid(1)
        if not ck.ok(pid is not None, "found daemon 1"):
            return
        paths = [os.path.join(c.mnt(r), "dk") for r in range(NR)]
        procs = savelib.start_ranks(env.path("init-dk"), paths, stall=1)
        line = procs[1].stdout.readline()
        ck.eq(line.strip(), b"stalled", "dk: rank 1 reached its data")
        time.sleep(1.5)  # rank 0 writes its file meanwhile
        os.kill(pid, signal.SIGKILL)
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        try:
            procs[0].wait(timeout=60)
            ck.ok(True, "dk: rank 0 ended %.1fs after rank 1 and daemon 1 were killed"
                  % (time.monotonic() - t0))
        except sm.subprocess.TimeoutExpired:
            ck.ok(False, "dk: rank 0 still in torch's save 60 s after rank 1 was killed")
            procs[0].kill()
        for p in procs:
            p.wait(timeout=30)

        time.sleep(4.0)
        root = os.path.join(c.mnt(0), "dk")
        t0 = time.monotonic()
        st = state(root)
        dt = time.monotonic() - t0
        ck.ok(st != "committed", "dk: never complete on daemon 0 (%s), 4 s after" % st)
        ck.ok(dt < ANSWER_S, "dk: daemon 0 answered its state in %.2fs (< %.1fs)" % (
            dt, ANSWER_S))
        t0 = time.monotonic()
        names = os.listdir(c.mnt(0))
        ck.ok(time.monotonic() - t0 < ANSWER_S and "before" in names,
              "daemon 0 lists its checkpoints at once: %s" % names)
        ck.ok(any(f.startswith("__0_") for f in os.listdir(os.path.join(c.store(0), "dk"))),
              "dk: rank 0's files stay in store 0")
        meta = os.path.join(c.store(0), "before", ".metadata")
        res = sm.read_in_child(os.path.join(c.mnt(0), "before", ".metadata"), timeout_s=30)
        ck.eq(res, ("ok", hashlib.sha256(sm.read_file(meta)).hexdigest()),
              "before: daemon 0 still serves torch's .metadata it holds")

        # 3. unmount the live one; the dead one's mount is stale
        t0 = time.monotonic()
        sm.subprocess.run(["fusermount3", "-u", c.mnt(0)], timeout=30)
        sm.subprocess.run(["umount", "-l", c.mnt(1)], timeout=30)
        try:
            c.proc.wait(timeout=EXIT_BOUND_S)
            ck.ok(True, "mpirun ended %.1fs after the unmounts" % (time.monotonic() - t0))
        except sm.subprocess.TimeoutExpired:
            ck.ok(False, "daemon 0 did not leave within %ds of its unmount with daemon 1 "
                  "dead" % EXIT_BOUND_S)
        log = c.log_text()
        for marker in ("AddressSanitizer", "runtime error:", "Segmentation fault"):
            ck.ok(marker not in log, "no %s in the log" % marker)
    finally:
        c.stop(raise_on_crash=False)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
