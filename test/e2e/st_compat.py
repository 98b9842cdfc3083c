#!/usr/bin/python3
"""e2e: the real `safetensors` package reads shardfs's model.safetensors.

Generates committed checkpoints (mixed layout; llama-shaped BF16 with dim-0
and dim-1 boxes; FSDP-style flat F16 shards), mounts them, and loads each
MOUNT/CKPT/model.safetensors with safetensors.torch.load_file (whole file,
onto the CPU, and onto cuda:0 when torch sees a device) and with safe_open
(tensor by tensor). Every tensor must come back with the reference's
dtype, shape and bytes (`shardctl gen --ref`), and nothing else may be in
the file. safetensors' own parser enforces the format rules (header
length, offsets in bounds and contiguous, dtypes), so this is the check
that a third-party loader accepts the view, not only our own parser.

Skips (77) with the reason when torch or safetensors cannot be imported
(Debian 12 packages no safetensors; the GPU machine's Python has it) or
when the machine has no FUSE. Run: st_compat.py --bin BUILD/tools."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "mount"))
import sfmount as sm  # noqa: E402

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover - depends on the machine
    print("SKIP: %s (needs python3 with torch and safetensors)" % e)
    sys.exit(sm.SKIP)

# safetensors dtype name -> torch dtype
TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
                     ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        TORCH_DTYPES[_name] = getattr(torch, _attr)


def raw_bytes(t):
    """The tensor's bytes in memory order (bit-exact for every dtype)."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def check_tensors(ck, got, ref, label):
    ck.eq(sorted(got), sorted(ref.tensors), "%s: tensor names" % label)
    for name in sorted(ref.tensors):
        if name not in got:
            continue
        want = ref.tensors[name]
        t = got[name]
        if want["dtype"] in TORCH_DTYPES:
            ck.eq(t.dtype, TORCH_DTYPES[want["dtype"]], "%s: %s dtype" % (label, name))
        ck.eq(list(t.shape), want["shape"], "%s: %s shape" % (label, name))
        ck.bytes_eq(raw_bytes(t), ref.tensor_bytes(name), "%s: %s bytes" % (label, name))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "mixed": env.gen(os.path.join(store, "mixed"), layout="mixed", ranks=3,
                         size="3M", seed=51, block_size="64K"),
        "llama-bf16": env.gen(os.path.join(store, "llama-bf16"), layout="llama", ranks=4,
                              size="8M", dtype="BF16", seed=52, block_size="64K"),
        "fsdp-f16": env.gen(os.path.join(store, "fsdp-f16"), layout="fsdp", ranks=4,
                            size="4M", dtype="F16", seed=53, block_size="64K"),
    }
    cuda = torch.cuda.is_available()
    print("torch %s, cuda %s" % (torch.__version__, "yes" if cuda else "no"))
    with sm.Mount(env, store, name="st_compat") as m:
        for cname, ref in sorted(refs.items()):
            # Tensors whose dtype torch lacks cannot be loaded by it at all.
            if any(t["dtype"] not in TORCH_DTYPES for t in ref.tensors.values()):
                print("%s: a dtype torch %s lacks; skipping this checkpoint" % (
                    cname, torch.__version__))
                continue
            path = os.path.join(m.mnt, cname, "model.safetensors")
            check_tensors(ck, load_file(path), ref, cname + " load_file")
            with safe_open(path, framework="pt") as f:
                got = {k: f.get_tensor(k) for k in f.keys()}
            check_tensors(ck, got, ref, cname + " safe_open")
            if cuda:
                got = load_file(path, device="cuda:0")
                ck.ok(all(t.is_cuda for t in got.values()), "%s: on cuda:0" % cname)
                check_tensors(ck, got, ref, cname + " load_file(cuda:0)")
        ck.ok(m.alive(), "daemon alive after the safetensors loads")


if __name__ == "__main__":
    sys.exit(sm.main(run))
