#!/usr/bin/python3
"""MPI mode survives a daemon's death (issue 15).

4 daemons on split node-local stores, started as the README says
(`mpirun --enable-recovery ... shardfs --mpi --peer-timeout 3`); rank 3 is
killed with SIGKILL while a reader streams through rank 0. Then:

  1. every tensor through ranks 0, 1 and 2: the ones that do not need rank
     3's shards read byte-exact; the ones that do fail with EIO; the first
     EIO on each rank comes within the peer timeout plus slack, and every
     later one in well under a second (the peer is marked down once, with
     one log line, not one per block);
  2. the three live mounts stay up and serving meanwhile;
  3. unmounting them, the three daemons see that rank 3 neither left nor
     answers, stop waiting for it and exit within a few seconds (MPI_Finalize
     would wait for it forever: they leave without it), so mpirun ends.
"""

import hashlib
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

PEER_TIMEOUT_S = 3
FIRST_BOUND_S = PEER_TIMEOUT_S * 3 + 5   # the first EIO (a few blocks in flight)
LATER_BOUND_S = 1.5                      # each later one
EXIT_BOUND_S = PEER_TIMEOUT_S + 15       # unmount to mpirun's exit


def read_timed(path, timeout_s=FIRST_BOUND_S + 10):
    t0 = time.monotonic()
    res = sm.read_in_child(path, timeout_s=timeout_s)
    return res, time.monotonic() - t0


def run(env, ck):
    full = env.path("full")
    stores = env.path("store%r")
    ref = env.gen(os.path.join(full, "ck"), layout="mixed", ranks=4,
                  size="3M", dtype="BF16", block_size="64K", seed=61)
    sfmpi.split_store(os.path.join(full, "ck"), stores)
    man = sm.manifest_of(os.path.join(full, "ck"))

    def dead(s):
        return s["rank"] == 3
    kinds = {n: sm.classify(man, ref, n, dead) for n in ref.tensors}
    broken = sorted(n for n, k in kinds.items() if k == "broken")
    clean = sorted(n for n, k in kinds.items() if k == "clean")
    if not ck.ok(broken and clean, "the checkpoint has tensors with and "
                 "without rank 3's shards (%d, %d)" % (len(broken), len(clean))):
        return

    c = sfmpi.Cluster(env, stores, ["--peer-timeout", str(PEER_TIMEOUT_S)],
                      name="fault", mpirun_opts=["--enable-recovery"])
    c.start()
    try:
        pid = c.rank_pid(3)
        if not ck.ok(pid is not None, "found rank 3's daemon"):
            return
        # a reader streams clean tensors through rank 0 while rank 3 dies
        stream_errors = []

        def stream():
            for n in clean:
                try:
                    got = sm.read_file(sm.tensor_path(os.path.join(c.mnt(0), "ck"), n))
                    if got != ref.tensor_bytes(n):
                        stream_errors.append("%s: wrong bytes" % n)
                except OSError as e:
                    stream_errors.append("%s: %s" % (n, e))
        th = threading.Thread(target=stream)
        th.start()
        os.kill(pid, signal.SIGKILL)
        th.join(timeout=120)
        ck.eq(stream_errors, [], "a reader of tensors rank 3 holds no part of, "
              "streaming through rank 0 while rank 3 is killed, gets every byte")

        for r in range(3):
            root = os.path.join(c.mnt(r), "ck")
            first = True
            slow = []
            for n in broken:
                (res, val), dt = read_timed(sm.tensor_path(root, n))
                ck.eq((res, val), ("errno", 5),
                      "rank %d: %s (needs rank 3) fails with EIO" % (r, n))
                if first:
                    ck.ok(dt < FIRST_BOUND_S, "rank %d: the first EIO after "
                          "%.1fs (< %ds)" % (r, dt, FIRST_BOUND_S))
                    first = False
                elif dt >= LATER_BOUND_S:
                    slow.append("%s %.2fs" % (n, dt))
            ck.eq(slow, [], "rank %d: every later EIO in < %.1fs (%d reads)"
                  % (r, LATER_BOUND_S, len(broken) - 1))
            for n in clean:
                (res, val), _ = read_timed(sm.tensor_path(root, n))
                ck.eq((res, val), ("ok", hashlib.sha256(
                    ref.tensor_bytes(n)).hexdigest()),
                    "rank %d: %s (no rank 3 shard) reads correctly" % (r, n))
            ck.ok(sm.is_mounted(c.mnt(r)), "rank %d's mount is still up" % r)
        log = c.log_text()
        for r in range(3):
            n = log.count("[rank %d] shardfs: error: mpi: rank 3 did not answer" % r)
            ck.ok(n <= 1, "rank %d logged rank 3 going down once (%d lines)" % (r, n))

        # unmount the live ones; the dead one's mount is stale
        t0 = time.monotonic()
        for r in range(3):
            sm.subprocess.run(["fusermount3", "-u", c.mnt(r)], timeout=30)
        sm.subprocess.run(["umount", "-l", c.mnt(3)], timeout=30)
        try:
            c.proc.wait(timeout=EXIT_BOUND_S)
            dt = time.monotonic() - t0
            ck.ok(True, "mpirun ended %.1fs after the unmounts" % dt)
        except sm.subprocess.TimeoutExpired:
            ck.ok(False, "the live daemons did not leave within %ds of their "
                  "unmounts with rank 3 dead" % EXIT_BOUND_S)
        log = c.log_text()
        ck.ok("rank 3 neither left nor answers" in log,
              "the daemons say rank 3 is gone")
        ck.ok("without --enable-recovery" not in log,
              "no warning about --enable-recovery when mpirun has it")
        for marker in ("AddressSanitizer", "runtime error:", "Segmentation fault"):
            ck.ok(marker not in log, "no %s in the log" % marker)
    finally:
        c.stop(raise_on_crash=False)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
