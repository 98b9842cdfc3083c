"""make_dtensor_fixtures - per-rank torch.save pickles of DTensor state
dicts, as verl (model_world_size_W_rank_R.pt) and FSDP2 (+ tensor
parallel) users save them, written by a real torch on CPU (gloo).

    PY make_dtensor_fixtures.py OUTDIR [NAME...]

Writes OUTDIR/torch-X.Y/NAME/model_world_size_W_rank_R.pt for

  w2   a 1-D mesh of 2 ranks: Shard(0) over 7 rows (4 + 3), Shard(0) of
       one row (1 + an empty chunk), Shard(1) bf16 of 5 columns (3 + 2),
       Replicate, a plain tensor equal on both ranks, a plain tensor that
       differs per rank, and non-tensor entries (an int, a string)
  w4   a 2-D mesh 2x2 ("dp", "tp"): a two-layer MLP parallelized with
       tensor parallel (colwise, rowwise) on "tp" then fully_shard (FSDP2)
       on "dp", its state dict (what FSDP2 + TP gives: _StridedShard on
       "dp" where FSDP shards the TP-sharded dimension again), plus
       distribute_tensor with [Shard(0), Shard(1)] (bf16, uneven),
       [Replicate(), Shard(0)] and [_StridedShard(0, split_factor=2),
       Shard(0)] (f32; torch distributes a _StridedShard evenly only)

  fsdp1-sharded  FSDP1 (FullyShardedDataParallel) over a two-layer MLP of
       odd sizes, its SHARDED_STATE_DICT (ShardedTensors: each rank's
       chunk of every parameter, offsets and sizes in their metadata);
       reference: the FULL_STATE_DICT of the same model
  fsdp1-local    the same model's LOCAL_STATE_DICT (`_flat_param`, a 1-D
       ShardedTensor of each rank's padded flat parameter); reference: the
       ranks' local flat parameters, all-gathered and concatenated

and beside each NAME/ the reference NAME.safetensors: every DTensor's
full_tensor() and every plain tensor (rank 0's), by key, plus NAME.json
({"torch", "world", "mesh", "differs": the plain keys that differ per
rank}). Seeded: a re-run writes the same values. Launches torchrun itself
(one CPU process per rank); run with a python whose torch is 2.x.
"""

import json
import os
import subprocess
import sys

HERE = os.path.abspath(__file__)


def launch(out, only):
    import torch
    ver = ".".join(torch.__version__.split(".")[:2])
    root = os.path.join(out, "torch-" + ver)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    for name, world in (("w2", 2), ("w4", 4), ("fsdp1-sharded", 2),
                        ("fsdp1-local", 2)):
        if only and name not in only:
            continue
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(world),
                        HERE, "--rank", d, name], check=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    print("wrote", root)


def save(d, sd, world, r, mesh_shape, differs, full=None):
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from safetensors.torch import save_file
    torch.save(sd, os.path.join(d, "model_world_size_%d_rank_%d.pt" % (world, r)))
    ref = full
    full = {}
    for k, v in (ref or sd).items():
        if ref is not None:
            full[k] = v.contiguous()
        elif isinstance(v, DTensor):
            full[k] = v.full_tensor().contiguous()
        elif isinstance(v, torch.Tensor):
            full[k] = v.contiguous()
    if r == 0:
        save_file(full, d + ".safetensors")
        with open(d + ".json", "w") as f:
            json.dump({"torch": torch.__version__, "world": world,
                       "mesh": mesh_shape, "differs": differs}, f, indent=1)
    dist.barrier()


def rank_main(d, name):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    from torch.distributed.tensor.placement_types import _StridedShard
    dist.init_process_group("gloo")
    r = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    if name.startswith("fsdp1"):
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import StateDictType
        model = FSDP(nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)),
                     device_id=torch.device("cpu"))
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            whole = {k: v.clone() for k, v in model.state_dict().items()}
        if name == "fsdp1-sharded":
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                sd = model.state_dict()
            full = whole
        else:
            with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
                sd = model.state_dict()
            full = {}
            for k, v in sd.items():
                if hasattr(v, "local_shards"):
                    loc = v.local_shards()[0].tensor.contiguous()
                    parts = [torch.empty_like(loc) for _ in range(world)]
                    dist.all_gather(parts, loc)
                    full[k] = torch.cat(parts)
        save(d, sd, world, r, [world], [], full)
    elif name == "w2":
        mesh = init_device_mesh("cpu", (2,))
        sd = {
            "rows7": distribute_tensor(rnd(7, 3), mesh, [Shard(0)]),
            "row1": distribute_tensor(rnd(1, 4), mesh, [Shard(0)]),
            "cols5.bf16": distribute_tensor(rnd(4, 5, dtype=torch.bfloat16), mesh,
                                            [Shard(1)]),
            "rep": distribute_tensor(rnd(3), mesh, [Replicate()]),
            "plain.same": torch.arange(6, dtype=torch.int64),
            "plain.rank": torch.full((2,), float(r)),
            "step": 7,
            "note": "verl-like",
        }
        save(d, sd, world, r, [2], ["plain.rank"])
    else:
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 6))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(),
                                              "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        sd = {"mlp." + k: v for k, v in model.state_dict().items()}
        sd["ss.bf16"] = distribute_tensor(rnd(5, 7, dtype=torch.bfloat16), mesh,
                                          [Shard(0), Shard(1)])
        sd["rep_s0"] = distribute_tensor(rnd(9, 2), mesh, [Replicate(), Shard(0)])
        sd["strided"] = distribute_tensor(rnd(8, 3), mesh,
                                          [_StridedShard(0, split_factor=2), Shard(0)])
        sd["step"] = 3
        save(d, sd, world, r, [2, 2], [])
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 2:
        launch(sys.argv[1], sys.argv[2:])
    else:
        sys.exit(__doc__)
