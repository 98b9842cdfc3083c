#!/usr/bin/python3
"""MPI write side (issue 3, items 3 and 4): 4 daemons with separate stores;
one writer process per rank writes that rank's shards through its own
mount, then all 4 ranks commit at once (`shardctl commit` x 4).

  1. a checkpoint of dim-0 and dim-1 boxes, a 3-d box grid, flat runs at
     odd byte offsets, replicated tensors written by every rank (as boxes
     and as flat runs), overlaps between two remote ranks (box/box and
     box/flat, so rank 0's merge must read and compare peer bytes), dtypes
     BF16 F32 F16 I8 U8 I64 F8_E5M2, and config.json from rank 0: every
     commit succeeds, state is "committed" on every rank, every rank has
     the same manifest.json, then every tensor, random slices and
     model.safetensors through every daemon equal the reference, writes
     give EROFS; then (b) all rank directories gathered into one store and
     mounted by one process read the same;
  2. failures, each on every rank that commits: a gap (EIO, state
     "failed: ..." naming the tensor), conflicting declarations across
     ranks, overlapping shards with different bytes, and rank 3 never
     committing (ranks 0-2 fail within the commit timeout); the checkpoint
     stays uncommitted everywhere (no manifest.json, not "committed"); the
     late checkpoint then commits when all 4 ranks run it.
"""

import errno
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from mpiplan import Plan, RefBuilder, commit_all, run_writers, state  # noqa: E402
from sfmpi import sm  # noqa: E402

COMMIT_TIMEOUT_S = 8


def good_plan(env, name):
    rb = RefBuilder(env, name)
    p = Plan(rb)
    # dim-0 boxes, uneven
    p.tensor("model.embed.weight", "BF16", [256, 96])
    cuts = [0, 50, 128, 200, 256]
    for r in range(4):
        p.box(r, "model.embed.weight", [(cuts[r], cuts[r + 1]), None])
    # dim-1 boxes
    p.tensor("model.layers.0.wq", "F32", [48, 128])
    for r in range(4):
        p.box(r, "model.layers.0.wq", [None, (32 * r, 32 * r + 32)])
    # a 2 x 2 grid over dims 0 and 2 of a 3-d tensor
    p.tensor("grid/t", "I8", [6, 5, 8])
    for r in range(4):
        a, c = (r // 2) * 3, (r % 2) * 4
        p.box(r, "grid/t", [(a, a + 3), None, (c, c + 4)])
    # flat runs at byte offsets that split elements
    p.tensor("optim/exp_avg/flat", "F16", [1000, 7])
    fc = [0, 3001, 7000, 10555, 14000]
    for r in range(4):
        p.flat(r, "optim/exp_avg/flat", [[fc[r], fc[r + 1] - fc[r]]])
    # replicated: every rank writes the whole tensor, as a box or flat
    p.tensor("norm.weight", "F32", [96])
    for r in range(4):
        if r % 2 == 0:
            p.box(r, "norm.weight", [None])
        else:
            p.flat(r, "norm.weight", [[0, 96 * 4]], chunk=100)
    # overlaps held by two ranks other than 0 (the merge reads both remotely)
    p.tensor("ovl.u8", "U8", [10, 100])
    p.box(2, "ovl.u8", [(0, 6), None])
    p.box(3, "ovl.u8", [(4, 10), None])
    p.tensor("ovl2.f32", "F32", [8, 16])
    p.box(1, "ovl2.f32", [(0, 5), None])
    p.flat(3, "ovl2.f32", [[4 * 16 * 4, 4 * 16 * 4]], chunk=64)
    p.tensor("i64.counts", "I64", [33])
    p.box(0, "i64.counts", [None])
    p.tensor("f8.scale", "F8_E5M2", [64])
    p.flat(1, "f8.scale", [[0, 40]])
    p.flat(2, "f8.scale", [[40, 24]])
    # a larger tensor over several write calls
    p.tensor("big.bf16", "BF16", [1024, 512])
    for r in range(4):
        p.box(r, "big.bf16", [(256 * r, 256 * r + 256), None])
    p.file(0, "config.json", json.dumps({"model": "test", "layers": 1}).encode())
    return p, rb.done()


def check_uncommitted(ck, c, ckpt, label):
    for r in range(sfmpi.NRANKS):
        ck.ok(not os.path.exists(os.path.join(c.store(r), ckpt, "manifest.json")),
              "%s: no manifest.json in rank %d's store" % (label, r))
        ck.ok(state(c, r, ckpt) != "committed",
              "%s: rank %d does not show it committed" % (label, r))


def part_good(env, ck, c):
    ckpt = "step-100"
    plan, ref = good_plan(env, ckpt)
    if not run_writers(env, ck, c, ckpt, plan, ckpt):
        return
    for r in range(sfmpi.NRANKS):
        ck.eq(state(c, r, ckpt), "writing", "%s: rank %d state before commit"
              % (ckpt, r))
    res = commit_all(env, c, ckpt, range(sfmpi.NRANKS))
    for r, (rc, out, dt) in sorted(res.items()):
        ck.eq(rc, 0, "%s: commit on rank %d (%s)" % (ckpt, r, out))
        print("commit on rank %d returned after %.2fs" % (r, dt))
    for r in range(sfmpi.NRANKS):
        ck.eq(state(c, r, ckpt), "committed", "%s: rank %d state" % (ckpt, r))
    mans = []
    for r in range(sfmpi.NRANKS):
        try:
            mans.append(sm.read_file(os.path.join(c.store(r), ckpt,
                                                  "manifest.json")))
        except OSError as e:
            ck.ok(False, "%s: manifest.json in rank %d's store: %s" % (ckpt, r, e))
            return
    ck.ok(all(m == mans[0] for m in mans),
          "%s: every rank published the same manifest.json" % ckpt)
    man = json.loads(mans[0])
    ck.eq(man.get("world_size"), 4, "%s: world_size" % ckpt)
    ranks_of = {n: sorted({s["rank"] for s in t["shards"]})
                for n, t in man["tensors"].items()}
    ck.eq(ranks_of.get("norm.weight"), [0, 1, 2, 3],
          "%s: the replicated tensor keeps a shard per rank" % ckpt)
    for r in range(sfmpi.NRANKS):
        root = os.path.join(c.mnt(r), ckpt)
        sfmpi.check_ckpt(ck, env, root, ref, "%s via rank %d" % (ckpt, r))
        ck.raises((errno.EROFS,), lambda: os.close(os.open(
            sm.tensor_path(root, "norm.weight"), os.O_WRONLY)),
            "%s: rank %d: open for writing after commit" % (ckpt, r))
    ck.ok(c.alive(), "%s: every daemon alive" % ckpt)

    # (b) gather every rank's directory into one store, one process
    one = env.path("gathered", ckpt)
    os.makedirs(one)
    shutil.copy2(os.path.join(c.store(0), ckpt, "manifest.json"), one)
    for r in range(sfmpi.NRANKS):
        src = os.path.join(c.store(r), ckpt, "rank-%05d" % r)
        if ck.ok(os.path.isdir(src), "%s: rank %d wrote rank-%05d/" % (ckpt, r, r)):
            shutil.copytree(src, os.path.join(one, "rank-%05d" % r))
    with sm.Mount(env, env.path("gathered"), name="gathered") as m:
        sfmpi.check_ckpt(ck, env, os.path.join(m.mnt, ckpt), ref,
                         "%s gathered, single process" % ckpt)


def bad_plan(env, name, kind):
    rb = RefBuilder(env, name)
    p = Plan(rb)
    if kind == "gap":
        p.tensor("g.weight", "U8", [8, 8])
        p.box(0, "g.weight", [(0, 4), None])
        p.box(1, "g.weight", [(5, 8), None])
    elif kind == "decl":
        p.tensor("c.weight", "F32", [4, 4])
        p.box(0, "c.weight", [None, None])
        p.declare(1, "c.weight", dtype="F16", shape=[4, 4])
    elif kind == "bytes":
        p.tensor("o.weight", "U8", [10, 100])
        p.box(2, "o.weight", [(0, 6), None])
        p.box(3, "o.weight", [(4, 10), None], xor=0x5a)
    return p, rb.done()


def part_failures(env, ck, c):
    for kind, what in (("gap", "g.weight"), ("decl", "c.weight"),
                       ("bytes", "o.weight")):
        ckpt = "bad-" + kind
        plan, _ = bad_plan(env, ckpt, kind)
        if not run_writers(env, ck, c, ckpt, plan, ckpt):
            continue
        res = commit_all(env, c, ckpt, range(sfmpi.NRANKS))
        for r, (rc, out, dt) in sorted(res.items()):
            ck.ok(rc != 0, "%s: commit on rank %d must fail (rc %d: %s)" % (
                ckpt, r, rc, out))
            st = state(c, r, ckpt)
            ck.ok(st.startswith("failed: ") and what in st,
                  "%s: rank %d state %r names %s" % (ckpt, r, st, what))
            ck.ok(dt < COMMIT_TIMEOUT_S, "%s: rank %d failed after %.1fs, "
                  "before the commit timeout" % (ckpt, r, dt))
        check_uncommitted(ck, c, ckpt, ckpt)
        if kind != "gap":
            continue
        # the error surfaces as EIO from the setxattr itself (alone, rank
        # 0 waits for the others until the commit timeout)
        try:
            os.setxattr(os.path.join(c.mnt(0), ckpt), "user.shardfs.commit",
                        b"1")
            ck.ok(False, "%s: a lone commit on rank 0 must fail" % ckpt)
        except OSError as e:
            ck.ok(e.errno == errno.EIO,
                  "%s: lone commit on rank 0 fails with %s" % (
                      ckpt, sm.errname(e.errno)))

    # rank 3 never commits: the others fail within the timeout
    ckpt = "late"
    rb = RefBuilder(env, ckpt)
    p = Plan(rb)
    p.tensor("w", "BF16", [64, 32])
    for r in range(4):
        p.box(r, "w", [(16 * r, 16 * r + 16), None])
    ref = rb.done()
    if not run_writers(env, ck, c, ckpt, p, ckpt):
        return
    res = commit_all(env, c, ckpt, range(3))
    for r, (rc, out, dt) in sorted(res.items()):
        ck.ok(rc != 0, "%s: commit without rank 3 fails on rank %d (%s)"
              % (ckpt, r, out))
        ck.ok(dt < COMMIT_TIMEOUT_S + 5, "%s: rank %d gave up after %.1fs "
              "(commit timeout %ds)" % (ckpt, r, dt, COMMIT_TIMEOUT_S))
        st = state(c, r, ckpt)
        ck.ok(st.startswith("failed: ") and "3" in st,
              "%s: rank %d state %r names rank 3" % (ckpt, r, st))
    ck.eq(state(c, 3, ckpt), "writing", "%s: rank 3 is still writing" % ckpt)
    check_uncommitted(ck, c, ckpt, ckpt)
    # fixed: all four commit
    res = commit_all(env, c, ckpt, range(4))
    for r, (rc, out, dt) in sorted(res.items()):
        ck.eq(rc, 0, "%s: second commit on all ranks, rank %d (%s)" % (
            ckpt, r, out))
    for r in range(sfmpi.NRANKS):
        sfmpi.check_ckpt(ck, env, os.path.join(c.mnt(r), ckpt), ref,
                         "%s via rank %d" % (ckpt, r), nslices=5)
    ck.ok(c.alive(), "every daemon alive after the failed commits")


def run(env, ck):
    stores = env.path("store%r")
    for r in range(sfmpi.NRANKS):
        os.makedirs(sfmpi.expand(stores, r))
    opts = ["--commit-timeout", str(COMMIT_TIMEOUT_S), "--log-level", "info"]
    with sfmpi.Cluster(env, stores, opts, name="write") as c:
        part_good(env, ck, c)
        part_failures(env, ck, c)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
