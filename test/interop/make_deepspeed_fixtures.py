"""make_deepspeed_fixtures - DeepSpeed ZeRO checkpoints written by a real
DeepSpeed on CPU (DS_ACCELERATOR=cpu, gloo, torch_adam, bf16 on; fp16 for the -fp16 cases).

    PY make_deepspeed_fixtures.py OUTDIR [NAME...]

Writes OUTDIR/deepspeed-X.Y.Z/NAME/ (as DeepSpeed and the HF Trainer lay it
out: NAME/latest + NAME/global_stepN/*) for

  zero1-2r   ZeRO stage 1, 2 ranks
  zero2-2r   ZeRO stage 2, 2 ranks, saved at steps 1 and 2 (latest names
             global_step2; global_step1 stays beside it)
  zero3-2r   ZeRO stage 3, 2 ranks
  zero3-3r   ZeRO stage 3, 3 ranks (every parameter padded)
  zero2-tied ZeRO stage 2, 2 ranks, an output layer whose weight is the
             embedding's (shared_params: zero_to_fp32 shows it under both
             names)
  zero2-frozen, zero3-frozen  ZeRO stage 2 and 3, 2 ranks, norm.weight and
             fc1.bias frozen (requires_grad False, as the base weights of
             a LoRA fine-tuning): frozen_param_shapes/_fragments in the
             model states; zero_to_fp32 gives them as stored (16-bit)
  zero2-tp2  ZeRO stage 2, 4 processes: 2 tensor-parallel (mp) ranks x 2
             data-parallel, through an mpu object (as Megatron-DeepSpeed
             passes one); each mp rank holds its own parameters (seeded by
             its mp rank), as a TP layer's shard would. Files
             *_mp_rank_00_* and *_mp_rank_01_*. zero_to_fp32 cannot read it
             (the split axis is in no file): its references are each mp
             rank's gathered fp32 weights and moments, from
             safe_get_full_fp32_param / safe_get_full_optimizer_state in
             the training processes, as mp_rank_0T/NAME

  zero2-fp16, zero3-fp16  ZeRO stage 2 (saved at steps 1 and 2) and 3,
             2 ranks, fp16 with fp32 master weights and dynamic loss
             scaling (initial scale 2**4). deepspeed 0.19.8 refuses fp16
             on a CPU without mkldnn fp16 (AVX512-FP16/AMX-FP16): "Type
             fp16 is not supported on your device." (engine
             _do_sanity_check); the script bypasses that one check
             (get_accelerator().is_fp16_supported), nothing else

  universal-zero2  zero2-2r converted by DeepSpeed's ds_to_universal
             (--inject_missing_state): NAME/latest_universal +
             NAME/global_step2_universal/zero/PARAM/{fp32,exp_avg,exp_avg_sq,
             step}.pt; its references are zero2-2r's (NAME.json says so)

and beside each NAME/ the references, written by DeepSpeed's own code:

  NAME.fp32.safetensors   zero_to_fp32's get_fp32_state_dict_from_zero_
                          checkpoint(NAME) (the checkpoint latest names)
  NAME.optim.safetensors  exp_avg/NAME and exp_avg_sq/NAME, from
                          deepspeed.utils.safe_get_full_optimizer_state in
                          the training processes (gathered over ranks)
  NAME.module.safetensors stage 1/2: the 16-bit module weights as
                          torch.load gives them from the model states
                          (stage 3 stores none)
  NAME.json               {"deepspeed", "torch", "stage", "world"}
  NAME.objects.json       the non-tensor entries of the model states
                          (mp rank 0) and rank 0's optimizer states as
                          torch.load gives them (manifest.json's
                          "deepspeed" shows them)
  NAME@TAG.fp32.safetensors  for each other tag beside the one latest
                          names (zero2-2r's global_step1): zero_to_fp32's
                          get_fp32_state_dict_from_zero_checkpoint(NAME,
                          tag=TAG), what the mount shows as NAME@TAG

The model has parameters whose sizes do not divide by the world size (so
partitions are uneven and padded) and one frozen-free buffer. Seeded: a
re-run writes the same values. Run with the venv's python; it launches
torchrun itself (one CPU process per rank).
"""

import json
import os
import subprocess
import sys

HERE = os.path.abspath(__file__)
CASES = [("zero1-2r", 1, 2, 1), ("zero2-2r", 2, 2, 2), ("zero3-2r", 3, 2, 1),
         ("zero3-3r", 3, 3, 1), ("zero2-tied", 2, 2, 1), ("zero2-tp2", 2, 4, 1),
         ("zero2-frozen", 2, 2, 1), ("zero3-frozen", 3, 2, 1),
         ("zero2-fp16", 2, 2, 2), ("zero3-fp16", 3, 2, 1)]


def st_write(path, tensors):
    """A safetensors file of {name: torch tensor} (contiguous, CPU)."""
    import torch
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    hdr, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        hdr[k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                  "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def module_ref(ckpt, stage):
    """NAME.module.safetensors: the parameters of the model states' module
    (16-bit), as torch.load reads them (stage 1/2); with several mp ranks,
    each one's as mp_rank_0T/NAME."""
    import glob
    import torch
    if stage > 2:
        return
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read().strip()
    files = sorted(glob.glob(os.path.join(ckpt, tag, "mp_rank_*_model_states.pt")))
    ref = {}
    for path in files:
        sd = torch.load(path, map_location="cpu", weights_only=False)
        pre = os.path.basename(path)[:len("mp_rank_00")] + "/" if len(files) > 1 else ""
        ref.update({pre + k: v for k, v in sd["module"].items()
                    if k not in sd["buffer_names"]})
    st_write(ckpt + ".module.safetensors", ref)


def tag_refs(ckpt):
    """NAME@TAG.fp32.safetensors: zero_to_fp32 of every tag directory of
    NAME other than the one latest names."""
    from deepspeed.utils.zero_to_fp32 import \
        get_fp32_state_dict_from_zero_checkpoint
    with open(os.path.join(ckpt, "latest")) as f:
        latest = f.read().strip()
    for tag in sorted(os.listdir(ckpt)):
        if tag != latest and os.path.isdir(os.path.join(ckpt, tag)):
            st_write("%s@%s.fp32.safetensors" % (ckpt, tag),
                     get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=tag))


def plain(v):
    """v as JSON: what torch.load gives, tensors as {"tensor", "shape"}."""
    import torch
    if isinstance(v, torch.Tensor):
        return {"tensor": str(v.dtype), "shape": list(v.shape)}
    if isinstance(v, torch.dtype):  # pickled as the global torch.NAME
        return {"global": str(v)}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, torch.Size)):
        return [plain(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return {"class": type(v).__module__ + "." + type(v).__name__,
            "value": int(v) if hasattr(v, "__int__") else
            {k: plain(x) for k, x in sorted(vars(v).items())}}


def object_refs(ckpt):
    """NAME.objects.json: the non-tensor entries of the model states (mp
    rank 0) and of rank 0's optimizer states of the checkpoint latest
    names, as torch.load gives them (what manifest.json's "deepspeed"
    shows)."""
    import glob
    import torch
    with open(os.path.join(ckpt, "latest")) as f:
        tag = os.path.join(ckpt, f.read().strip())
    ms = sorted(glob.glob(os.path.join(tag, "*mp_rank_00_model_states.pt")))[0]
    os_ = glob.glob(os.path.join(tag, "*zero_pp_rank_0_mp_rank_00_optim_states.pt"))[0]
    m = torch.load(ms, map_location="cpu", weights_only=False)
    o = torch.load(os_, map_location="cpu", weights_only=False)
    ref = {"model_states": {k: plain(v) for k, v in m.items()
                            if k not in ("module", "frozen_param_fragments")},
           "optim_states": plain(o)}
    with open(ckpt + ".objects.json", "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
        f.write("\n")


def worker(out, name, stage, steps):
    import torch
    import deepspeed
    from deepspeed.utils import (safe_get_full_fp32_param,
                                 safe_get_full_optimizer_state)

    fp16 = name.endswith("-fp16")
    if fp16:
        # deepspeed 0.19.8's CPU accelerator offers fp16 only where
        # torch.ops.mkldnn._is_mkldnn_fp16_supported() (AVX512-FP16/AMX-FP16
        # CPUs); elsewhere engine init refuses: "Type fp16 is not supported
        # on your device." The check alone is bypassed; the training step,
        # the loss scaler and save_checkpoint are DeepSpeed's own.
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
    deepspeed.init_distributed(dist_backend="gloo")
    dist = torch.distributed
    rank = dist.get_rank()
    tied = name.endswith("-tied")
    tp = 2 if name.endswith("-tp2") else 1
    dp = dist.get_world_size() // tp
    mpu = None
    if tp > 1:  # rank = d * tp + t
        tpg = [dist.new_group([d * tp + t for t in range(tp)]) for d in range(dp)]
        dpg = [dist.new_group([d * tp + t for d in range(dp)]) for t in range(tp)]

        class MPU:
            def get_model_parallel_rank(self): return rank % tp
            def get_model_parallel_world_size(self): return tp
            def get_model_parallel_group(self): return tpg[rank // tp]
            def get_data_parallel_rank(self): return rank // tp
            def get_data_parallel_world_size(self): return dp
            def get_data_parallel_group(self): return dpg[rank % tp]
        mpu = MPU()
    torch.manual_seed(1234 + rank % tp)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 3)     # 33
            self.fc1 = torch.nn.Linear(3, 7)          # 21 + 7
            self.norm = torch.nn.LayerNorm(7)         # 7 + 7
            self.fc2 = torch.nn.Linear(7, 5)          # 35 + 5
            self.scale = torch.nn.Parameter(torch.ones(3))  # 3
            self.register_buffer("counts", torch.arange(4, dtype=torch.float32))
            if tied:  # tied weights: out.weight is embed.weight
                self.out = torch.nn.Linear(3, 11, bias=False)
                self.out.weight = self.embed.weight

        def forward(self, ids):
            h = self.fc1(self.embed(ids))
            h = self.fc2(torch.relu(self.norm(h)))
            loss = (h[..., :3] * self.scale).pow(2).mean()
            if tied:
                loss = loss + self.out(h[..., :3]).pow(2).mean()
            return loss

    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 0.05, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    if fp16:  # dynamic loss scaling from 2**4: no step skipped
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 4}
    else:
        cfg["bf16"] = {"enabled": True}
    model = Tiny()
    if name.endswith("-frozen"):
        model.norm.weight.requires_grad_(False)
        model.fc1.bias.requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=cfg, mpu=mpu,
        model_parameters=[p for p in model.parameters() if p.requires_grad])
    g = torch.Generator().manual_seed(99 + rank)
    ckpt = os.path.join(out, name)
    for step in range(1, steps + 1):
        ids = torch.randint(0, 11, (2, 4), generator=g)
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(ckpt, tag=f"global_step{step}")
    ref, fp32 = {}, {}
    pre = f"mp_rank_{rank % tp:02d}/" if tp > 1 else ""
    for pname, p in engine.module.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            v = safe_get_full_optimizer_state(p, key)
            if v is not None:
                ref[f"{pre}{key}/{pname}"] = v.float().clone()
        if tp > 1:
            fp32[pre + pname] = safe_get_full_fp32_param(p).float().clone()
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (ref, fp32) if rank < tp else ({}, {}))
    if rank == 0:
        ref = {k: v for r, _ in parts for k, v in r.items()}
        st_write(ckpt + ".optim.safetensors", ref)
        if tp > 1:  # zero_to_fp32 cannot: the gathered weights instead
            st_write(ckpt + ".fp32.safetensors",
                     {k: v for _, f in parts for k, v in f.items()})
    dist.barrier()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--module-refs":
        # the module references alone, for checkpoints already written
        for meta in sorted(os.listdir(sys.argv[2])):
            if meta.endswith(".json") and ".objects." not in meta:
                with open(os.path.join(sys.argv[2], meta)) as f:
                    module_ref(os.path.join(sys.argv[2], meta[:-5]),
                               json.load(f)["stage"])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--object-refs":
        for meta in sorted(os.listdir(sys.argv[2])):
            if meta.endswith(".json") and ".objects." not in meta and \
                    "universal" not in meta:
                object_refs(os.path.join(sys.argv[2], meta[:-5]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--tag-refs":
        # the other tags' references alone, for checkpoints already written
        for meta in sorted(os.listdir(sys.argv[2])):
            if meta.endswith(".json") and ".objects." not in meta and \
                    "universal" not in meta:
                tag_refs(os.path.join(sys.argv[2], meta[:-5]))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]),
               int(os.environ["SF_STEPS"]))
        return
    out_root = sys.argv[1]
    import torch
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import \
        get_fp32_state_dict_from_zero_checkpoint

    out = os.path.join(out_root, f"deepspeed-{deepspeed.__version__}")
    os.makedirs(out, exist_ok=True)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    for name, stage, world, steps in CASES:
        if sys.argv[2:] and name not in sys.argv[2:]:
            continue
        env["SF_STEPS"] = str(steps)
        subprocess.run([torchrun, "--nproc_per_node", str(world),
                        "--master_port", str(29600 + stage * 10 + world),
                        HERE, "--worker", out, name, str(stage)],
                       env=env, check=True)
        ckpt = os.path.join(out, name)
        if name.endswith("-tp2"):
            sd = {}  # the workers wrote NAME.fp32.safetensors
        else:
            sd = get_fp32_state_dict_from_zero_checkpoint(ckpt)
            st_write(ckpt + ".fp32.safetensors", sd)
        module_ref(ckpt, stage)
        if not name.endswith("-tp2"):
            tag_refs(ckpt)
        object_refs(ckpt)
        with open(ckpt + ".json", "w") as f:
            json.dump({"deepspeed": deepspeed.__version__,
                       "torch": torch.__version__.split("+")[0],
                       "stage": stage, "world": world,
                       "tp": 2 if name.endswith("-tp2") else 1}, f, indent=1)
            f.write("\n")
        # the script DeepSpeed copies beside its checkpoints (zero_to_torch.py
        # in 0.19, zero_to_fp32.py before) is code, not the checkpoint: not kept
        for script in ("zero_to_torch.py", "zero_to_fp32.py"):
            if os.path.exists(os.path.join(ckpt, script)):
                os.remove(os.path.join(ckpt, script))
        print(f"{name}: {len(sd)} tensors")
    if not sys.argv[2:] or "universal-zero2" in sys.argv[2:]:
        src = os.path.join(out, "zero2-2r")
        with open(os.path.join(src, "latest")) as f:
            tag = f.read().strip()
        dst = os.path.join(out, "universal-zero2")
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(src, tag),
                        "--output_folder", os.path.join(dst, tag + "_universal"),
                        "--inject_missing_state", "--num_extract_workers", "1",
                        "--num_merge_workers", "1"], env=env, check=True)
        with open(dst + ".json", "w") as f:
            json.dump({"deepspeed": deepspeed.__version__,
                       "torch": torch.__version__.split("+")[0],
                       "universal_of": "zero2-2r"}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
