#!/usr/bin/python3
"""MPI mode survives a daemon's death (issue 15), found in 2 s (issue 29, 3).

4 daemons on split node-local stores, started as the README says
(`mpirun --enable-recovery ... shardfs --mpi --peer-timeout 10`: a read
timeout far above the 2 s the heartbeat gives, so that the old behaviour,
EIO only after the read timeout, fails this test). Then:

  0. load: two readers per mount read big tensors, mostly other ranks'
     shards, over and over (page cache dropped after each read) for
     LOAD_S seconds: no daemon marks any peer down;
  1. rank 3 is stopped (SIGSTOP): a read through rank 0 of a tensor that
     needs rank 3's shards fails with EIO within DEAD_BOUND_S of the stop;
     rank 3 is continued (SIGCONT): it is taken back and the same tensor
     reads byte-exact within BACK_BOUND_S;
  2. rank 3 is killed with SIGKILL while a reader streams through rank 0;
     a read through rank 1 that needs it fails with EIO within
     DEAD_BOUND_S of the kill;
  3. every tensor through ranks 0, 1 and 2: the ones that do not need rank
     3's shards read byte-exact; the ones that do fail with EIO, each in
     well under a second (the peer is marked down once per episode, with
     one log line, not one per block);
  4. the three live mounts stay up and serving meanwhile;
  5. unmounting them, the three daemons see that rank 3 neither left nor
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

PEER_TIMEOUT_S = 10
# A read that needs a stopped or killed daemon: SPEC section 2 says EIO
# within 2 s. The daemons' heartbeat marks it down 1.25-1.5 s after it
# went silent (plus a 20 ms poll); the read is made in a thread of this
# process right after the signal, so the bound adds only 0.5 s for the
# FUSE round trip and scheduling on a loaded 2-core machine (an ASan build).
# The old behaviour (EIO after the read timeout) takes 10 s here.
DEAD_BOUND_S = 2.5
BACK_BOUND_S = 3.0                       # SIGCONT to a good read
LATER_BOUND_S = 1.5                      # each EIO once it is marked down
EXIT_BOUND_S = PEER_TIMEOUT_S + 15       # unmount to mpirun's exit
LOAD_S = 6.0                             # the loaded run (4 silence windows)
DOWN_MARKS = ("not heard for", "did not answer", "marked down")


def read_timed(path, timeout_s=PEER_TIMEOUT_S * 3 + 10):
    t0 = time.monotonic()
    res = sm.read_in_child(path, timeout_s=timeout_s)
    return res, time.monotonic() - t0


def read_whole(path):
    """path's bytes; its page cache is dropped after, so that the next
    read asks the daemon (and its peers) again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while True:
            b = os.read(fd, 4 << 20)
            if not b:
                break
            parts.append(b)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_here(path):
    """Read path whole in this process: ("ok", sha256) or ("errno", N)."""
    try:
        return ("ok", hashlib.sha256(read_whole(path)).hexdigest())
    except OSError as e:
        return ("errno", e.errno)


def read_since(path, t0, timeout_s=PEER_TIMEOUT_S * 3 + 10):
    """read_here in a thread (a hung read cannot hang the test): the
    result and the seconds from t0 (a signal's time) to its end."""
    out = []
    th = threading.Thread(target=lambda: out.append(
        (read_here(path), time.monotonic())), daemon=True)
    th.start()
    th.join(timeout=timeout_s)
    if not out:
        return ("timeout", None), time.monotonic() - t0
    return out[0][0], out[0][1] - t0


def down_lines(log):
    return [ln for ln in log.splitlines()
            if "shardfs: error: mpi: rank" in ln and
            any(m in ln for m in DOWN_MARKS)]


def load(ck, c, big):
    """Two readers per mount read the big tensors (3 in 4 of their shards
    on other ranks) over and over for LOAD_S; the log must show no peer
    marked down."""
    names = sorted(big.tensors, key=lambda n: -big.nbytes(n))[:8]
    stop = time.monotonic() + LOAD_S
    errors, nbytes = [], [0]

    def reader(r, k):
        i = k
        while time.monotonic() < stop:
            n = names[i % len(names)]
            i += 1
            path = sm.tensor_path(os.path.join(c.mnt(r), "big"), n)
            try:
                got = len(read_whole(path))
                if got != big.nbytes(n):
                    errors.append("rank %d: %s: %d bytes" % (r, n, got))
                nbytes[0] += got
            except OSError as e:
                errors.append("rank %d: %s: %s" % (r, n, e))
    ths = [threading.Thread(target=reader, args=(r, k))
           for r in range(sfmpi.NRANKS) for k in range(2)]
    t0 = time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join(timeout=LOAD_S + 120)
    dt = time.monotonic() - t0
    ck.eq(errors[:5], [], "loaded run: every read of a big tensor whole")
    print("loaded run: %d readers, %.0f MiB in %.1fs (%.0f MiB/s)" % (
        len(ths), nbytes[0] / 2**20, dt, nbytes[0] / 2**20 / dt))
    ck.eq(down_lines(c.log_text()), [], "loaded run (%d readers of big "
          "remote tensors, %.1fs): no daemon marked a peer down" % (len(ths), dt))


def run(env, ck):
    full = env.path("full")
    stores = env.path("store%r")
    ref = env.gen(os.path.join(full, "ck"), layout="mixed", ranks=4,
                  size="3M", dtype="BF16", block_size="64K", seed=61)
    sfmpi.split_store(os.path.join(full, "ck"), stores)
    bigref = env.gen(os.path.join(full, "big"), layout="mixed", ranks=4,
                     size="96M", dtype="F32", block_size="1M", seed=62)
    sfmpi.split_store(os.path.join(full, "big"), stores)
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
        load(ck, c, bigref)

        # stopped: EIO within DEAD_BOUND_S; continued: taken back (this
        # tensor is not read before: no cache here holds it)
        probe = sm.tensor_path(os.path.join(c.mnt(0), "ck"), broken[0])
        good = hashlib.sha256(ref.tensor_bytes(broken[0])).hexdigest()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        res, dt = read_since(probe, t0)
        ck.eq(res, ("errno", 5), "rank 0: %s (needs stopped rank 3) fails "
              "with EIO" % broken[0])
        print("rank 0: %s %.2fs after SIGSTOP of rank 3" % (res, dt))
        ck.ok(dt < DEAD_BOUND_S, "rank 0: EIO %.2fs after SIGSTOP of rank 3 "
              "(< %.1fs; --peer-timeout %ds)" % (dt, DEAD_BOUND_S, PEER_TIMEOUT_S))
        # stopped long enough for every daemon to find it silent (each
        # heard it last at its own time): one episode on every rank
        time.sleep(max(0.0, t0 + DEAD_BOUND_S - time.monotonic()))
        os.kill(pid, signal.SIGCONT)
        t0 = time.monotonic()
        while True:
            res = read_here(probe)
            if res[0] == "ok" or time.monotonic() - t0 > 10:
                break
            time.sleep(0.05)
        dt = time.monotonic() - t0
        ck.eq(res, ("ok", good), "rank 0: %s reads again once rank 3 is "
              "continued" % broken[0])
        print("rank 0: %s %.2fs after SIGCONT of rank 3" % (res, dt))
        ck.ok(dt < BACK_BOUND_S, "rank 3 taken back %.2fs after SIGCONT "
              "(< %.1fs)" % (dt, BACK_BOUND_S))

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
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        res, dt = read_since(sm.tensor_path(os.path.join(c.mnt(1), "ck"),
                                            broken[-1]), t0)
        ck.eq(res, ("errno", 5), "rank 1: %s (needs killed rank 3) fails "
              "with EIO" % broken[-1])
        print("rank 1: %s %.2fs after SIGKILL of rank 3" % (res, dt))
        ck.ok(dt < DEAD_BOUND_S, "rank 1: EIO %.2fs after SIGKILL of rank 3 "
              "(< %.1fs; --peer-timeout %ds)" % (dt, DEAD_BOUND_S, PEER_TIMEOUT_S))
        th.join(timeout=120)
        ck.eq(stream_errors, [], "a reader of tensors rank 3 holds no part of, "
              "streaming through rank 0 while rank 3 is killed, gets every byte")

        for r in range(3):
            root = os.path.join(c.mnt(r), "ck")
            slow = []
            # rank 0 read broken[0] while rank 3 was back: it may hold it
            for n in broken[1:] if r == 0 else broken:
                (res, val), dt = read_timed(sm.tensor_path(root, n))
                ck.eq((res, val), ("errno", 5),
                      "rank %d: %s (needs rank 3) fails with EIO" % (r, n))
                if dt >= LATER_BOUND_S:
                    slow.append("%s %.2fs" % (n, dt))
            ck.eq(slow, [], "rank %d: every EIO in < %.1fs" % (r, LATER_BOUND_S))
            for n in clean:
                (res, val), _ = read_timed(sm.tensor_path(root, n))
                ck.eq((res, val), ("ok", hashlib.sha256(
                    ref.tensor_bytes(n)).hexdigest()),
                    "rank %d: %s (no rank 3 shard) reads correctly" % (r, n))
            ck.ok(sm.is_mounted(c.mnt(r)), "rank %d's mount is still up" % r)
        lines = down_lines(c.log_text())
        for r in range(3):
            n = sum(1 for ln in lines if ln.startswith(
                "[rank %d] shardfs: error: mpi: rank 3 " % r))
            ck.eq(n, 2, "rank %d logged rank 3 going down once per episode "
                  "(stopped, killed)" % r)
            n = c.log_text().count("[rank %d] shardfs: error: mpi: rank 3 "
                                   "answers again: marked up" % r)
            ck.eq(n, 1, "rank %d logged rank 3 taken back once" % r)
        ck.eq([ln for ln in lines if "mpi: rank 3 " not in ln], [],
              "no daemon marked a live peer down")

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
