#!/usr/bin/env python3
"""make_dcp_fixtures_ext.py - DCP checkpoints in torch 2.x's two optional
layouts, written by the real torch (test/fixtures/dcp/torch-2.15-ext):

  perrank4       4 gloo ranks, dcp.save(..., use_collectives=False): no
                 .metadata; each rank writes __R.metadata with only its own
                 chunks (and its own copy of every replicated item)
  zstd           one process, FileSystemWriter(_extensions=[ZStandard()]):
                 every item (tensors and byte items) stored zstd-compressed,
                 named in _StorageInfo.transform_descriptors
  perrank2_zstd  both at once: 2 gloo ranks, per-rank metadata, zstd chunks

Usage: PYTHON make_dcp_fixtures_ext.py OUTDIR

PYTHON is a venv with torch 2.x, numpy, xxhash and the zstandard package
(/work/venvs/torch2). Writes OUTDIR/torch-MAJOR.MINOR/NAME/ and
NAME.expected.json beside it, in the shape make_dcp_fixtures_more.py
writes (its helpers are reused): the expected values come from the
ORIGINAL in-memory tensors (seeded numpy draws, built whole on every rank),
never from reading the checkpoint back. After each save the script checks
torch's own key list (the union of the per-rank files' keys) against the
expected keys, and that the files are what the name says (no .metadata
for per-rank; transform_descriptors on every item for zstd).
"""

import os
import pickle
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_dcp_fixtures_more as mk  # noqa: E402  (torch, numpy, xxhash)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

if mk.IS_113:
    raise SystemExit("needs torch 2.x (per-rank metadata and extensions)")

OBJS = {"step": 100, "lr": 0.125, "sched": [1, 2, 3]}


def rank_metadata(d):
    """{rank: Metadata} of the __R.metadata files in d."""
    out = {}
    for fn in os.listdir(d):
        if fn.startswith("__") and fn.endswith(".metadata"):
            with open(os.path.join(d, fn), "rb") as f:
                out[int(fn[2:-len(".metadata")])] = pickle.load(f)
    return out


def check_files(d, tensors, objects, per_rank, world, zstd):
    names = set(os.listdir(d))
    mds = rank_metadata(d)
    if per_rank:
        assert ".metadata" not in names, "%s: a global .metadata" % d
        assert sorted(mds) == list(range(world)), "%s: ranks %s" % (d, sorted(mds))
    else:
        assert ".metadata" in names and not mds, "%s: files %s" % (d, names)
        with open(os.path.join(d, ".metadata"), "rb") as f:
            mds = {0: pickle.load(f)}
    got = set()
    for md in mds.values():
        got |= set(md.state_dict_metadata)
        for idx, info in md.storage_data.items():
            td = getattr(info, "transform_descriptors", None)
            assert bool(td) == zstd, "%s: %s transforms %r" % (d, idx.fqn, td)
            if zstd:
                assert list(td) == ["stream.zstd/1"], td
    want = set(tensors) | set(objects)
    if got != want:
        raise SystemExit("%s: torch saved keys %s, expected %s"
                         % (d, sorted(got), sorted(want)))


# ------------------------------------------------------------ zstd, 1 process

def zstd_state():
    base_t = mk.randn(60, 4, 5)
    t = {
        "f32": mk.randn(61, 8, 5),
        "f16": mk.randn(62, 3, 7, dtype=torch.float16),
        "bf16": mk.randn(63, 6, 3, dtype=torch.bfloat16),
        "i64": mk.randint(64, -2**40, 2**40, 9),
        "bool": mk.randint(65, 0, 2, 3, 5, dtype=torch.bool),
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "transposed": base_t.t(),
        # compresses well: 64 KiB stored in a few hundred bytes
        "ramp": torch.arange(128 * 128, dtype=torch.float32).reshape(128, 128) % 7,
    }
    assert not t["transposed"].is_contiguous()
    return t, dict(OBJS)


def make_zstd(root):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    d = os.path.join(root, "zstd")
    mk.fresh_dir(d)
    t, o = zstd_state()
    sd = dict(t)
    sd.update(o)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d, _extensions=[ZStandard()]),
             no_dist=True)
    check_files(d, t, o, per_rank=False, world=1, zstd=True)
    mk.write_expected(d + ".expected.json", "zstd", t, o,
                      {"ranks": 1, "transforms": ["stream.zstd/1"]})


# ------------------------------------------------ per-rank metadata (gloo)

def perrank_full(world):
    if world == 4:
        # rows 10 over 4 ranks: 3/3/3/1; cols 6 over 4: 2/2/2/0
        return {"rows": mk.randn(70, 10, 3),
                "cols": mk.randn(71, 4, 6, dtype=torch.float16)}
    return {"rows": mk.randn(72, 7, 5), "cols": mk.randn(73, 3, 4)}


def perrank_job(rank, world, root, name, zstd):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    d = os.path.join(root, name)
    if rank == 0:
        mk.fresh_dir(d)
    dist.barrier()
    mesh = init_device_mesh("cpu", (world,))
    full = perrank_full(world)
    sd = {"rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
          "cols": distribute_tensor(full["cols"], mesh, [Shard(1)])}
    rep = mk.randn(74, 4)  # a plain tensor: every rank writes its copy
    sd["replicated"] = rep
    sd.update(OBJS)
    ext = [ZStandard()] if zstd else None
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(d, _extensions=ext),
             use_collectives=False)
    dist.barrier()
    if rank == 0:
        exp_t = dict(full)
        exp_t["replicated"] = rep
        check_files(d, exp_t, OBJS, per_rank=True, world=world, zstd=zstd)
        extra = {"ranks": world, "placements": ["Shard(dim=0)", "Shard(dim=1)"],
                 "use_collectives": False}
        if zstd:
            extra["transforms"] = ["stream.zstd/1"]
        mk.write_expected(d + ".expected.json", name, exp_t, OBJS, extra)


def _worker(rank, world, root, init_file, name, zstd):
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=world)
    try:
        perrank_job(rank, world, root, name, zstd)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_perrank(root, world, name, zstd):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, root, os.path.join(tmp, "pg"), name, zstd),
                 nprocs=world, join=True)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    root = mk.version_dir(sys.argv[1])
    os.makedirs(root, exist_ok=True)
    make_zstd(root)
    make_perrank(root, 4, "perrank4", False)
    make_perrank(root, 2, "perrank2_zstd", True)
    print("wrote %s (torch %s)" % (root, torch.__version__))


if __name__ == "__main__":
    main()
