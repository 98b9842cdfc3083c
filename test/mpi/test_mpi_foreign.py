#!/usr/bin/python3
"""MPI, checkpoints other frameworks wrote, left on node-local stores
(issue 11, SPEC 7: "the framework's files may lie on any daemon's store as
long as the metadata is on at least one").

Real PyTorch DCP checkpoints (test/fixtures/dcp/torch-2.15*, written by
torch 2.15 with 4 gloo ranks) are split the way a job without a shared
filesystem leaves them: rank r's store holds only __r_0.distcp, and
.metadata lies on one store only. Hugging Face sharded weights
(test/fixtures/hf: transformers 5.24 safetensors, 4.46 .bin) are spread the
same way: shard K on store K-1 mod 4, the index and config on one; and so
are PaddlePaddle's (R_ID.distcp on store R, ID.metadata on another) and a
Megatron-Core torch_dist checkpoint's. `mpirun -np 4 shardfs --mpi STORE%r
MNT%r` must show every checkpoint on every daemon, every tensor byte-exact
(test/interop/check_dcp_tree.py against the xxh3 of what torch was given):

  1. a store of checkpoints: rows4 (.metadata on rank 2), mesh2d (on rank
     0), cols4 (on rank 3), and `single` (one process's checkpoint) whose
     files are all on rank 3: ranks 0-2 hold nothing of it;
  2. STORE%r is itself one checkpoint (rows4 split, .metadata on rank 1):
     every mount's root is that checkpoint;
  3. a chunk file on a peer replaced by a symlink to a copy outside the
     checkpoint: the tensors it holds are left out on every daemon (never
     served from outside), the rest read correctly;
  4. rank 1's checkpoint directory swapped for a symlink while mounted
     (issue 30): no daemon serves the swapped-in bytes;
and every change through a mount fails with EROFS, and the stores are
byte-for-byte unchanged at the end.
"""

import errno
import re
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.environ.get("SHARDFS_FIXTURES") or os.path.join(TOP, "test", "fixtures")
CHECKER = os.path.join(TOP, "test", "interop", "check_dcp_tree.py")

# (name, fixture dir, rank holding .metadata)
SPLIT = [("rows4", "dcp/torch-2.15/rows4", 2),
         ("mesh2d", "dcp/torch-2.15/mesh2d", 0),
         ("cols4", "dcp/torch-2.15-more/cols4", 3),
         # per-rank metadata: every file on its own rank's store
         ("perrank4", "dcp/torch-2.15-ext/perrank4", 0),
         ("perrank2-zstd", "dcp/torch-2.15-ext/perrank2_zstd", 0),
         # Hugging Face shards spread over the nodes, the index on one
         ("hf-st", "hf/transformers-5.24/llama-st", 1),
         ("hf-bin", "hf/transformers-4.46/llama-bin", 2),
         # PaddlePaddle's 2 and 4 rank saves, R_ID.distcp on store R
         ("pd-shard2", "paddle/paddle-3.3.1/shard2", 3),
         ("pd-flat4", "paddle/paddle-3.3.1/flat4", 1),
         # Megatron-Core: 2 ranks' DCP files, metadata.json and common.pt
         ("mcore-tp2", "megatron/mcore-0.16.1/gpt_tp2", 3)]


def rank_of(fn):
    """__R_N.distcp -> R; (pytorch_)model-0000K-of-0000N.* -> K-1 mod 4;
    None for anything else (metadata, index, config)."""
    if fn.startswith("__") and fn.endswith(".distcp"):
        return int(fn[2:].split("_")[0])
    m = re.match(r"__(\d+)\.metadata$", fn)    # DCP per-rank metadata
    if m:
        return int(m.group(1)) % sfmpi.NRANKS
    m = re.match(r"(\d+)_\d+\.distcp$", fn)   # paddle: R_ID.distcp
    if m:
        return int(m.group(1)) % sfmpi.NRANKS
    m = re.match(r"(pytorch_)?model-(\d+)-of-\d+\.", fn)
    if m:
        return (int(m.group(2)) - 1) % sfmpi.NRANKS
    return None


def split_dcp(src, dst_pattern, meta_rank, single_copy_rank=None):
    """Copy DCP checkpoint src into the stores dst_pattern % r: each
    rank's own .distcp, .metadata on meta_rank only (or everything on
    single_copy_rank)."""
    for fn in sorted(os.listdir(src)):
        if single_copy_rank is not None:
            ranks = [single_copy_rank]
        elif rank_of(fn) is None:
            ranks = [meta_rank]
        else:
            ranks = [rank_of(fn)]
        for r in ranks:
            d = sfmpi.expand(dst_pattern, r)
            os.makedirs(d, exist_ok=True)
            shutil.copy2(os.path.join(src, fn), os.path.join(d, fn))


def tree_digest(root):
    """Every entry under root: path, type, symlink target or content hash."""
    out = []
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for f in sorted(fns + dns):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out.append((rel, "l", os.readlink(p)))
            elif os.path.isdir(p):
                out.append((rel, "d", ""))
            else:
                with open(p, "rb") as fh:
                    out.append((rel, "f", hashlib.sha256(fh.read()).hexdigest()))
    return out


def check_tree(ck, root, exp, label):
    r = subprocess.run(["/usr/bin/python3", CHECKER, root, exp],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120)
    out = r.stdout.decode(errors="replace")
    ck.ok(r.returncode == 0, "%s: check_dcp_tree.py: %s" % (
        label, out.strip().splitlines()[-3:] if out.strip() else "exit %d" % r.returncode))


def check_erofs(ck, root, label):
    for fn, what in ((lambda: open(os.path.join(root, "new"), "wb"), "create"),
                     (lambda: os.unlink(os.path.join(root, "manifest.json")), "unlink")):
        try:
            f = fn()
            if hasattr(f, "close"):
                f.close()
            ck.ok(False, "%s: %s succeeded on a read-only checkpoint" % (label, what))
        except OSError as e:
            ck.eq(e.errno, errno.EROFS, "%s: %s fails with EROFS" % (label, what))


def part_store(env, ck):
    pattern = env.path("fstore%r")
    exps = {}
    for name, rel, meta_rank in SPLIT:
        split_dcp(os.path.join(FIX, rel), os.path.join(pattern, name), meta_rank)
        exps[name] = os.path.join(FIX, rel + ".expected.json")
    # every file of `single` on rank 3 only
    split_dcp(os.path.join(FIX, "dcp/torch-2.15/single"), os.path.join(pattern, "single"),
              None, single_copy_rank=3)
    exps["single"] = os.path.join(FIX, "dcp/torch-2.15/single.expected.json")
    for r in range(sfmpi.NRANKS):
        os.makedirs(sfmpi.expand(pattern, r), exist_ok=True)
    before = [tree_digest(sfmpi.expand(pattern, r)) for r in range(sfmpi.NRANKS)]
    with sfmpi.Cluster(env, pattern, name="fstore") as c:
        for r in range(sfmpi.NRANKS):
            names = sorted(os.listdir(c.mnt(r)))
            ck.eq(names, sorted(exps), "rank %d shows every checkpoint" % r)
            for name in sorted(exps):
                root = os.path.join(c.mnt(r), name)
                check_tree(ck, root, exps[name], "rank %d %s" % (r, name))
            check_erofs(ck, os.path.join(c.mnt(r), "rows4"), "rank %d rows4" % r)
    after = [tree_digest(sfmpi.expand(pattern, r)) for r in range(sfmpi.NRANKS)]
    ck.ok(before == after, "the stores are unchanged")


def part_single(env, ck):
    pattern = env.path("fsingle%r")
    split_dcp(os.path.join(FIX, "dcp/torch-2.15/rows4"), pattern, 1)
    exp = os.path.join(FIX, "dcp/torch-2.15/rows4.expected.json")
    with sfmpi.Cluster(env, pattern, name="fsingle") as c:
        for r in range(sfmpi.NRANKS):
            names = set(os.listdir(c.mnt(r)))
            ck.ok({"tensors", "manifest.json", "model.safetensors"} <= names,
                  "single rank %d: the mount root is the checkpoint (%s)" % (
                      r, sorted(names)))
            check_tree(ck, c.mnt(r), exp, "single rank %d" % r)


def part_symlink(env, ck):
    pattern = env.path("fsym%r")
    split_dcp(os.path.join(FIX, "dcp/torch-2.15/rows4"), os.path.join(pattern, "rows4"), 0)
    split_dcp(os.path.join(FIX, "dcp/torch-2.15/mesh2d"), os.path.join(pattern, "mesh2d"), 0)
    # rank 1's chunk file becomes a symlink to an identical copy outside
    outside = env.path("outside.distcp")
    victim = os.path.join(sfmpi.expand(pattern, 1), "rows4", "__1_0.distcp")
    shutil.copy2(victim, outside)
    os.unlink(victim)
    os.symlink(outside, victim)
    exp = os.path.join(FIX, "dcp/torch-2.15/mesh2d.expected.json")
    with sfmpi.Cluster(env, pattern, name="fsym") as c:
        for r in range(sfmpi.NRANKS):
            t = os.path.join(c.mnt(r), "rows4", "tensors")
            shown = set(os.listdir(t)) if os.path.isdir(t) else set()
            ck.ok("rows" not in shown and "cols" not in shown,
                  "rank %d: tensors with a chunk behind a symlink out are left "
                  "out (%s)" % (r, sorted(shown)))
            check_tree(ck, os.path.join(c.mnt(r), "mesh2d"), exp,
                       "rank %d mesh2d next to it" % r)
        log = c.log_text()
    ck.ok("__1_0.distcp" in log, "the log names the chunk file left out")


def part_swap(env, ck):
    """Issue 30 (1) under MPI: rank 1's checkpoint directory swapped, while
    mounted, for a symlink to a directory whose chunk file holds other
    bytes (every byte of the real one flipped): no daemon ever serves
    them; a read that needs rank 1's chunk gives the real bytes or EIO."""
    pattern = env.path("fswap%r")
    split_dcp(os.path.join(FIX, "dcp/torch-2.15/rows4"), os.path.join(pattern, "rows4"), 0)
    with open(os.path.join(FIX, "dcp/torch-2.15/rows4.expected.json")) as f:
        exp = json.load(f)["tensors"]
    outside = env.path("swap-outside")
    os.makedirs(outside)
    mine = os.path.join(sfmpi.expand(pattern, 1), "rows4")
    for fn in os.listdir(mine):
        with open(os.path.join(mine, fn), "rb") as f:
            b = f.read()
        with open(os.path.join(outside, fn), "wb") as f:
            f.write(bytes(x ^ 0xFF for x in b))
    with sfmpi.Cluster(env, pattern, name="fswap") as c:
        os.rename(mine, os.path.join(sfmpi.expand(pattern, 1), ".old-rows4"))
        os.symlink(outside, mine)
        bad = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            for r in range(sfmpi.NRANKS):
                for name in ("rows", "cols"):
                    p = os.path.join(c.mnt(r), "rows4", "tensors", name)
                    try:
                        with open(p, "rb") as f:
                            got = f.read()
                    except OSError as e:
                        if e.errno not in (errno.EIO, errno.ENOENT):
                            bad.append("rank %d %s: %s" % (r, name, e))
                        continue
                    if "%016x" % xxhash.xxh3_64_intdigest(got) != exp[name]["xxh3"]:
                        bad.append("rank %d %s: bytes that are not the checkpoint's" % (r, name))
            time.sleep(0.3)
        ck.eq(bad, [], "after a swap on rank 1 no daemon serves the swapped-in bytes")


def run(env, ck):
    part_store(env, ck)
    part_single(env, ck)
    part_symlink(env, ck)
    part_swap(env, ck)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
