#!/usr/bin/python3
"""MPI, a daemon killed (SIGKILL) while a framework saves through the
mounts (issue 26 item 5, SPEC 8): `mpirun --enable-recovery` with 2
daemons (node-local stores), torch 1.13's save_state_dict from 2 gloo
processes, rank r through daemon r's mount; rank 1 stops right after
its data file went to store 1, then daemon 1 is killed with SIGKILL:

  1. rank 1's process (its mount gone) and rank 0 (left in torch's
     collective) end once rank 1 is killed: no daemon holds them;
  2. daemon 0 never shows the save complete (4 s later), keeps its own
     files of it in store 0, answers at once (state, listing) and still
     serves its other checkpoints;
  3. the job saves that name again, both ranks through the surviving
     mount (rank 0's files of the killed save are overwritten): daemon 0
     shows it complete within 4 s, verified, with the new bytes;
  4. daemon 0 leaves at unmount with daemon 1 dead.
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
SEAL_S = 4.0                         # a re-save's end to complete
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
        procs = savelib.start_ranks(env.path("init-dk"), paths, stall=1, stall_after=True)
        line = procs[1].stdout.readline()
        ck.eq(line.strip(), b"stalled", "dk: rank 1 wrote its data")
        ck.ok(os.path.exists(os.path.join(c.store(1), "dk", "__1_0.distcp")),
              "dk: rank 1's file is in store 1 before daemon 1 is killed")
        time.sleep(1.5)  # rank 0 writes its file, daemon 1 tells daemon 0
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

        # 3. a re-save of that name through the surviving mount
        procs = savelib.start_ranks(env.path("init-dk2"), [root, root], seed=8)
        ck.ok(savelib.wait_ranks(procs, 120), "dk again: saved by 2 ranks through daemon 0")
        dt = savelib.wait_until(lambda: state(root) == "committed", SEAL_S)
        ck.ok(dt is not None, "dk again: complete on daemon 0 within %.0f s (%s)" % (
            SEAL_S, state(root)))
        if dt is None:
            print("\n".join(ln for ln in c.log_text().splitlines() if '"dk"' in ln)[-3000:])
        ck.eq(savelib.xattr(root, "user.shardfs.verified"), b"yes",
              "dk again: verified from the write-time hashes")
        want = savelib.expected(8)
        for t in sorted(want):
            ck.bytes_eq(savelib.read(sm.tensor_path(root, t)), want[t],
                        "dk again: tensors/%s has the re-save's bytes" % t)

        # 4. unmount the live one; the dead one's mount is stale
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
