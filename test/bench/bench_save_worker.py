"""bench_save_worker - one rank of a torch 1.13 DCP save of a given size
(Debian's python3-torch, gloo), or a one-process load, for bench_save.sh.

    python3 bench_save_worker.py save RANK WORLD INITFILE PATH MIB
    python3 bench_save_worker.py load PATH MIB

PATH with %r: rank r saves into PATH with %r replaced by r (its own
node's directory: the mount of daemon r, or store r) and makes that
directory before the clock starts (torch 1.13's writer makes it on the
coordinator only, which on node-local stores leaves the other ranks
without one; torch 2.x's makes it on every rank).

save: 8 F32 ShardedTensors of MIB MiB in all, split by rows over WORLD
ranks, saved with save_state_dict and the stock FileSystemWriter (which
fsyncs every file); rank 0 prints the seconds from the barrier before the
save to the barrier after it, and the wall clock (time.time()) then. load: load_state_dict (no_dist) of the same
tensors into whole ones; prints the seconds.
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

NT = 8
COLS = 1024


def rows_of(mib):
    return max(1, (mib << 20) // (NT * COLS * 4))


def save(rank, world, initfile, path, mib):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    if "%r" in path:
        path = path.replace("%r", str(rank))
        os.makedirs(path, exist_ok=True)
    spec = ChunkShardingSpec(dim=0, placements=["rank:%d/cpu" % r for r in range(world)])
    sd = {}
    for i in range(NT):
        st = sharded_tensor.empty(spec, rows_of(mib), COLS)
        for s in st.local_shards():
            s.tensor.fill_(float(i + 1))
        sd["w%d" % i] = st
    dist.barrier()
    t0 = time.monotonic()
    dcp.save_state_dict(sd, dcp.FileSystemWriter(path))
    dist.barrier()
    if rank == 0:   # seconds, and the wall clock when the save returned
        print("%.4f %.6f" % (time.monotonic() - t0, time.time()), flush=True)
    dist.destroy_process_group()


def load(path, mib):
    sd = {"w%d" % i: torch.zeros(rows_of(mib), COLS) for i in range(NT)}
    t0 = time.monotonic()
    dcp.load_state_dict(sd, dcp.FileSystemReader(path), no_dist=True)
    print("%.4f" % (time.monotonic() - t0), flush=True)
    bad = [k for i, k in enumerate(sorted(sd)) if float(sd[k][0, 0]) != float(int(k[1:]) + 1)]
    if bad:
        print("wrong values in", bad, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]))
    else:
        load(sys.argv[2], int(sys.argv[3]))
