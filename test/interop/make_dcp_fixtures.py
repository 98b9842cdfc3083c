"""make_dcp_fixtures - PyTorch DCP checkpoints written by a real torch.

    PYTHON make_dcp_fixtures.py OUTDIR

PYTHON is Debian's /usr/bin/python3 (torch 1.13: torch.distributed._shard.
checkpoint) or a venv with current torch (torch.distributed.checkpoint).
Writes OUTDIR/torch-X.Y/NAME/ (the checkpoint as torch wrote it) and
OUTDIR/torch-X.Y/NAME.expected.json beside each:

  {"torch": version,
   "tensors": {key: {"dtype", "shape", "nbytes", "xxh3"}},
   "objects": {key: {"repr": repr(value)}}}

computed from the ORIGINAL in-memory values (xxh3_64 of each tensor's
row-major bytes), never by reading the checkpoint back. Checkpoints:

  single  one process: every dtype, a 0-d and an empty tensor, a transposed
          view and a sliced view (storage offset) saved as they are,
          nested dicts and lists, non-tensor items
  rows4   4 gloo ranks: an uneven row split (1001 x 3) and a column split
          (5 x 6; torch 1.13 leaves rank 3 without a chunk)
  mesh2d  (torch 2.x) a 2x2 device mesh, [Shard(0), Shard(1)]

Values are seeded: a re-run writes the same tensors.
"""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

OLD = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 0)
if OLD:
    import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch.distributed as dist  # noqa: E402
import xxhash  # noqa: E402

VER = "torch-%s" % ".".join(torch.__version__.split("+")[0].split(".")[:2])
DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
      torch.bool: "BOOL"}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(t):
    b = tensor_bytes(t)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


def flat_items(sd):
    """The keys DCP stores and their values: torch 2.x flattens nested
    dicts, and lists that hold tensors, with '.'; torch 1.13 keeps each
    top-level item."""
    if OLD:
        return dict(sd)
    out = {}

    def has_tensor(v):
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, dict):
            return any(has_tensor(x) for x in v.values())
        if isinstance(v, list):
            return any(has_tensor(x) for x in v)
        return False

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk("%s.%s" % (prefix, k) if prefix else str(k), x)
        elif isinstance(v, list) and has_tensor(v):
            # torch flattens a list only when it holds tensors
            for i, x in enumerate(v):
                walk("%s.%d" % (prefix, i), x)
        else:
            out[prefix] = v
    walk("", sd)
    return out


def expect(path, items):
    exp = {"torch": torch.__version__, "tensors": {}, "objects": {}}
    for k, v in items.items():
        if isinstance(v, torch.Tensor):
            exp["tensors"][k] = describe(v)
        else:
            exp["objects"][k] = {"repr": repr(v)}
    with open(path + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def save_local(sd, path):
    if OLD:
        import torch.distributed._shard.checkpoint as dcp
        dcp.save_state_dict(sd, dcp.FileSystemWriter(path), no_dist=True)
    else:
        import torch.distributed.checkpoint as dcp
        dcp.save(sd, checkpoint_id=path)


def single_state():
    """The state dict `single` saves (seeded: the same values every call)."""
    g = torch.Generator().manual_seed(11)
    base = torch.randn(6, 5, generator=g)
    return {
        "model.embed.weight": torch.randn(16, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g).to(torch.float16),
        "model.head.weight": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "model.f64": torch.randn(3, 3, generator=g).to(torch.float64),
        "model.ids": torch.randint(-2**40, 2**40, (7,), generator=g),
        "model.i8": torch.randint(-128, 127, (2, 3, 4), generator=g).to(torch.int8),
        "model.mask": torch.randint(0, 2, (9,), generator=g).to(torch.bool),
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
        "transposed": base.t(),
        "sliced": base[2:5, 1:4],
        "step": 1234,
        "schedule": [1, 2, 3],
        "name": "run-7",
        "optim": {"lr": 0.5, "state": [torch.arange(4, dtype=torch.float32), 9]},
    }


def single(out):
    sd = single_state()
    path = os.path.join(out, "single")
    shutil.rmtree(path, ignore_errors=True)  # no stale files of an older run
    save_local(sd, path)
    expect(path, flat_items(sd))


def full_tensors():
    g = torch.Generator().manual_seed(5)
    return (torch.randn(1001, 3, generator=g),
            torch.arange(30, dtype=torch.float32).reshape(5, 6),
            torch.randn(6, 10, generator=g))


def worker(rank, world, initfile, path, kind):
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    rows, cols, grid = full_tensors()
    if OLD:
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec
        import torch.distributed._shard.checkpoint as dcp

        def shard(full, dim):
            spec = ChunkShardingSpec(dim=dim, placements=[
                "rank:%d/cpu" % r for r in range(world)])
            st = sharded_tensor.empty(spec, *full.shape)
            for s in st.local_shards():
                sl = tuple(slice(o, o + n) for o, n in
                           zip(s.metadata.shard_offsets, s.metadata.shard_sizes))
                s.tensor.copy_(full[sl])
            return st
        sd = {"rows": shard(rows, 0), "cols": shard(cols, 1), "step": 3}
        dcp.save_state_dict(sd, dcp.FileSystemWriter(path))
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.tensor import Shard, distribute_tensor
        except ImportError:
            from torch.distributed._tensor import Shard, distribute_tensor
        if kind == "rows4":
            mesh = init_device_mesh("cpu", (world,))
            sd = {"rows": distribute_tensor(rows, mesh, [Shard(0)]),
                  "cols": distribute_tensor(cols, mesh, [Shard(1)]), "step": 3}
        else:
            mesh = init_device_mesh("cpu", (2, 2))
            sd = {"grid": distribute_tensor(grid, mesh, [Shard(0), Shard(1)])}
        dcp.save(sd, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()


def multi(out, kind):
    import torch.multiprocessing as mp
    path = os.path.join(out, kind)
    shutil.rmtree(path, ignore_errors=True)  # no stale files of an older run
    tmp = tempfile.mkdtemp()
    try:
        mp.spawn(worker, args=(4, os.path.join(tmp, "init"), path, kind),
                 nprocs=4, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    expect(path, multi_items(kind))


def multi_items(kind):
    """The whole tensors and objects a multi-rank checkpoint holds, as
    its ranks were given them."""
    rows, cols, grid = full_tensors()
    if kind == "rows4":
        return {"rows": rows, "cols": cols, "step": 3}
    return {"grid": grid}


def main():
    out = os.path.join(sys.argv[1], VER)
    os.makedirs(out, exist_ok=True)
    single(out)
    multi(out, "rows4")
    if not OLD:
        multi(out, "mesh2d")
    print("wrote", out)


if __name__ == "__main__":
    main()
