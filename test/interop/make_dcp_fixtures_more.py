#!/usr/bin/env python3
"""make_dcp_fixtures_more.py - (a second generator, kept for the zero-size
chunks and FSDP2 checkpoints it writes: test/fixtures/dcp/torch-2.15-more) write PyTorch distributed checkpoints (DCP) with
the real torch, for shardfs's foreign-format tests.

Usage: make_dcp_fixtures.py OUTDIR [--only NAME[,NAME...]]

Writes OUTDIR/torch-MAJOR.MINOR/NAME/ (a DCP checkpoint directory as torch
left it: .metadata and __R_N.distcp files) and, beside each,
OUTDIR/torch-MAJOR.MINOR/NAME.expected.json:

    {"torch": "2.15.0+cu132", "checkpoint": NAME,
     "tensors": {fqn: {"dtype": "F32", "shape": [..], "nbytes": N,
                       "xxh3": "<16 hex digits, xxh3_64 of the whole
                                tensor's contiguous row-major bytes>"}},
     "objects": {key: {"repr": repr(value)}}}

The expected values come from the ORIGINAL in-memory tensors (full tensors
built on every rank from the same seed, or gathered from the live DTensors
of the FSDP2 job), never from reading the checkpoint back. After each save
the script only compares torch's own key list (.metadata) with the expected
keys, so a wrong guess about torch's key naming fails here, loudly.

Runs with
  - torch 2.x (e.g. /work/venvs/torch2/bin/python): torch.distributed.
    checkpoint.save, DTensor (Shard(0) uneven, Shard(1), 2-D mesh), FSDP2 +
    AdamW state via get_state_dict;
  - Debian's torch 1.13 (/usr/bin/python3): torch.distributed._shard.
    checkpoint.save_state_dict, ShardedTensor with ChunkShardingSpec (the
    torch113 import hook next to this file makes it import on Python 3.11).
Multi-rank checkpoints come from 4 CPU processes (torch.multiprocessing.
spawn, gloo, init_method file://). Values are seeded numpy draws, so the
same checkpoint NAME holds the same tensor values in every torch version and
on every run (the files themselves differ from run to run: torch stores a
random save id and, in 2.x, the checkpoint's path).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np
import xxhash

import torch

TORCH_MM = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
IS_113 = TORCH_MM < (2, 0)
if IS_113:
    import torch113  # noqa: F401  (import hook, must come before _shard)

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


# ---------------------------------------------------------------- values

def rng(seed):
    return np.random.default_rng(seed)


def randn(seed, *shape, dtype=torch.float32):
    a = rng(seed).standard_normal(shape).astype(np.float32)
    return torch.from_numpy(a).to(dtype)


def randint(seed, lo, hi, *shape, dtype=torch.int64):
    a = rng(seed).integers(lo, hi, size=shape, dtype=np.int64)
    return torch.from_numpy(a).to(dtype)


def tensor_bytes(t):
    """Row-major contiguous bytes of t (little-endian host)."""
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def tensor_entry(t):
    b = tensor_bytes(t)
    return {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
            "nbytes": len(b), "xxh3": xxhash.xxh3_64_hexdigest(b)}


def write_expected(path, name, tensors, objects, extra=None):
    doc = {"torch": torch.__version__, "checkpoint": name,
           "tensors": {k: tensor_entry(v) for k, v in sorted(tensors.items())},
           "objects": {k: {"repr": repr(v)} for k, v in sorted(objects.items())}}
    if extra:
        doc.update(extra)
    # one line per tensor / object, so diffs of regenerated files read well
    lines = []
    for k in sorted(doc):
        v = doc[k]
        if k in ("tensors", "objects") and v:
            inner = ",\n".join("  %s: %s" % (json.dumps(n), json.dumps(
                e, sort_keys=True)) for n, e in v.items())
            lines.append(" %s: {\n%s\n }" % (json.dumps(k), inner))
        else:
            lines.append(" %s: %s" % (json.dumps(k), json.dumps(v)))
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    with open(path) as f:
        assert json.load(f) == json.loads(json.dumps(doc))


def saved_keys(ckpt_dir):
    """Keys torch recorded in ckpt_dir/.metadata (read with torch itself)."""
    if IS_113:
        from torch.distributed._shard.checkpoint import FileSystemReader
    else:
        from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(ckpt_dir).read_metadata()
    return set(md.state_dict_metadata.keys())


def check_keys(ckpt_dir, tensors, objects):
    got = saved_keys(ckpt_dir)
    want = set(tensors) | set(objects)
    if got != want:
        raise SystemExit("%s: torch saved keys %s, expected %s (missing %s, "
                         "extra %s)" % (ckpt_dir, sorted(got), sorted(want),
                                        sorted(want - got), sorted(got - want)))


def fresh_dir(d):
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)


# ----------------------------------------------------- one-process "single"

def single_state():
    """(state_dict to save, expected tensors, expected objects)."""
    base_t = randn(10, 4, 5)                  # transposed view, saved as is
    base_s = randn(11, 6, 5)                  # row slice: storage offset 10
    base_c = randn(12, 4, 6)                  # column slice: offset 1, strided
    t = {
        "f32": randn(1, 8, 5),
        "f16": randn(2, 3, 7, dtype=torch.float16),
        "bf16": randn(3, 6, 3, dtype=torch.bfloat16),
        "f64": randn(4, 5, dtype=torch.float64),
        "i64": randint(5, -2**40, 2**40, 9),
        "i8": randint(6, -128, 128, 4, 4, dtype=torch.int8),
        "bool": randint(7, 0, 2, 3, 5, dtype=torch.bool),
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "transposed": base_t.t(),
        "sliced_rows": base_s[2:5],
        "sliced_cols": base_c[:, 1:4],
    }
    assert not t["transposed"].is_contiguous()
    assert t["sliced_rows"].storage_offset() == 10
    assert not t["sliced_cols"].is_contiguous()
    assert t["sliced_cols"].storage_offset() == 1
    nested = {"a": randn(13, 2, 2), "b": {"c": randint(14, 0, 100, 3),
                                           "d": 5}}
    objs = {"step": 7, "lst": [1, 2.5, "x"], "name": "single-fixture",
            "tup": (3, "y")}
    sd = dict(t)
    sd["nested"] = nested
    sd.update(objs)
    exp_t = dict(t)
    exp_o = dict(objs)
    if IS_113:
        # 1.13 keeps a nested dict as one bytes item (a torch.save blob)
        exp_o["nested"] = nested
    else:
        # 2.x flattens mappings with '.'
        exp_t["nested.a"] = nested["a"]
        exp_t["nested.b.c"] = nested["b"]["c"]
        exp_o["nested.b.d"] = nested["b"]["d"]
    return sd, exp_t, exp_o


def save_one_process(sd, ckpt_dir):
    if IS_113:
        from torch.distributed._shard.checkpoint import (FileSystemWriter,
                                                          save_state_dict)
        save_state_dict(sd, FileSystemWriter(ckpt_dir), no_dist=True)
    else:
        import torch.distributed.checkpoint as dcp
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(ckpt_dir))


def make_single(root):
    d = os.path.join(root, "single")
    fresh_dir(d)
    sd, exp_t, exp_o = single_state()
    save_one_process(sd, d)
    check_keys(d, exp_t, exp_o)
    write_expected(d + ".expected.json", "single", exp_t, exp_o,
                   {"ranks": 1})
    return d


# ------------------------------------------------------ multi-rank (gloo)

def rows4_full():
    # 1001 rows over 4 ranks: 251/251/251/248 (uneven)
    return {"w": randn(20, 1001, 3), "wi": randint(21, -1000, 1000, 1001, 1,
                                                    dtype=torch.int32)}


def cols4_full():
    # 6 columns over 4 ranks: chunks of 2,2,2 and nothing on rank 3
    return {"w": randn(30, 5, 6), "h": randn(31, 3, 6, dtype=torch.float16)}


def mesh_full():
    return {"w": randn(40, 9, 7), "bf": randn(41, 5, 3, dtype=torch.bfloat16)}


REPLICATED_SEED = 50
COMMON_OBJS = {"step": 100, "lr": 0.125}


def multi_jobs_2x(rank, root):
    """All 2.x multi-rank checkpoints; every rank runs this."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import Shard, distribute_tensor
    except ImportError:  # torch < 2.4
        from torch.distributed._tensor import Shard, distribute_tensor

    mesh1 = init_device_mesh("cpu", (WORLD,))
    mesh2 = init_device_mesh("cpu", (2, 2))
    plans = [
        ("rows4", rows4_full(), mesh1, [Shard(0)]),
        ("cols4", cols4_full(), mesh1, [Shard(1)]),
        ("mesh2x2", mesh_full(), mesh2, [Shard(0), Shard(1)]),
    ]
    done = []
    for name, full, mesh, placements in plans:
        d = os.path.join(root, name)
        if rank == 0:
            fresh_dir(d)
        dist.barrier()
        sd = {k: distribute_tensor(v, mesh, placements)
              for k, v in full.items()}
        rep = randn(REPLICATED_SEED, 4)  # a plain tensor on every rank
        sd["replicated"] = rep
        sd.update(COMMON_OBJS)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))
        dist.barrier()
        if rank == 0:
            exp_t = dict(full)
            exp_t["replicated"] = rep
            check_keys(d, exp_t, COMMON_OBJS)
            write_expected(d + ".expected.json", name, exp_t, COMMON_OBJS, {
                "ranks": WORLD,
                "placements": [repr(p) for p in placements],
                "mesh": list(mesh.mesh.shape)})
        done.append(d)
    fsdp = fsdp2_job(rank, root)
    if fsdp:
        done.append(fsdp)
    return done


def fsdp2_job(rank, root):
    """FSDP2 (fully_shard) model + AdamW after one step, saved through
    get_state_dict. Returns the directory, or None where torch lacks it."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        from torch.distributed._tensor import DTensor

    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(),
                                torch.nn.Linear(7, 3))
    with torch.no_grad():  # seeded values independent of torch's RNG
        for i, p in enumerate(model.parameters()):
            p.copy_(randn(60 + i, *p.shape))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = randn(70, 4, 5)
    model(x).square().sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    flat, _ = flatten_state_dict(sd)
    exp_t, exp_o = {}, {}
    for k, v in flat.items():  # same order on every rank: collectives
        if isinstance(v, DTensor):
            exp_t[k] = v.full_tensor()
        elif isinstance(v, torch.Tensor):
            exp_t[k] = v
        else:
            exp_o[k] = v
    d = os.path.join(root, "fsdp2_adamw")
    if rank == 0:
        fresh_dir(d)
    dist.barrier()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))
    dist.barrier()
    if rank == 0:
        check_keys(d, exp_t, exp_o)
        write_expected(d + ".expected.json", "fsdp2_adamw", exp_t, exp_o, {
            "ranks": WORLD, "placements": ["Shard(dim=0)"], "mesh": [WORLD]})
    return d


def multi_jobs_113(rank, root):
    """1.13 multi-rank checkpoints (ShardedTensor, ChunkShardingSpec)."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.checkpoint import (FileSystemWriter,
                                                      save_state_dict)
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    placements = ["rank:%d/cpu" % r for r in range(WORLD)]
    plans = [("rows4", rows4_full(), 0), ("cols4", cols4_full(), 1)]
    done = []
    for name, full, dim in plans:
        d = os.path.join(root, name)
        if rank == 0:
            fresh_dir(d)
        dist.barrier()
        spec = ChunkShardingSpec(dim=dim, placements=placements)
        sd = {}
        for k, v in full.items():
            st = sharded_tensor.empty(spec, *v.shape, dtype=v.dtype)
            for sh in st.local_shards():
                off = sh.metadata.shard_offsets
                sz = sh.metadata.shard_sizes
                idx = tuple(slice(o, o + s) for o, s in zip(off, sz))
                sh.tensor.copy_(v[idx])
            sd[k] = st
        rep = randn(REPLICATED_SEED, 4)
        sd["replicated"] = rep
        sd.update(COMMON_OBJS)
        save_state_dict(sd, FileSystemWriter(d))
        dist.barrier()
        if rank == 0:
            exp_t = dict(full)
            exp_t["replicated"] = rep
            check_keys(d, exp_t, COMMON_OBJS)
            write_expected(d + ".expected.json", name, exp_t, COMMON_OBJS, {
                "ranks": WORLD,
                "placements": ["ChunkShardingSpec(dim=%d)" % dim]})
        done.append(d)
    return done


def _worker(rank, root, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=WORLD)
    try:
        if IS_113:
            multi_jobs_113(rank, root)
        else:
            multi_jobs_2x(rank, root)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_multi(root):
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        mp.spawn(_worker, args=(root, init_file), nprocs=WORLD, join=True)


# ------------------------------------------------------------------ main

def version_dir(outdir):
    return os.path.join(outdir, "torch-%d.%d" % TORCH_MM)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--only", default="single,multi",
                    help="comma list of: single, multi")
    a = ap.parse_args()
    root = version_dir(a.outdir)
    os.makedirs(root, exist_ok=True)
    parts = set(a.only.split(","))
    if "single" in parts:
        make_single(root)
    if "multi" in parts:
        make_multi(root)
    print("wrote %s (torch %s)" % (root, torch.__version__))


if __name__ == "__main__":
    main()
