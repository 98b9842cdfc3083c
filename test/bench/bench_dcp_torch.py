"""bench_dcp_torch - the torch side of bench_dcp.sh (Debian's torch 1.13).

    /usr/bin/python3 bench_dcp_torch.py write DIR MIB       # 4 gloo ranks
    /usr/bin/python3 bench_dcp_torch.py many DIR N          # one process, N tensors
    /usr/bin/python3 bench_dcp_torch.py consolidate DIR OUT # torch's own way
    /usr/bin/python3 bench_dcp_torch.py shardfs DIR MNT CKPT  # same tensors, shardfs/1

write: a DCP checkpoint as 4 ranks of a job save it: 4 F32 tensors of
about MIB/4 MiB each (rows 8192 scaled, 16384 columns at full size),
ShardedTensor split on dim 0 (wq, wk) and on dim 1 (wv, wo), every rank
holding its quarter (the shape the notes' peer figure was measured on).

many: N small F32 tensors (64 elements each) from one process: the
time-to-first-ls check.

consolidate: torch 1.13's way to one file: load_state_dict into whole
tensors in one process (no_dist), then torch.save. The figure to beat.

shardfs: the same tensors (read from the DCP checkpoint with torch's
loader, whole) written through a shardfs mount MNT as checkpoint CKPT in
4 row boxes each (tools/shardfs_save.py), committed: the shardfs/1
reference for the adapter's cost.
"""

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "test", "interop"))
sys.path.insert(0, os.path.join(TOP, "tools"))

import torch  # noqa: E402
import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch.distributed as dist  # noqa: E402

NAMES = (("wq", 0), ("wk", 0), ("wv", 1), ("wo", 1))
COLS = 16384


def rows_for(mib):
    # 4 tensors of rows x COLS F32 = mib MiB in all; rows divisible by 4
    rows = max(4, (mib * 1024 * 1024 // (4 * COLS * 4)) // 4 * 4)
    return rows


def worker(rank, world, initfile, path, rows):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    import torch.distributed._shard.checkpoint as dcp

    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    sd = {}
    for i, (name, dim) in enumerate(NAMES):
        spec = ChunkShardingSpec(dim=dim, placements=[
            "rank:%d/cpu" % r for r in range(world)])
        st = sharded_tensor.empty(spec, rows, COLS)
        for s in st.local_shards():
            g = torch.Generator().manual_seed(1000 * i + rank)
            s.tensor.copy_(torch.rand(s.tensor.shape, generator=g))
        sd[name] = st
    dcp.save_state_dict(sd, dcp.FileSystemWriter(path))
    dist.barrier()
    dist.destroy_process_group()


def write(path, mib):
    import torch.multiprocessing as mp
    shutil.rmtree(path, ignore_errors=True)
    tmp = tempfile.mkdtemp()
    try:
        mp.spawn(worker, args=(4, os.path.join(tmp, "init"), path, rows_for(mib)),
                 nprocs=4, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def many(path, n):
    import torch.distributed._shard.checkpoint as dcp
    shutil.rmtree(path, ignore_errors=True)
    sd = {"layers.%d.w" % i: torch.full((64,), float(i)) for i in range(n)}
    dcp.save_state_dict(sd, dcp.FileSystemWriter(path), no_dist=True)


def load_whole(path):
    """torch 1.13's loader into whole tensors, in one process."""
    import torch.distributed._shard.checkpoint as dcp
    reader = dcp.FileSystemReader(path)
    md = reader.read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items()}
    dcp.load_state_dict(sd, reader, no_dist=True)
    return sd


def consolidate(path, out):
    torch.save(load_whole(path), out)


def to_shardfs(path, mnt, ckpt):
    import shardfs_save as sfs
    sd = load_whole(path)
    shards = []
    for name, t in sd.items():
        rows = t.shape[0]
        q = rows // 4
        for r in range(4):
            shards.append(sfs.Shard(name, t[r * q:(r + 1) * q].contiguous(),
                                    shape=list(t.shape), offsets=[r * q, 0]))
    sfs.save(mnt, ckpt, shards, commit=True)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "write" and len(argv) == 4:
        write(argv[2], int(argv[3]))
    elif cmd == "many" and len(argv) == 4:
        many(argv[2], int(argv[3]))
    elif cmd == "consolidate" and len(argv) == 4:
        consolidate(argv[2], argv[3])
    elif cmd == "shardfs" and len(argv) == 5:
        to_shardfs(argv[2], argv[3], argv[4])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
