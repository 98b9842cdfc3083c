"""dcp_save_worker - one rank of a torch 1.13 DCP save (Debian's
python3-torch, gloo) into a directory, for test_save.py.

    python3 dcp_save_worker.py save RANK WORLD INITFILE PATH [STALL]
    python3 dcp_save_worker.py load PATH OUT.npz

save: ShardedTensors split over WORLD ranks (rows by dim 0, cols by dim
1) and a plain tensor and an int, saved with save_state_dict and the
stock FileSystemWriter (SF_SAVE_BIG_MIB=N in the environment: a plain
N MiB tensor "big" too, so one rank's file spans several 4 MiB blocks). STALL (a rank number): that rank stops before
writing its data (the test kills it there; SF_SAVE_STALL_AFTER=1: right
after its data files were written and closed). load: load_state_dict
(no_dist) into whole tensors, written to OUT as .npy files.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))

import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402


def full_tensors(seed=5):
    g = torch.Generator().manual_seed(seed)
    return {"rows": torch.randn(1024, 96, generator=g),
            "cols": torch.arange(40 * 64, dtype=torch.float32).reshape(40, 64),
            "bias": torch.randn(33, generator=g).to(torch.bfloat16)}


def big_tensor(mib, seed):
    """A plain tensor of mib MiB (one rank's file holds it: several blocks)."""
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(mib << 18, generator=g)


def save(rank, world, initfile, path, stall, seed, big_mib=0):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    full = full_tensors(seed)

    def shard(t, dim):
        spec = ChunkShardingSpec(dim=dim, placements=[
            "rank:%d/cpu" % r for r in range(world)])
        st = sharded_tensor.empty(spec, *t.shape)
        for s in st.local_shards():
            sl = tuple(slice(o, o + n) for o, n in
                       zip(s.metadata.shard_offsets, s.metadata.shard_sizes))
            s.tensor.copy_(t[sl])
        return st

    sd = {"rows": shard(full["rows"], 0), "cols": shard(full["cols"], 1),
          "bias": full["bias"], "step": 7}
    if big_mib:
        sd["big"] = big_tensor(big_mib, seed)

    after = os.environ.get("SF_SAVE_STALL_AFTER") == "1"

    class Writer(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            if stall == rank and not after:
                print("stalled", flush=True)
                time.sleep(3600)
            fut = super().write_data(plan, planner)
            if stall == rank:  # after: its files written and closed
                fut.wait()
                print("stalled", flush=True)
                time.sleep(3600)
            return fut

    dcp.save_state_dict(sd, Writer(path))
    dist.barrier()
    dist.destroy_process_group()


def load(path, out):
    import numpy as np
    full = full_tensors()
    sd = {k: torch.zeros_like(v) for k, v in full.items()}
    dcp.load_state_dict(sd, dcp.FileSystemReader(path), no_dist=True)
    os.makedirs(out, exist_ok=True)
    for k, v in sd.items():
        if v.dtype == torch.bfloat16:
            v = v.view(torch.int16)
        np.save(os.path.join(out, k + ".npy"), v.numpy())


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
             int(sys.argv[6]) if len(sys.argv) > 6 else -1,
             int(sys.argv[7]) if len(sys.argv) > 7 else 5,
             int(os.environ.get("SF_SAVE_BIG_MIB", "0")))
    else:
        load(sys.argv[2], sys.argv[3])
