"""bin_v3 - a Hugging Face .bin checkpoint whose weight file also holds
tensors as torch 2.x saves float8 and uint16/32/64 (issue 30).

    /usr/bin/python3 bin_v3.py BASE FILE OUT EXPECTED

BASE is a committed .bin checkpoint (test/fixtures/hf/transformers-4.46/
llama-bin, with BASE.expected.json); FILE one of its weight files. Copies
BASE to OUT, rewrites OUT/FILE with torch 1.13's torch.save of FILE's own
tensors (torch.load of our fixture: trusted here) plus six tensors pickled
as torch 2.x pickles those dtypes, with _rebuild_tensor_v3 and an
UntypedStorage (test/interop/torch_v3.py says how): F8_E4M3, F8_E5M2, a
U16 and its transposed view sharing one storage, a U32 at a storage offset,
a U64. Adds them to the index's weight_map, and writes EXPECTED:
BASE's entries plus theirs (dtype, shape, the xxh3 of the bytes of each
view, row-major), for test/interop/check_dcp_tree.py.
"""

import json
import os
import shutil
import sys

import torch
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import torch_v3  # noqa: E402


def pattern(n, seed):
    return bytes((i * 37 + seed) & 0xFF for i in range(n))


def main():
    base, fname, out, exp_path = sys.argv[1:5]
    shutil.copytree(base, out)
    for n in os.listdir(out):
        os.chmod(os.path.join(out, n), 0o644)
    sd = torch.load(os.path.join(base, fname), map_location="cpu")
    raws = {"f8": pattern(24, 1), "e5": pattern(10, 2), "u16": pattern(24, 3),
            "u32": pattern(40, 4), "u64": pattern(24, 5)}
    st = {k: torch_v3.untyped(v) for k, v in raws.items()}
    new = {
        "v3.f8_e4m3": ("f8", torch_v3.V3(st["f8"], "float8_e4m3fn", (4, 6))),
        "v3.f8_e5m2": ("e5", torch_v3.V3(st["e5"], "float8_e5m2", (10,))),
        "v3.u16": ("u16", torch_v3.V3(st["u16"], "uint16", (3, 4))),
        "v3.u16_t": ("u16", torch_v3.V3(st["u16"], "uint16", (4, 3), stride=(1, 4))),
        "v3.u32": ("u32", torch_v3.V3(st["u32"], "uint32", (2, 4), offset=2)),
        "v3.u64": ("u64", torch_v3.V3(st["u64"], "uint64", (3,))),
    }
    for k, (_, v) in new.items():
        sd[k] = v
    torch.save(sd, os.path.join(out, fname))
    ixp = [n for n in os.listdir(out) if n.endswith(".index.json")][0]
    with open(os.path.join(out, ixp)) as f:
        ix = json.load(f)
    for k in new:
        ix["weight_map"][k] = fname
    with open(os.path.join(out, ixp), "w") as f:
        json.dump(ix, f, indent=2)
    with open(base + ".expected.json") as f:
        exp = json.load(f)
    for k, (r, v) in new.items():
        b = v.view_bytes(raws[r])
        exp["tensors"][k] = {"dtype": torch_v3.ST_NAME[v.dtype], "shape": list(v.size),
                             "nbytes": len(b), "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}
    with open(exp_path, "w") as f:
        json.dump(exp, f, indent=1)
    print(json.dumps(sorted(new)))


if __name__ == "__main__":
    main()
