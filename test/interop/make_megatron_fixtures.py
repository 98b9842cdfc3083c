"""make_megatron_fixtures - Megatron-Core torch_dist checkpoints written by
a real megatron-core, on CPU, from 2 gloo processes.

    PYTHON make_megatron_fixtures.py OUTDIR [--only NAME]

PYTHON is a venv with torch 2.x and megatron-core (/work/venvs/torch2:
megatron-core 0.16.1; a venv with megatron-core 0.15.x for `distopt`, see
test/fixtures/megatron/README.md). Writes OUTDIR/mcore-X.Y.Z/NAME/ (the
checkpoint as `dist_checkpointing.save` wrote it, torch_dist strategy) and
OUTDIR/mcore-X.Y.Z/NAME.expected.json beside it, in the shape
test/interop/check_dcp_tree.py reads:

  {"megatron_core": version, "torch": version,
   "tensors": {key: {"dtype", "shape", "nbytes", "xxh3"}},
   "objects": {key: {"repr": repr(value)}},
   "common": repr(common.pt's dict),
   "format": user.shardfs.format, or null for a checkpoint not shown}

computed from the GLOBAL tensors the ranks' shards were cut from (xxh3_64
of their row-major bytes), never by reading the checkpoint back. After
writing, every rank loads the checkpoint back with megatron's own
`dist_checkpointing.load` and compares it with what it saved (the script
fails on any difference). Checkpoints:

  gpt_tp2  a GPT-style model's sharded state dict, tensor parallel over 2
           ranks: vocab-parallel embedding and output layer, stacked layers
           (prepend_axis_num=1: the layer axis is part of the global shape)
           column- and row-parallel, replicated layer norms, F32, BF16 and
           F16, one ShardedObject per rank, and common (non-sharded) state
  distopt  (megatron-core with flattened_range support: 0.15.x and older)
           4 gloo ranks, TP 2 x DP 2: the model's BF16 weights as plain
           sharded tensors, and the distributed optimizer's F32 exp_avg and
           exp_avg_sq as flattened ranges (ShardedTensor.from_rank_offsets_flat
           as the distributed optimizer makes them): each DP rank holds a flat
           range of every parameter's local TP shard, cut unevenly (some
           cuts leave one DP rank without a piece). megatron-core stores them
           reformulated (blocks x flat) and records the real global shape in
           .metadata's mcore_data
  zarr_tp2 (megatron-core 0.15.x with the zarr package) one small tensor
           saved with the zarr backend, which shardfs does not read: its
           expected.json says what it holds, the mount test that it is
           refused with one log line

megatron-core on a CPU-only machine: `dist_checkpointing.save` calls
torch.cuda.synchronize() and torch.cuda.current_device(); both are
replaced here (the files do not depend on them). Values are seeded.
"""

import io
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import xxhash

if not torch.cuda.is_available():
    # megatron-core 0.15's import compiles a CUDA extension and fails with
    # IndexError when no CUDA architecture is known (0.16 does not); with
    # one named, the compile fails the way it catches
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0")
if not hasattr(np, "product"):
    np.product = np.prod  # megatron-core 0.15's validation, on numpy 2
import megatron.core as mcore  # noqa: E402
from megatron.core import dist_checkpointing as dcp  # noqa: E402
from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor  # noqa: E402

MCORE = getattr(mcore, "__version__", None)
if MCORE is None:
    from importlib.metadata import version
    MCORE = version("megatron-core")
VER = "mcore-%s" % MCORE
DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64"}
TP = 2          # gpt_tp2: tensor-parallel ranks
DP = 2          # distopt: data-parallel ranks
LAYERS = 3
HIDDEN = 16
FFN = 48        # qkv rows (3 * HIDDEN)
VOCAB = 32


def cpu_only():
    """What dist_checkpointing.save needs from torch.cuda on a CPU box."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(t):
    b = tensor_bytes(t)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


# --- gpt_tp2 ---

def gpt_globals():
    """The global tensors of gpt_tp2 (seeded): key -> (tensor, split axis
    or None for replicated, prepend_axis_num)."""
    g = torch.Generator().manual_seed(13)

    def r(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=g).to(dt)
    L = "decoder.layers."
    return {
        "embedding.word_embeddings.weight": (r(VOCAB, HIDDEN), 0, 0),
        L + "self_attention.linear_qkv.weight": (r(LAYERS, FFN, HIDDEN), 1, 1),
        L + "self_attention.linear_qkv.bias": (r(LAYERS, FFN, dt=torch.bfloat16), 1, 1),
        L + "self_attention.linear_proj.weight": (r(LAYERS, HIDDEN, FFN, dt=torch.bfloat16), 2, 1),
        L + "input_layernorm.weight": (r(LAYERS, HIDDEN), None, 1),
        L + "mlp.linear_fc1.weight": (r(LAYERS, 2 * FFN, HIDDEN, dt=torch.float16), 1, 1),
        "decoder.final_layernorm.weight": (r(HIDDEN, dt=torch.bfloat16), None, 0),
        "output_layer.weight": (r(VOCAB, HIDDEN, dt=torch.bfloat16), 0, 0),
    }


def gpt_objects():
    """ShardedObject values per TP rank, and the common state."""
    objs = {r: {"seed": 1234 + r, "tp_rank": r, "state": list(range(r, r + 5))}
            for r in range(TP)}
    common = {"iteration": 7, "args": {"hidden_size": HIDDEN, "layers": LAYERS},
              "checkpoint_version": 3.0}
    return objs, common


def gpt_sharded(rank, fill=True):
    """The sharded state dict rank gives dist_checkpointing.save (or, with
    fill=False, the same structure with zeroed tensors for load)."""
    sd = {}
    for key, (full, axis, prepend) in gpt_globals().items():
        if prepend:
            # one ShardedTensor per layer, as Megatron's layer modules
            # make them: the layer axis is a prepended axis
            per_layer = []
            for layer in range(full.shape[0]):
                x = full[layer]
                if axis is not None:
                    x = torch.chunk(x, TP, dim=axis - 1)[rank]
                x = x.clone() if fill else torch.zeros_like(x)
                offs = [(0, layer, full.shape[0])]
                if axis is not None:
                    offs.append((axis, rank, TP))
                rid = 0 if axis is not None else (0, rank, 0)
                per_layer.append(ShardedTensor.from_rank_offsets(
                    key, x, *offs, replica_id=rid, prepend_axis_num=1))
            sd[key] = per_layer
        else:
            x = full if axis is None else torch.chunk(full, TP, dim=axis)[rank]
            x = x.clone() if fill else torch.zeros_like(x)
            offs = [] if axis is None else [(axis, rank, TP)]
            rid = 0 if axis is not None else (0, rank, 0)
            sd[key] = ShardedTensor.from_rank_offsets(key, x, *offs, replica_id=rid)
    objs, common = gpt_objects()
    sd["rng_state"] = ShardedObject("rng_state", objs[rank] if fill else None,
                                    (TP,), (rank,), replica_id=0)
    if fill:
        sd.update(common)
    return sd


def gpt_expected():
    tensors = {k: describe(v[0]) for k, v in gpt_globals().items()}
    objs, common = gpt_objects()
    # megatron stores a ShardedObject as torch.save of the list of the
    # rank's objects with that key: here one each
    objects = {"rng_state/shard_%d_%d" % (r, TP): {"repr": repr([objs[r]])}
               for r in range(TP)}
    return tensors, objects, common


def compare_loaded(rank, key, got, want):
    if isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            compare_loaded(rank, "%s[%d]" % (key, i), g, w)
        return
    if isinstance(want, ShardedTensor):
        want = want.data
    if isinstance(want, ShardedObject):
        want = want.data
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and \
            got.shape == want.shape and tensor_bytes(got) == tensor_bytes(want)
    else:
        ok = got == want
    if not ok:
        raise SystemExit("rank %d: megatron's load of %s differs from what was saved"
                         % (rank, key))


def gpt_worker(rank, world, initfile, path):
    cpu_only()
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    sd = gpt_sharded(rank)
    dcp.save(sd, path)
    dist.barrier()
    # megatron's own load, compared with what this rank saved
    loaded = dcp.load(gpt_sharded(rank, fill=False), path)
    for key, want in gpt_sharded(rank).items():
        compare_loaded(rank, key, loaded[key], want)
    dist.barrier()
    dist.destroy_process_group()


# --- distopt ---

def distopt_params():
    """The parameters of distopt (seeded): key -> (global shape, TP split
    axis or None for replicated, prepend_axis_num, the DP cut of each
    layer's (or the whole) local TP shard: DP rank 0 holds its flattened
    elements [0, cut), DP rank 1 [cut, numel)). Cuts are uneven, as the
    distributed optimizer's contiguous buffer splits them; a cut at 0 or
    numel leaves one DP rank without that piece."""
    L = "decoder.layers."
    return {
        "embedding.word_embeddings.weight": ((VOCAB, HIDDEN), 0, 0, [100]),
        L + "self_attention.linear_qkv.weight": ((LAYERS, FFN, HIDDEN), 1, 1, [384, 0, 5]),
        L + "input_layernorm.weight": ((LAYERS, HIDDEN), None, 1, [16, 7, 0]),
        "decoder.final_layernorm.weight": ((HIDDEN,), None, 0, [9]),
        "output_layer.bias": ((VOCAB,), 0, 0, [3]),
    }


def distopt_globals():
    """Global tensors: the model's BF16 weights (saved as plain sharded
    tensors) and the optimizer's F32 exp_avg and exp_avg_sq (saved as
    flattened ranges), seeded."""
    g = torch.Generator().manual_seed(17)
    out = {}
    for key, (shape, _, _, _) in distopt_params().items():
        out[key] = torch.randn(*shape, generator=g).to(torch.bfloat16)
        out["optimizer.state.exp_avg." + key] = torch.randn(*shape, generator=g)
        out["optimizer.state.exp_avg_sq." + key] = torch.rand(*shape, generator=g)
    return out


def distopt_sharded(rank, fill=True):
    tp, dp = rank % TP, rank // TP
    glob = distopt_globals()
    sd = {}
    for key, (shape, axis, prepend, cuts) in distopt_params().items():
        for name in (key, "optimizer.state.exp_avg." + key,
                     "optimizer.state.exp_avg_sq." + key):
            flat = name != key
            full = glob[name]
            layers = range(shape[0]) if prepend else [None]
            items = []
            for layer in layers:
                x = full if layer is None else full[layer]
                if axis is not None:
                    x = torch.chunk(x, TP, dim=axis - prepend)[tp]
                offs = [] if layer is None else [(0, layer, shape[0])]
                if axis is not None:
                    offs.append((axis, tp, TP))
                # replicated over TP: only TP rank 0's copy is saved
                rid = (0, 0 if axis is not None else tp, 0)
                if not flat:
                    if dp:
                        continue  # the model weights: DP rank 0 saves them
                    x = x.clone() if fill else torch.zeros_like(x)
                    items.append(ShardedTensor.from_rank_offsets(
                        name, x, *offs, replica_id=rid, prepend_axis_num=prepend))
                    continue
                cut = cuts[0 if layer is None else layer]
                lo, hi = (0, cut) if dp == 0 else (cut, x.numel())
                if lo == hi:
                    continue  # this DP rank holds nothing of it
                part = x.reshape(-1)[lo:hi]
                part = part.clone() if fill else torch.zeros_like(part)
                items.append(ShardedTensor.from_rank_offsets_flat(
                    name, part, tuple(x.shape), *offs, replica_id=rid,
                    prepend_axis_num=prepend, flattened_range=slice(lo, hi)))
            if items:
                sd[name] = items if prepend else items[0]
    if fill:
        sd["optimizer.param_groups"] = [{"lr": 3e-4, "betas": (0.9, 0.95), "step": 5}]
    return sd


def distopt_worker(rank, world, initfile, path):
    cpu_only()
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    dcp.save(distopt_sharded(rank), path)
    dist.barrier()
    loaded = dcp.load(distopt_sharded(rank, fill=False), path)
    for key, want in distopt_sharded(rank).items():
        compare_loaded(rank, key, loaded[key], want)
    dist.barrier()
    dist.destroy_process_group()


def distopt(out):
    path = os.path.join(out, "distopt")
    spawn(distopt_worker, TP * DP, path)
    tensors = {k: describe(v) for k, v in distopt_globals().items()}
    common = {"optimizer.param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "step": 5}]}
    write_expected(path, tensors, {}, common)


# --- zarr (not read by shardfs: the mount test checks it is refused) ---

def zarr_worker(rank, world, initfile, path):
    cpu_only()
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    sd = {"w": ShardedTensor.from_rank_offsets(
              "w", torch.chunk(full, TP, dim=0)[rank].clone(), (0, rank, TP)),
          "step": 3}
    dcp.save(sd, path, sharded_strategy=("zarr", 1))
    dist.barrier()
    dist.destroy_process_group()


def zarr_tp2(out):
    path = os.path.join(out, "zarr_tp2")
    spawn(zarr_worker, TP, path)
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    write_expected(path, {"w": describe(full)}, {}, {"step": 3}, fmt=None)


def has_zarr():
    """Can this megatron-core write the zarr backend (0.15 and older, with
    the zarr package)?"""
    try:
        import zarr  # noqa: F401
        from megatron.core.dist_checkpointing.strategies import zarr as _  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def has_flattened_range():
    """Does this megatron-core still save flattened_range (0.15.x and
    older; 0.16 refuses it)?"""
    try:
        ShardedTensor.from_rank_offsets_flat(
            "probe", torch.zeros(2), (4,), flattened_range=slice(0, 2))
    except Exception:  # noqa: BLE001  (whatever this version raises)
        return False
    return True


# --- the checkpoints ---

def spawn(worker, world, path):
    import torch.multiprocessing as mp
    # fork: the ranks inherit the imported megatron-core (its import costs
    # tens of seconds on a CPU-only box); no process group exists yet
    shutil.rmtree(path, ignore_errors=True)  # no stale files of an older run
    os.makedirs(path)
    tmp = tempfile.mkdtemp()
    try:
        mp.start_processes(worker, args=(world, os.path.join(tmp, "init"), path),
                           nprocs=world, join=True, start_method="fork")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_expected(path, tensors, objects, common, fmt="megatron-torch_dist 1"):
    """fmt: user.shardfs.format the mount shows, None: not shown."""
    exp = {"megatron_core": MCORE, "torch": torch.__version__,
           "format": fmt, "tensors": tensors,
           "objects": objects, "common": repr(common)}
    with open(path + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def gpt_tp2(out):
    path = os.path.join(out, "gpt_tp2")
    spawn(gpt_worker, TP, path)
    write_expected(path, *gpt_expected())


def main():
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    out = os.path.join(args[0], VER)
    os.makedirs(out, exist_ok=True)
    todo = [("gpt_tp2", gpt_tp2)]
    if has_flattened_range():
        todo.append(("distopt", distopt))
    elif only == "distopt":
        raise SystemExit("megatron-core %s does not save flattened_range" % MCORE)
    if has_zarr():
        todo.append(("zarr_tp2", zarr_tp2))
    for name, fn in todo:
        if only in (None, name):
            fn(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
