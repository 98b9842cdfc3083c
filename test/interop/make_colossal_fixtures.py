"""make_colossal_fixtures - ColossalAI distributed checkpoint IO
(hpcaitech/ColossalAI PR 6181, `booster.save_model(...,
gather_dtensor=False)`), written by the PR's own code on CPU (gloo).

    PY make_colossal_fixtures.py PR_SRC OUTDIR

PR_SRC is a checkout of the PR (its head, 7e880a13; the directory that
holds `colossalai/`). The PR is in no release, and the whole colossalai
package does not install without CUDA, so this script loads from PR_SRC
exactly the files that write and read the format -
colossalai/checkpoint_io/{hybrid_parallel_checkpoint_io, distributed_
checkpoint_utils, utils, index_file, general_checkpoint_io,
checkpoint_io_base}.py and colossalai/utils/{safetensors,common}.py - with
stand-ins for the imports they do not use on this path (ModelWrapper,
DistCoordinator, the d_tensor and padded_tensor helpers; tensornvme's
AsyncFileWriter replaced by a synchronous writer of the same calls; pinned
memory by plain memory). Nothing of the PR enters this repository.

Two gloo processes are tensor-parallel ranks 0 and 1 (tp 2, pp 1, dp 1;
bin-pp2: pipeline stages 0 and 1).
Each holds its part of a small model split the way shardformer splits it:
Linear1D_Col (`up`, `lm_head`: dim 0 of weight and bias), Linear1D_Row
(`down`: dim 1 of the weight, the bias replicated), VocabParallel-
Embedding1D (`embed`: dim 0), a replicated LayerNorm, a persistent buffer
(`pos_ids`, int64), a 0-dim persistent buffer (`scale`) and a
non-persistent one (`cache`, not saved). `HybridParallelModule`'s
param_origin_shape is the unsplit model's. Then the PR's
HybridParallelCheckpointIO.save_sharded_model / save_unsharded_model with
gather_dtensor=False write OUTDIR/colossal-pr6181/NAME/:

  st-sharded   safetensors, sharded (size_per_shard 0.002 MB: several
               shards per writer), bf16
  bin-sharded  torch.save .bin, sharded, f32
  bin-single   save_unsharded_model, .bin (meta .json; `file` holds the
               save-time directory), f32
  st-single    save_unsharded_model with use_async (the PR's own
               safetensors writer), f32
  bin-pp2      .bin, sharded, the two processes pipeline stages 0 and 1
               (tp 1, pp 2): embed, norm, up on stage 0, down, lm_head on
               stage 1, the buffers on both
  st-padded    safetensors, sharded, the vocabulary (100) padded to 128 as
               shardformer pads it (make_vocab_size_divisible_by 64 * tp 2,
               zero rows): rank 1 stores 64 rows of which its `lengths`
               says 36. The PR's search_tp_partition_dim asserts an even
               split, so this one runs under `python -O` (asserts off),
               the only way the PR writes a padded vocabulary.

Beside each NAME/: NAME.safetensors, the unsplit model's state dict
(parameters unpadded, persistent buffers), and NAME.json. Each checkpoint
is read back with the PR's own load_dist_model (every parameter whole, and
each rank's own part) and compared with the unsplit model: the script
fails when they differ. Seeded: a re-run writes the same values.
"""

import json
import os
import subprocess
import sys
import types

HERE = os.path.abspath(__file__)
COMMIT = "7e880a13012686c3b2260b5d2278602412277b46"
H, F = 8, 32
VARIANTS = ("st-sharded", "bin-sharded", "bin-single", "st-single", "bin-pp2")
STAGE0 = ("embed", "norm", "up")  # bin-pp2: pipeline stage 0's modules


def check(ok, *what):
    """assert that also holds under python -O (st-padded)"""
    if not ok:
        raise SystemExit("make_colossal_fixtures: the PR's reader disagrees: %r" % (what,))


def stub_modules(src):
    """Register the PR's files as modules, stand-ins for the rest."""
    import torch

    def mod(name, path=None, **attrs):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [path]
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class ModelWrapper:
        def __init__(self, module):
            self.module = module

        def unwrap(self):
            return self.module

    class OptimizerWrapper:
        pass

    class DistCoordinator:
        def is_master(self):
            return torch.distributed.get_rank() == 0

    class ParallelModule(torch.nn.Module):
        pass

    def never(*a, **k):
        raise RuntimeError("not on the gather_dtensor=False path")

    def false(*a, **k):
        return False

    cai = os.path.join(src, "colossalai")
    mod("colossalai", cai)
    mod("colossalai.accelerator", get_accelerator=never)
    mod("colossalai.interface", ModelWrapper=ModelWrapper,
        OptimizerWrapper=OptimizerWrapper)
    mod("colossalai.cluster", DistCoordinator=DistCoordinator)
    mod("colossalai.logging", get_dist_logger=lambda *a, **k: None)
    mod("colossalai.tensor", os.path.join(cai, "tensor"))
    mod("colossalai.tensor.d_tensor", is_customized_distributed_tensor=false,
        is_distributed_tensor=false, to_global=never,
        to_global_for_customized_distributed_tensor=never)
    mod("colossalai.tensor.padded_tensor", init_as_padded_tensor=never,
        is_padded_tensor=false, to_padded_tensor=never,
        to_unpadded_tensor=never)
    mod("colossalai.shardformer", os.path.join(cai, "shardformer"))
    mod("colossalai.shardformer.layer", os.path.join(cai, "shardformer", "layer"))
    mod("colossalai.shardformer.layer.parallel_module",
        ParallelModule=ParallelModule)
    utils = mod("colossalai.utils", os.path.join(cai, "utils"))
    import colossalai.utils.common as common  # the PR's file
    utils.get_current_device = lambda: torch.device("cpu")
    utils.get_non_persistent_buffers_set = common.get_non_persistent_buffers_set
    import colossalai.utils.safetensors as cst  # the PR's file

    class AsyncFileWriter:  # tensornvme's calls, written synchronously
        def __init__(self, path, n_entries=0, backend=None, n_tasks=0):
            self.f = open(path, "wb")
            self.offset = 0

        def write(self, b):
            self.f.write(b)
            self.offset += len(b)

        def write_raw(self, tensor, ptr, n, offset):
            check(offset == self.offset, "write_raw at", offset)
            self.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()[:n])

        def synchronize(self):
            self.f.flush()

        def __del__(self):
            self.f.close()

    cst.AsyncFileWriter = AsyncFileWriter
    mod("colossalai.checkpoint_io", os.path.join(cai, "checkpoint_io"))
    import colossalai.checkpoint_io.utils as cu
    cu._pin_tensor = lambda t, empty=True: torch.empty_like(t) if empty else t.clone()
    import colossalai.checkpoint_io.hybrid_parallel_checkpoint_io as hp
    import colossalai.checkpoint_io.distributed_checkpoint_utils as dcu
    return ModelWrapper, hp, dcu


def full_model(vocab):
    import torch
    import torch.nn as nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, H)
            self.norm = nn.LayerNorm(H)
            self.up = nn.Linear(H, F)
            self.down = nn.Linear(F, H)
            self.lm_head = nn.Linear(H, vocab, bias=False)
            self.register_buffer("pos_ids", torch.arange(16, dtype=torch.int64) * 3)
            self.register_buffer("scale", torch.tensor(0.125))
            self.register_buffer("cache", torch.zeros(4), persistent=False)

    torch.manual_seed(0)
    m = Tiny()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape))
    return m


def split_model(full, tp, rank, padded_to):
    """This rank's module, split as shardformer splits it."""
    import copy
    import torch
    import torch.nn as nn

    m = copy.deepcopy(full)

    def part(t, dim):
        n = t.shape[dim] // tp
        return nn.Parameter(t.narrow(dim, n * rank, n).clone())

    with torch.no_grad():
        for mod in (m.embed, m.lm_head):
            w = mod.weight.data
            if padded_to != w.shape[0]:  # padded_tensor.to_padded_tensor
                pad = torch.zeros(padded_to - w.shape[0], *w.shape[1:], dtype=w.dtype)
                w = torch.cat((w, pad), 0)
            mod.weight = part(w, 0)
        m.up.weight = part(m.up.weight.data, 0)
        m.up.bias = part(m.up.bias.data, 0)
        m.down.weight = part(m.down.weight.data, 1)
    return m


def worker(out, padded):
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    single = [dist.new_group([i]) for i in range(tp)]
    ModelWrapper, hp, dcu = stub_modules(os.environ["COLOSSAL_PR_SRC"])
    io_tp = hp.HybridParallelCheckpointIO(dp_group=single[rank], pp_group=single[rank],
                                          tp_group=dist.group.WORLD,
                                          sp_group=single[rank], zero_stage=0,
                                          verbose=False)
    io_pp = hp.HybridParallelCheckpointIO(dp_group=single[rank], pp_group=dist.group.WORLD,
                                          tp_group=single[rank],
                                          sp_group=single[rank], zero_stage=0,
                                          verbose=False)
    vocab = 100 if padded else 128
    mult = 64 * tp
    padded_to = (vocab + mult - 1) // mult * mult
    names = ["st-padded"] if padded else list(VARIANTS)
    for name in names:
        full = full_model(vocab)
        if name == "st-sharded":
            full = full.to(torch.bfloat16)
        io = io_pp if name == "bin-pp2" else io_tp
        if name == "bin-pp2":  # tp 1, pp 2: each stage its own modules
            local = split_model(full, 1, 0, vocab)
            for mod in ("embed", "norm", "up", "down", "lm_head"):
                if (mod in STAGE0) != (rank == 0):
                    setattr(local, mod, None)
        else:
            local = split_model(full, tp, rank, padded_to)
        wrapped = ModelWrapper(local)
        wrapped.param_origin_shape = {n: p.shape for n, p in full.named_parameters()}
        wrapped._force_wait_all_gather = lambda: None
        d = os.path.join(out, name)
        if name.endswith("-single"):
            io.save_unsharded_model(wrapped, d, gather_dtensor=False,
                                    use_safetensors=False,
                                    use_async=name.startswith("st"))
            for w in io.async_writers:
                w.synchronize()
            io.async_writers.clear()
        else:
            io.save_sharded_model(wrapped, d, gather_dtensor=False,
                                  size_per_shard=0.002,
                                  use_safetensors=name.startswith("st"))
        dist.barrier()
        # the PR's reader: each rank's own part, then every parameter whole
        own = io.create_model_metadata(wrapped)
        got = dcu.load_dist_model(own, d)
        for n, p in local.named_parameters():
            want = p.detach()[tuple(slice(0, k) for k in own[n]["lengths"])]
            check(torch.equal(got[n], want), name, rank, n)
        ref = {k: v.detach().contiguous() for k, v in full.state_dict().items()}
        if rank == 0:
            whole = {n: {"offsets": [0] * p.dim(), "lengths": list(p.shape),
                         "global_shape": list(p.shape)}
                     for n, p in full.named_parameters()}
            got = dcu.load_dist_model(whole, d)
            for n in whole:
                check(torch.equal(got[n], ref[n]), name, n)
            save_file(ref, d + ".safetensors")
            with open(d + ".json", "w") as f:
                json.dump({"colossalai_pr": 6181, "commit": COMMIT,
                           "torch": torch.__version__,
                           "tp": 1 if name == "bin-pp2" else tp,
                           "pp": tp if name == "bin-pp2" else 1,
                           "vocab": vocab, "padded_to": padded_to,
                           "buffers": ["pos_ids", "scale"]}, f, indent=1)
                f.write("\n")
        dist.barrier()
    dist.destroy_process_group()


def launch(src, out):
    import shutil
    root = os.path.join(out, "colossal-pr6181")
    for name in VARIANTS + ("st-padded",):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    for padded in (False, True):
        procs = []
        for r in range(2):
            env = dict(os.environ, COLOSSAL_PR_SRC=os.path.abspath(src), RANK=str(r),
                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(29731 + padded), OMP_NUM_THREADS="1")
            flags = ["-O"] if padded else []
            procs.append(subprocess.Popen([sys.executable, *flags, HERE, "--worker",
                                           root, "1" if padded else "0"], env=env))
        if any(p.wait() for p in procs):
            sys.exit("make_colossal_fixtures: a worker failed")
    print("wrote", root)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] == "1")
    elif len(sys.argv) == 3:
        if not os.path.isfile(os.path.join(sys.argv[1], "colossalai",
                                           "checkpoint_io",
                                           "distributed_checkpoint_utils.py")):
            sys.exit("make_colossal_fixtures: %s holds no checkout of ColossalAI PR 6181"
                     % sys.argv[1])
        launch(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
