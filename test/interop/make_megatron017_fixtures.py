"""make_megatron017_fixtures - Megatron-Core 0.17 checkpoints of a real GPT
model and its real distributed optimizer, written on CPU from 4 gloo
processes (tensor parallel 2 x data parallel 2).

    PYTHON make_megatron017_fixtures.py OUTDIR [--only NAME]

PYTHON: a venv with torch 2.x and megatron-core 0.17 (see
test/fixtures/megatron-0.17/README.md). Writes OUTDIR/mcore-X.Y.Z/NAME/
(what `dist_checkpointing.save` wrote) and NAME.expected.json beside it
(the shape test/interop/check_dcp_tree.py reads). Checkpoints, both with
the state dicts Megatron-LM's training loop builds (`model` and
`optimizer`, the metadata of its `_build_sharded_state_dict_metadata`):

  gpt_tp2dp2            0.17's default: `distrib_optim_sharding_type`
                        'dp_reshardable', `singleton_local_shards` False
                        (layers stacked on a prepended axis, SwiGLU fc1 one
                        key), `chained_optim_avoid_prefix` True
  gpt_tp2dp2_singleton  the same with `singleton_local_shards` True (the
                        default of 0.14 to 0.15 and of tools built on them):
                        one key per layer, fc1 saved as KEY_w and KEY_v

The model is megatron's own GPTModel (local layer spec, gated linear unit,
bf16 through Float16Module) wrapped in megatron's DistributedDataParallel
with its DistributedOptimizer (Adam, fp32 main params); after two optimizer
steps on seeded gradients, `GPTModel.sharded_state_dict(metadata=MD)` and
`optimizer.sharded_state_dict(model_sd, metadata=MD)` are saved with
megatron's `dist_checkpointing.save`.

expected.json: every tensor as megatron's own `dist_checkpointing.load`
gives it whole (a ShardedTensor of the global shape per key, the unsplit
state dict), named as the mount shows it: the distributed optimizer's
bucket tensors `optimizer.distributed.dp_group_idx_G.gbuf_idx_B.dtype_D.
bucket_idx_K.STATE` as `optimizer/STATE/dp_group_idx_G.gbuf_idx_B.dtype_D.
bucket_idx_K`, and with singleton_local_shards the pair KEY_w, KEY_v as
KEY = cat(KEY_w, KEY_v) on axis 0. Checked here before writing: every
rank's saved pieces equal their box of the whole tensors; the singleton
checkpoint's merged fc1 of layer i equals layer i of the stacked
checkpoint's fc1, and both checkpoints' optimizer buckets are equal
(same seed, same run). objects: torch.load of each byte item as stored.

megatron-core on a CPU-only machine needs the shims in cpu_shims() (the
files do not depend on them); see the README.
"""

import functools
import io
import json
import os
import re
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import xxhash

TP, DP = 2, 2
WORLD = TP * DP
DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64"}
CHECKPOINTS = {
    "gpt_tp2dp2": False,
    "gpt_tp2dp2_singleton": True,
}
BUCKET = re.compile(r"^optimizer\.distributed\.(dp_group_idx_\d+\.gbuf_idx_\d+\."
                    r"dtype_.*\.bucket_idx_\d+)\.([A-Za-z0-9_]+)$")


def cpu_shims():
    """What megatron-core 0.17's DDP and DistributedOptimizer need from CUDA
    on a CPU box: devices named 'cuda' become the CPU, torch.cuda's
    synchronize/current_device answer for the CPU, and Tensor.type() names
    the torch.cuda.* type the optimizer checks parameters against."""
    if torch.cuda.is_available():
        return
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"

    def cpu_device(fn):
        @functools.wraps(fn)
        def w(*a, **k):
            d = k.get("device")
            if d is not None and "cuda" in str(d):
                k["device"] = "cpu"
            return fn(*a, **k)
        return w
    for n in ("tensor", "zeros", "empty", "ones", "full", "arange",
              "zeros_like", "empty_like", "ones_like"):
        setattr(torch, n, cpu_device(getattr(torch, n)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    to = torch.Tensor.to

    def to_cpu(self, *a, **k):
        a = tuple("cpu" if isinstance(x, (str, torch.device)) and "cuda" in str(x)
                  else x for x in a)
        if "cuda" in str(k.get("device", "")):
            k["device"] = "cpu"
        return to(self, *a, **k)
    torch.Tensor.to = to_cpu
    typ = torch.Tensor.type

    def cuda_type(self, *a, **k):
        r = typ(self, *a, **k)
        if not a and not k and r.startswith("torch.") and not r.startswith("torch.cuda."):
            return "torch.cuda." + r[len("torch."):]
        return r
    torch.Tensor.type = cuda_type


cpu_shims()
import megatron.core as mcore  # noqa: E402
from megatron.core import dist_checkpointing as mdc  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.dict_utils import nested_values  # noqa: E402

MCORE = mcore.__version__
VER = "mcore-%s" % MCORE


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(t):
    b = tensor_bytes(t)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


def metadata(singleton):
    """Megatron-LM 0.17's _build_sharded_state_dict_metadata (dp_cp_group
    left to its default), singleton_local_shards as asked."""
    return {"distrib_optim_sharding_type": "dp_reshardable",
            "singleton_local_shards": singleton,
            "chained_optim_avoid_prefix": True}


def build():
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    torch.manual_seed(1234)
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2,
                            use_cpu_initialization=True, gated_linear_unit=True,
                            params_dtype=torch.bfloat16, bf16=True)
    gpt = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=32,
                   max_sequence_length=8)
    ddp = DistributedDataParallel(
        cfg, DistributedDataParallelConfig(use_distributed_optimizer=True,
                                           grad_reduce_in_fp32=True),
        Float16Module(cfg, gpt))
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True,
                        use_distributed_optimizer=True), [ddp])
    # the same gradients on every rank, as after DDP's all-reduce: the
    # replicas of a parameter (layer norms over TP, everything over DP) stay
    # equal, as in training
    g = torch.Generator().manual_seed(99)
    for _ in range(2):
        for p in ddp.parameters():
            p.main_grad.copy_(torch.randn(p.main_grad.shape, generator=g))
        opt.step()
    return gpt, opt


def shown_name(key):
    m = BUCKET.match(key)
    return "optimizer/%s/%s" % (m.group(2), m.group(1)) if m else key


def worker(rank, world, initfile, path, singleton):
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    gpt, opt = build()
    md = metadata(singleton)
    model_sd = gpt.sharded_state_dict(metadata=md)
    state = {"model": model_sd,
             "optimizer": opt.sharded_state_dict(model_sd, metadata=md),
             "iteration": 2, "checkpoint_version": 3.0}
    # what this rank hands to save (factories are built by save itself)
    pieces = [(t.key, t.global_offset, (1,) * t.prepend_axis_num + tuple(t.local_shape),
               t.data.clone())
              for t in nested_values(state) if isinstance(t, ShardedTensor)]
    mdc.save(state, path)
    dist.barrier()
    # megatron's own load of the unsplit state dict (its
    # load_tensors_metadata fails on torch 2.15's .metadata: TensorProperties
    # has a `strides` field it passes to torch.empty; the shapes come from
    # torch's reader instead)
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    meta = FileSystemReader(path).read_metadata().state_dict_metadata
    whole = {k: ShardedTensor.from_rank_offsets(
        k, torch.zeros(tuple(v.size), dtype=v.properties.dtype), replica_id=rank)
        for k, v in meta.items() if isinstance(v, TensorStorageMetadata)}
    loaded = mdc.load(whole, path)
    for key, off, shape, data in pieces:
        box = tuple(slice(o, o + n) for o, n in zip(off, shape))
        if tensor_bytes(loaded[key][box].reshape(data.shape)) != tensor_bytes(data):
            raise SystemExit("rank %d: megatron's load of %s differs from what "
                             "the rank saved" % (rank, key))
    if rank == 0:
        # (load also returns common.pt's state beside the tensors)
        torch.save({k: loaded[k].contiguous() for k in whole},
                   path + ".whole.pt")
    dist.barrier()
    dist.destroy_process_group()


def objects_of(path):
    """torch.load of every byte item as stored."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    md = FileSystemReader(path).read_metadata()
    out = {}
    for idx, info in md.storage_data.items():
        if not isinstance(md.state_dict_metadata[idx.fqn], BytesStorageMetadata):
            continue
        with open(os.path.join(path, info.relative_path), "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
        out[idx.fqn] = {"repr": repr(torch.load(io.BytesIO(raw), weights_only=False))}
    return out


def merged(whole):
    """The tensors as the mount shows them."""
    out = {}
    for k, v in whole.items():
        if k.endswith("_v") and k[:-2] + "_w" in whole:
            continue
        if k.endswith("_w") and k[:-2] + "_v" in whole and k[:-2] not in whole:
            out[k[:-2]] = torch.cat([v, whole[k[:-2] + "_v"]], dim=0)
            continue
        out[shown_name(k)] = v
    return out


def spawn(path, singleton):
    import torch.multiprocessing as mp
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    tmp = tempfile.mkdtemp()
    try:
        mp.start_processes(worker, args=(WORLD, os.path.join(tmp, "init"), path, singleton),
                           nprocs=WORLD, join=True, start_method="fork")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    whole = torch.load(path + ".whole.pt")
    os.unlink(path + ".whole.pt")
    return whole


def cross_check(stacked, single):
    """The singleton checkpoint's merged fc1 per layer = the stacked one's
    layer; the optimizer buckets are the same run's."""
    n = 0
    for k, v in single.items():
        m = re.match(r"^decoder\.layers\.(\d+)\.(.*)$", k)
        if m and "decoder.layers." + m.group(2) in stacked:
            want = stacked["decoder.layers." + m.group(2)][int(m.group(1))]
        elif k.startswith("optimizer/") and k in stacked:
            want = stacked[k]
        else:
            continue
        if "bucket" in k:  # padding between parameters is torch.empty
            continue
        if tensor_bytes(v) != tensor_bytes(want):
            raise SystemExit("%s: the singleton checkpoint differs from the stacked one" % k)
        n += 1
    if n < 10:
        raise SystemExit("cross-check compared only %d tensors" % n)


def write_expected(path, tensors, objects):
    exp = {"megatron_core": MCORE, "torch": torch.__version__,
           "format": "megatron-torch_dist 1",
           "tensors": {k: describe(v) for k, v in sorted(tensors.items())},
           "objects": objects,
           "common": repr(torch.load(os.path.join(path, "common.pt"),
                                     weights_only=False))}
    with open(path + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    if tuple(int(x) for x in MCORE.split(".")[:2]) < (0, 17):
        raise SystemExit("megatron-core %s: this generator is for 0.17" % MCORE)
    out = os.path.join(args[0], VER)
    os.makedirs(out, exist_ok=True)
    shown = {}
    for name, singleton in CHECKPOINTS.items():
        if only not in (None, name):
            continue
        path = os.path.join(out, name)
        shown[name] = merged(spawn(path, singleton))
        write_expected(path, shown[name], objects_of(path))
    if len(shown) == 2:
        cross_check(shown["gpt_tp2dp2"], shown["gpt_tp2dp2_singleton"])
    print("wrote", out)


if __name__ == "__main__":
    main()
