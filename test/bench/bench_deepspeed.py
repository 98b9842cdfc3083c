"""bench_deepspeed - the Python half of bench_deepspeed.sh.

    torchrun ... bench_deepspeed.py write OUT MIB   (deepspeed's venv)
        a ZeRO-3 checkpoint (bf16, AdamW with torch_adam, one step) of
        about MIB MiB of fp32 weights: square Linear layers of 1024 x 1023
        (odd: every one padded over 4 ranks) plus a remainder, saved as
        OUT/latest + OUT/global_step1/
    bench_deepspeed.py read CKPT OUT   (stdlib only)
        every fp32 weight of the mounted checkpoint CKPT (the
        model.safetensors entries but optimizer/ and module/) into the
        safetensors file OUT, copied through a 16 MiB buffer
    bench_deepspeed.py same A B   (stdlib only)
        exit 0 when the safetensors files A and B hold the same tensors
        (names, dtypes, shapes, bytes), else 1 naming the first difference
"""
import json
import os
import struct
import sys

CHUNK = 16 << 20


def header(fd):
    (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    h = json.loads(os.pread(fd, n, 8))
    h.pop("__metadata__", None)
    return h, 8 + n


def write(out, mib):
    import torch
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    per = 1024 * 1023 * 4
    n = max(1, (mib << 20) // per)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(1023, 1024, bias=False) if i % 2 == 0 else
                torch.nn.Linear(1024, 1023, bias=False) for i in range(n))
            self.rest = torch.nn.Parameter(torch.ones(12345))

        def forward(self, x):
            for m in self.layers:
                x = m(x)
            return x.pow(2).mean() + self.rest.sum() * 0

    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
           "steps_per_print": 1000}
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg,
                                           model_parameters=model.parameters())
    loss = engine(torch.ones(1, 1023, dtype=torch.bfloat16))
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out, tag="global_step1")


def read(ckpt, out):
    fd = os.open(os.path.join(ckpt, "model.safetensors"), os.O_RDONLY)
    h, base = header(fd)
    names = sorted(k for k in h if not k.startswith(("optimizer/", "module/")))
    hdr, off = {}, 0
    for k in names:
        a, b = h[k]["data_offsets"]
        hdr[k] = {"dtype": h[k]["dtype"], "shape": h[k]["shape"],
                  "data_offsets": [off, off + b - a]}
        off += b - a
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for k in names:
            a, b = h[k]["data_offsets"]
            pos = base + a
            while pos < base + b:
                buf = os.pread(fd, min(CHUNK, base + b - pos), pos)
                if not buf:
                    sys.exit("short read of " + k)
                f.write(buf)
                pos += len(buf)
    os.close(fd)


def same(pa, pb):
    fa, fb = os.open(pa, os.O_RDONLY), os.open(pb, os.O_RDONLY)
    (ha, ba), (hb, bb) = header(fa), header(fb)
    if sorted(ha) != sorted(hb):
        sys.exit("different names: %s" % sorted(set(ha) ^ set(hb))[:5])
    for k in sorted(ha):
        if (ha[k]["dtype"], ha[k]["shape"]) != (hb[k]["dtype"], hb[k]["shape"]):
            sys.exit("%s: %s vs %s" % (k, ha[k], hb[k]))
        (a0, a1), (b0, b1) = ha[k]["data_offsets"], hb[k]["data_offsets"]
        for p in range(0, a1 - a0, CHUNK):
            n = min(CHUNK, a1 - a0 - p)
            if os.pread(fa, n, ba + a0 + p) != os.pread(fb, n, bb + b0 + p):
                sys.exit("%s: bytes differ" % k)
    print("same: %d tensors" % len(ha))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
