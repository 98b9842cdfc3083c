#!/usr/bin/python3
"""Commits and deletes with a rank down (issue 15, item 3).

4 daemons under `mpirun --enable-recovery` with --peer-timeout 3 and
--commit-timeout 12; "ck" (generated, split over the 4 stores) is committed
before start, and "ck2", whose tensors need rank 3's shards.

  1. rank 3 stopped (SIGSTOP), so it can come back: "s1", written by all 4
     ranks, is committed on ranks 0-2:
     - each commit fails within the commit timeout (rank 0's probe finds
       rank 3 silent after the peer timeout), the reason names rank 3, and
       the checkpoint stays uncommitted and writable on every live rank
       (state "failed: ..." naming rank 3, no manifest.json in any store, a
       root file written afterwards lands);
     - committed again, each fails at once (< QUICK_S: rank 3 is marked
       down on rank 0);
     - rank 3 continued: once reads of its shards ("ck2") work again
       through every live rank, the commit of "s1" on all 4 ranks succeeds and every rank
       reads it byte-exact (the file written after the failure included);
  2. rank 3 killed (SIGKILL):
     - writers on ranks 0-2 write "k1" and ranks 0-2 commit it: each fails
       within the bound (the peer timeout, under the commit timeout), names
       rank 3, and "k1" stays uncommitted and writable; committed again,
       each fails at once;
     - `shardctl rm` of the committed "s1" through rank 1 fails (EIO) within
       the peer timeout plus slack and through rank 0 at once; nothing is
       deleted anywhere: the committed checkpoints' store files on all 4
       stores are unchanged (hashed before and after), every live mount
       still lists "s1", and the daemon logs why, naming rank 3;
     - the live mounts read every tensor of "ck" that needs no rank 3 shard
       byte-exact, and fail the others with EIO;
  3. unmounted, the live daemons exit with the dead one gone.
"""

import hashlib
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from mpiplan import Plan, RefBuilder, commit_all, run_writers, state  # noqa: E402
from sfmpi import sm  # noqa: E402

PEER_TIMEOUT_S = 3
COMMIT_TIMEOUT_S = 12
SLACK_S = 5                  # a loaded 2-core machine, shardctl start-up
SLOW_BOUND_S = COMMIT_TIMEOUT_S + SLACK_S   # nobody knew rank 3 was down
QUICK_S = 2.0                # rank 3 marked down: a 0.3 s probe + start-up
RM_BOUND_S = PEER_TIMEOUT_S + SLACK_S
EXIT_BOUND_S = PEER_TIMEOUT_S + 15
LIVE = (0, 1, 2)


def plan_for(env, name, ranks):
    """One tensor in dim-0 boxes, one per rank in ranks."""
    rb = RefBuilder(env, name)
    p = Plan(rb)
    rows = 16 * len(ranks)
    p.tensor("w", "F32", [rows, 8])
    for i, r in enumerate(ranks):
        p.box(r, "w", [(16 * i, 16 * i + 16), None])
    return p, rb


def snapshot(c, names):
    """Every store's committed checkpoints (names), file by file, and its
    top-level listing (no .deleted-* may appear)."""
    out = {}
    for r in range(sfmpi.NRANKS):
        top = c.store(r)
        out[(r, "/")] = sorted(n for n in os.listdir(top) if n != "k1")
        for n in names:
            out[(r, n)] = sm.store_snapshot(os.path.join(top, n))
    return out


def diff(before, after):
    out = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += ["store %d %s: %s" % (k[0], k[1], d)
                    for d in sm.snapshot_diff(a, b)]
        else:
            out.append("store %d %s: %r -> %r" % (k[0], k[1], a, b))
    return out


def commit_fails(ck, env, c, ckpt, bound, label):
    """Commit ckpt on the live ranks: each fails within bound, naming rank 3;
    then the checkpoint is uncommitted on each, its state naming rank 3."""
    res = commit_all(env, c, ckpt, LIVE)
    for r, (rc, out, dt) in sorted(res.items()):
        print("%s: commit on rank %d: rc %d after %.2fs: %s" % (label, r, rc,
                                                               dt, out))
        ck.ok(rc != 0, "%s: commit on rank %d fails" % (label, r))
        ck.ok("rank 3" in out, "%s: rank %d's reason names rank 3 (%s)" % (
            label, r, out))
        ck.ok(dt < bound, "%s: rank %d failed after %.2fs (< %.1fs)" % (
            label, r, dt, bound))
    for r in LIVE:
        st = state(c, r, ckpt)
        ck.ok(st.startswith("failed: ") and "rank 3" in st,
              "%s: rank %d's state is failed, naming rank 3 (%s)" % (label, r, st))
        ck.ok(not os.path.exists(os.path.join(c.store(r), ckpt, "manifest.json")),
              "%s: no manifest.json of %s in store %d" % (label, ckpt, r))


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_until_ok(ck, path, want, label, bound_s=10):
    """Read path until it succeeds (a down peer is probed once a second)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            got = sm.read_file(path)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                ck.ok(False, "%s: %s" % (label, e))
                return
            time.sleep(0.2)
    ck.bytes_eq(got, want, label)


def rm_timed(env, c, r, ckpt):
    t0 = time.monotonic()
    p = sm.subprocess.run([env.shardctl, "rm", os.path.join(c.mnt(r), ckpt)],
                          stdout=sm.subprocess.PIPE, stderr=sm.subprocess.STDOUT,
                          timeout=60)
    return p.returncode, p.stdout.decode(errors="replace").strip(), \
        time.monotonic() - t0


def part_stopped(env, ck, c, ref2):
    ckpt = "s1"
    plan, rb = plan_for(env, ckpt, range(sfmpi.NRANKS))
    if not run_writers(env, ck, c, ckpt, plan, ckpt):
        return None
    pid = c.rank_pid(3)
    if not ck.ok(pid is not None, "found rank 3's daemon"):
        return None
    os.kill(pid, signal.SIGSTOP)
    try:
        commit_fails(ck, env, c, ckpt, SLOW_BOUND_S, "rank 3 stopped")
        commit_fails(ck, env, c, ckpt, QUICK_S, "rank 3 stopped, known down")
        # uncommitted and writable on a live rank
        extra = b'{"written after the failed commit": true}\n'
        try:
            write_file(os.path.join(c.mnt(1), ckpt, "extra.json"), extra)
            ck.ok(True, "a root file written into %s after the failure" % ckpt)
        except OSError as e:
            ck.ok(False, "write into %s after the failed commit: %s" % (ckpt, e))
        rb.file("extra.json", extra)
    finally:
        os.kill(pid, signal.SIGCONT)
    # back: reads of rank 3's shards work again through every live rank
    # (rank 0 marked it down; one read a second probes it). "ck2", not
    # "ck": nothing of ck is cached when rank 3 dies in part 2.
    for r in LIVE:
        for n in sorted(ref2.tensors):
            read_until_ok(ck, sm.tensor_path(os.path.join(c.mnt(r), "ck2"), n),
                          ref2.tensor_bytes(n),
                          "rank 3 continued: rank %d reads ck2 %s" % (r, n))
    res = commit_all(env, c, ckpt, range(sfmpi.NRANKS))
    for r, (rc, out, dt) in sorted(res.items()):
        ck.eq(rc, 0, "rank 3 back: commit of %s on rank %d (%s, %.2fs)" % (
            ckpt, r, out, dt))
    sref = rb.done()
    for r in range(sfmpi.NRANKS):
        ck.eq(state(c, r, ckpt), "committed", "%s: rank %d state" % (ckpt, r))
        sfmpi.check_ckpt(ck, env, os.path.join(c.mnt(r), ckpt), sref,
                         "%s via rank %d" % (ckpt, r), nslices=3)
    return sref


def part_killed(env, ck, c, ref, clean, broken):
    before = snapshot(c, ["ck", "ck2", "s1"])
    pid = c.rank_pid(3)
    if not ck.ok(pid is not None, "found rank 3's daemon"):
        return
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)

    ckpt = "k1"
    plan, _ = plan_for(env, ckpt, LIVE)
    if run_writers(env, ck, c, ckpt, plan, ckpt, ranks=LIVE):
        commit_fails(ck, env, c, ckpt, SLOW_BOUND_S, "rank 3 killed")
        commit_fails(ck, env, c, ckpt, QUICK_S, "rank 3 killed, known down")
        try:
            write_file(os.path.join(c.mnt(2), ckpt, "late.json"), b"{}\n")
            ck.ok(True, "%s takes a root file after the failed commits" % ckpt)
        except OSError as e:
            ck.ok(False, "write into %s after the failed commits: %s" % (ckpt, e))

    # rm of a committed checkpoint with rank 3 dead: refused, nothing deleted
    for r, bound in ((1, RM_BOUND_S), (0, QUICK_S), (1, QUICK_S)):
        rc, out, dt = rm_timed(env, c, r, "s1")
        print("rm s1 via rank %d: rc %d after %.2fs: %s" % (r, rc, dt, out))
        ck.ok(rc != 0 and "Input/output error" in out,
              "rm of s1 via rank %d fails with EIO (%s)" % (r, out))
        ck.ok("rank 3 is down" in out,
              "shardctl rm says why: rank 3 is down (%s)" % out)
        ck.ok(dt < bound, "rm via rank %d failed after %.2fs (< %.1fs)" % (
            r, dt, bound))
    log = c.log_text()
    for r in (0, 1):
        ck.ok(any("[rank %d]" % r in x and '"s1": not deleted' in x and
                  "rank 3 is down" in x for x in log.splitlines()),
              "rank %d logs that s1 was not deleted because rank 3 is down" % r)
    for r in LIVE:
        ck.ok("s1" in os.listdir(c.mnt(r)), "rank %d still lists s1" % r)
        ck.eq(state(c, r, "s1"), "committed", "s1 still committed on rank %d" % r)

    # the live mounts still serve what needs no rank 3 shard
    for r in LIVE:
        root = os.path.join(c.mnt(r), "ck")
        for n in clean:
            ck.eq(sm.read_in_child(sm.tensor_path(root, n), timeout_s=30),
                  ("ok", hashlib.sha256(ref.tensor_bytes(n)).hexdigest()),
                  "rank 3 dead: rank %d reads %s" % (r, n))
        for n in broken[:5]:
            ck.eq(sm.read_in_child(sm.tensor_path(root, n), timeout_s=30),
                  ("errno", 5), "rank 3 dead: rank %d: %s (needs rank 3) "
                  "fails with EIO" % (r, n))
        ck.ok(sm.is_mounted(c.mnt(r)), "rank %d's mount is still up" % r)
    ck.eq(diff(before, snapshot(c, ["ck", "ck2", "s1"])), [],
          "committed checkpoints unchanged in every store")
    for r in range(sfmpi.NRANKS):
        ck.ok(not os.path.exists(os.path.join(c.store(r), "k1", "manifest.json")),
              "k1 has no manifest.json in store %d" % r)


def run(env, ck):
    full = env.path("full")
    stores = env.path("store%r")
    ref = env.gen(os.path.join(full, "ck"), layout="mixed", ranks=4,
                  size="1M", dtype="BF16", block_size="64K", seed=71)
    sfmpi.split_store(os.path.join(full, "ck"), stores)
    man = sm.manifest_of(os.path.join(full, "ck"))
    ref2 = env.gen(os.path.join(full, "ck2"), layout="fsdp", ranks=4,
                   size="64K", dtype="F32", block_size="64K", seed=72)
    sfmpi.split_store(os.path.join(full, "ck2"), stores)
    man2 = sm.manifest_of(os.path.join(full, "ck2"))

    def dead(s):
        return s["rank"] == 3
    kinds = {n: sm.classify(man, ref, n, dead) for n in ref.tensors}
    broken = sorted(n for n, k in kinds.items() if k == "broken")
    clean = sorted(n for n, k in kinds.items() if k == "clean")
    if not ck.ok(broken and clean, "ck has tensors with and without rank 3's "
                 "shards (%d, %d)" % (len(broken), len(clean))):
        return
    if not ck.ok(any(sm.classify(man2, ref2, n, dead) == "broken"
                     for n in ref2.tensors), "ck2 has tensors that need rank 3"):
        return

    c = sfmpi.Cluster(env, stores, ["--peer-timeout", str(PEER_TIMEOUT_S),
                                    "--commit-timeout", str(COMMIT_TIMEOUT_S),
                                    "--log-level", "info"],
                      name="faultc", mpirun_opts=["--enable-recovery"])
    c.start()
    try:
        if part_stopped(env, ck, c, ref2) is None:
            return
        part_killed(env, ck, c, ref, clean, broken)

        t0 = time.monotonic()
        for r in LIVE:
            sm.subprocess.run(["fusermount3", "-u", c.mnt(r)], timeout=30)
        sm.subprocess.run(["umount", "-l", c.mnt(3)], timeout=30)
        try:
            c.proc.wait(timeout=EXIT_BOUND_S)
            ck.ok(True, "mpirun ended %.1fs after the unmounts"
                  % (time.monotonic() - t0))
        except sm.subprocess.TimeoutExpired:
            ck.ok(False, "the live daemons did not leave within %ds of their "
                  "unmounts with rank 3 dead" % EXIT_BOUND_S)
        log = c.log_text()
        for marker in ("AddressSanitizer", "runtime error:", "Segmentation fault"):
            ck.ok(marker not in log, "no %s in the log" % marker)
    finally:
        c.stop(raise_on_crash=False)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
