"""make_v3_fixture - a torch.save .bin holding the dtypes torch 2.x pickles
with torch._utils._rebuild_tensor_v3 (issue 30, item 7).

    PYTHON_WITH_TORCH_2 make_v3_fixture.py OUT_PARENT      # write
    PYTHON_WITH_TORCH_2 make_v3_fixture.py --check OUT_PARENT

Writes OUT_PARENT/torch-VER/bin-v3/pytorch_model.bin with torch's own
torch.save, and OUT_PARENT/torch-VER/bin-v3.expected.json: every tensor's
dtype, shape, size and the xxh3 of its row-major bytes, computed from the
state dict handed to torch.save (never read back from the file). The state
dict: float8_e4m3fn and float8_e5m2 tensors, a uint16 tensor and its
transpose (one storage), a uint32 view at storage offset 2, a uint64
tensor, and an F32 one saved the old way (_rebuild_tensor_v2) beside them.
--check loads the file back with torch.load(weights_only=True) and
compares every tensor with the expected.json.
"""

import json
import os
import sys

import torch
import xxhash

NAMES = {torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
         torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
         torch.float32: "F32"}


def pattern(n, seed):
    return bytearray((i * 37 + seed) & 0xFF for i in range(n))


def raw(n, seed, dtype):
    return torch.frombuffer(pattern(n, seed), dtype=torch.uint8).clone().view(dtype)


def state_dict():
    u16 = raw(24, 3, torch.uint16).reshape(3, 4)
    u32 = raw(40, 4, torch.uint32)
    return {
        "w.f32": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
        "v3.f8_e4m3": raw(24, 1, torch.float8_e4m3fn).reshape(4, 6),
        "v3.f8_e5m2": raw(10, 2, torch.float8_e5m2),
        "v3.u16": u16,
        "v3.u16_t": u16.t(),                   # a strided view of u16's storage
        "v3.u32": u32[2:10].reshape(2, 4),     # storage offset 2
        "v3.u64": raw(24, 5, torch.uint64),
    }


def row_major(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def expected(sd):
    return {"objects": {}, "tensors": {
        k: {"dtype": NAMES[t.dtype], "shape": list(t.shape),
            "nbytes": len(row_major(t)),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(row_major(t))}
        for k, t in sd.items()}}


def main():
    check = sys.argv[1] == "--check"
    parent = sys.argv[2] if check else sys.argv[1]
    ver = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    top = os.path.join(parent, "torch-" + ver)
    out = os.path.join(top, "bin-v3")
    exp_path = os.path.join(top, "bin-v3.expected.json")
    if check:
        with open(exp_path) as f:
            exp = json.load(f)
        got = torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
        bad = [k for k, e in exp["tensors"].items()
               if expected({k: got[k]})["tensors"][k] != e]
        print("check: %d tensors, %d differ %s" % (len(exp["tensors"]), len(bad), bad))
        sys.exit(1 if bad or set(got) != set(exp["tensors"]) else 0)
    os.makedirs(out, exist_ok=True)
    sd = state_dict()
    torch.save(sd, os.path.join(out, "pytorch_model.bin"))
    with open(exp_path, "w") as f:
        json.dump(expected(sd), f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %s with torch %s" % (out, torch.__version__))


if __name__ == "__main__":
    main()
