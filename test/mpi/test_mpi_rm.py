#!/usr/bin/python3
"""MPI delete: `shardctl rm` through ONE rank's mount deletes a committed
checkpoint on every rank (SPEC 4: "collective in MPI mode").

  1. "gone" is written by a writer per rank and committed on all 4 ranks;
     "keep" (generated, split over the 4 stores before start) sits beside
     it. `shardctl rm` of "gone" through rank 1 only: within RM_WAIT_S it
     is out of every rank's mount listing, stat gives ENOENT on every
     mount, and every rank's store holds no "gone" directory and no
     .deleted-* leftover; "keep" still reads correctly through every rank;
  2. an uncommitted checkpoint is only discarded where rm ran: "wip",
     written on every rank and not committed, removed through rank 2, is
     gone there and still "writing" on ranks 0, 1 and 3;
  3. a peer's removal of a checkpoint a rank does not have: "only0" is a
     committed checkpoint in rank 0's store alone; rm through rank 0 makes
     ranks 1-3 log that they have no copy, and every daemon still answers;
  4. rm of one checkpoint through every rank at once (what users of older
     versions did): each rm succeeds or fails with ENOENT (its copy was
     already removed by a peer's notice), at least one succeeds, and the
     checkpoint is gone everywhere.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from mpiplan import Plan, RefBuilder, commit_all, run_writers, state  # noqa: E402
from sfmpi import sm  # noqa: E402

RM_WAIT_S = 15          # bound on a removal reaching every rank
RM_CMD_WAIT_S = 60      # bound on one `shardctl rm` process


def small_plan(env, name):
    """One tensor in 4 dim-0 boxes, one per rank."""
    rb = RefBuilder(env, name)
    p = Plan(rb)
    p.tensor("w", "F32", [64, 16])
    for r in range(sfmpi.NRANKS):
        p.box(r, "w", [(16 * r, 16 * r + 16), None])
    return p, rb.done()


def rm(env, c, r, ckpt):
    """`shardctl rm` through rank r's mount: (rc, output)."""
    try:
        p = subprocess.run([env.shardctl, "rm", os.path.join(c.mnt(r), ckpt)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=RM_CMD_WAIT_S)
    except subprocess.TimeoutExpired:
        return -1, "no answer within %ds" % RM_CMD_WAIT_S
    return p.returncode, p.stdout.decode(errors="replace").strip()


def leftovers(c, r, ckpt):
    """What of ckpt rank r still shows: a list of reasons (empty: none)."""
    left = []
    try:
        if ckpt in os.listdir(c.mnt(r)):
            left.append("listed in the mount")
    except OSError as e:
        left.append("mount listing failed: %s" % sm.errname(e.errno))
    try:
        os.stat(os.path.join(c.mnt(r), ckpt))
        left.append("stat succeeds")
    except FileNotFoundError:
        pass
    except OSError as e:
        left.append("stat fails with %s, not ENOENT" % sm.errname(e.errno))
    store = c.store(r)
    if os.path.lexists(os.path.join(store, ckpt)):
        left.append("store directory exists")
    left += ["%s in the store" % d for d in os.listdir(store)
             if d.startswith(".deleted-")]
    return left


def logged(c, r, ckpt, text):
    """Has rank r logged a line naming ckpt with text?"""
    return any("[rank %d]" % r in x and ckpt in x and text in x
               for x in c.log_text().splitlines())


def wait_gone(ck, c, ckpt, ranks, label):
    """Poll (bounded) until no rank in ranks shows ckpt; check each."""
    deadline = time.monotonic() + RM_WAIT_S
    t0 = time.monotonic()
    while True:
        left = {r: leftovers(c, r, ckpt) for r in ranks}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for r in ranks:
        ck.eq(left[r], [], "%s: rank %d shows nothing of %s" % (label, r, ckpt))
    print("%s: %s gone from ranks %s after %.2fs" % (
        label, ckpt, list(ranks), time.monotonic() - t0))


def part_one_rank(env, ck, c, keep_ref):
    ckpt = "gone"
    plan, _ = small_plan(env, ckpt)
    if not run_writers(env, ck, c, ckpt, plan, ckpt):
        return
    for r, (rc, out, _) in sorted(commit_all(env, c, ckpt,
                                             range(sfmpi.NRANKS)).items()):
        ck.eq(rc, 0, "%s: commit on rank %d (%s)" % (ckpt, r, out))
    for r in range(sfmpi.NRANKS):
        ck.eq(state(c, r, ckpt), "committed", "%s: rank %d state" % (ckpt, r))
    rc, out = rm(env, c, 1, ckpt)
    ck.eq(rc, 0, "%s: rm through rank 1 (%s)" % (ckpt, out))
    wait_gone(ck, c, ckpt, range(sfmpi.NRANKS), "rm via rank 1")
    for r in range(sfmpi.NRANKS):
        sfmpi.check_ckpt(ck, env, os.path.join(c.mnt(r), "keep"), keep_ref,
                         "keep via rank %d after rm of %s" % (r, ckpt),
                         nslices=5)


def part_uncommitted(env, ck, c):
    ckpt = "wip"
    plan, _ = small_plan(env, ckpt)
    if not run_writers(env, ck, c, ckpt, plan, ckpt):
        return
    rc, out = rm(env, c, 2, ckpt)
    ck.eq(rc, 0, "%s: rm through rank 2 discards its part (%s)" % (ckpt, out))
    ck.eq(leftovers(c, 2, ckpt), [], "%s: rank 2 shows nothing of it" % ckpt)
    time.sleep(1.0)  # a (wrong) notice would have arrived by now
    for r in (0, 1, 3):
        ck.eq(state(c, r, ckpt), "writing",
              "%s: rank %d keeps its uncommitted part" % (ckpt, r))


def part_absent_on_peers(env, ck, c):
    ckpt = "only0"
    rc, out = rm(env, c, 0, ckpt)
    ck.eq(rc, 0, "%s: rm through rank 0 (%s)" % (ckpt, out))
    wait_gone(ck, c, ckpt, range(sfmpi.NRANKS), "rm of rank 0's own")
    deadline = time.monotonic() + RM_WAIT_S
    while not all(logged(c, r, ckpt, "no copy here") for r in (1, 2, 3)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    for r in (1, 2, 3):
        ck.ok(logged(c, r, ckpt, "no copy here"),
              "%s: rank %d logs that it has no copy" % (ckpt, r))
    ck.ok(c.alive(), "%s: every daemon alive" % ckpt)


def part_every_rank(env, ck, c):
    ckpt = "twice"
    plan, _ = small_plan(env, ckpt)
    if not run_writers(env, ck, c, ckpt, plan, ckpt):
        return
    for r, (rc, out, _) in sorted(commit_all(env, c, ckpt,
                                             range(sfmpi.NRANKS)).items()):
        ck.eq(rc, 0, "%s: commit on rank %d (%s)" % (ckpt, r, out))
    procs = [subprocess.Popen([env.shardctl, "rm", os.path.join(c.mnt(r), ckpt)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(sfmpi.NRANKS)]
    nok = 0
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=RM_CMD_WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += b" (timed out)"
        out = out.decode(errors="replace").strip()
        nok += p.returncode == 0
        ck.ok(p.returncode == 0 or "No such file" in out,
              "%s: rm through rank %d succeeds or says ENOENT (rc %d: %s)" % (
                  ckpt, r, p.returncode, out))
    ck.ok(nok >= 1, "%s: at least one rm succeeded (%d)" % (ckpt, nok))
    wait_gone(ck, c, ckpt, range(sfmpi.NRANKS), "rm via every rank")
    ck.ok(c.alive(), "%s: every daemon alive" % ckpt)


def run(env, ck):
    stores = env.path("store%r")
    full = env.path("full")
    keep_ref = env.gen(os.path.join(full, "keep"), layout="fsdp", ranks=4,
                       size="512K", dtype="F32", block_size="64K", seed=11)
    sfmpi.split_store(os.path.join(full, "keep"), stores)
    env.gen(os.path.join(sfmpi.expand(stores, 0), "only0"), layout="fsdp",
            ranks=1, size="64K", dtype="F32", block_size="64K", seed=12,
            ref=False)
    opts = ["--commit-timeout", "8", "--log-level", "info"]
    with sfmpi.Cluster(env, stores, opts, name="rm") as c:
        part_one_rank(env, ck, c, keep_ref)
        part_uncommitted(env, ck, c)
        part_absent_on_peers(env, ck, c)
        part_every_rank(env, ck, c)
        for r in range(sfmpi.NRANKS):
            ck.eq(sorted(os.listdir(c.mnt(r))),
                  ["keep"] if r == 2 else ["keep", "wip"],
                  "rank %d lists what is left" % r)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
