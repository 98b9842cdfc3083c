"""torchsave_seeds - seeds for fuzz_torchsave, written by a real torch.

    /usr/bin/python3 test/fuzz/torchsave_seeds.py test/fuzz/corpus/torchsave

torch.save (Debian's torch 1.13) of the shapes the reader must handle: a
tensor, a transposed view, a sliced view with a storage offset, a 0-d and
an empty tensor, BF16/F16/I64/BOOL, an nn.Parameter, an OrderedDict of
tensors with a non-tensor value, and a plain int (no tensor: refused).
Issue 30: tensors as torch 2.x pickles float8 and uint16/32/64
(_rebuild_tensor_v3 over an UntypedStorage, made with
test/interop/torch_v3.py: no torch 2.x here), and archives refused for a
storage entry or data.pkl named twice or a second data.pkl in another
folder (entries appended by zipfile), and one whose data.pkl names one
storage as FloatStorage and IntStorage (torch's writer refuses to; the
second tensor's key patched to the first's, the zip rewritten by zipfile).
"""
import collections
import io
import os
import sys
import warnings
import zipfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import torch_v3  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(3)
base = torch.arange(20, dtype=torch.float32).reshape(4, 5)
cases = {
    "tensor": base,
    "transposed": base.t(),
    "sliced": base[1:3, 2:],
    "scalar": torch.tensor(2.5, dtype=torch.float64),
    "empty": torch.zeros(0, 3),
    "bf16": torch.randn(3, 2).to(torch.bfloat16),
    "f16": torch.randn(5).to(torch.float16),
    "i64": torch.arange(7) * -2,
    "bool": torch.tensor([True, False, True]),
    "param": torch.nn.Parameter(torch.ones(2, 2)),
    "dict": collections.OrderedDict(a=base, b=base[0], step=3),
    "int": 7,
}
for name, v in cases.items():
    buf = io.BytesIO()
    torch.save(v, buf)
    with open(os.path.join(out, name + ".pt"), "wb") as f:
        f.write(buf.getvalue())

raw = bytes((i * 37 + 1) & 0xFF for i in range(48))
st = torch_v3.untyped(raw)
v3 = collections.OrderedDict()
v3["f8"] = torch_v3.V3(st, "float8_e4m3fn", (2, 3))
v3["e5"] = torch_v3.V3(st, "float8_e5m2", (4,), offset=6)
v3["u16_t"] = torch_v3.V3(st, "uint16", (3, 2), stride=(1, 3), offset=1)
v3["u32"] = torch_v3.V3(st, "uint32", (5,), offset=1)
v3["u64"] = torch_v3.V3(st, "uint64", (2, 2))
v3["f32"] = base
buf = io.BytesIO()
torch.save(v3, buf)
with open(os.path.join(out, "v3.pt"), "wb") as f:
    f.write(buf.getvalue())

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
    for name, entry in (("dup-storage", "archive/data/0"),
                        ("dup-pkl", "archive/data.pkl"),
                        ("two-pkl", "other/data.pkl")):
        buf = io.BytesIO()
        torch.save(cases["dict"], buf)
        with zipfile.ZipFile(buf, "a") as z:
            z.writestr(zipfile.ZipInfo(entry, date_time=(2020, 1, 2, 3, 4, 6)),
                       z.read(entry if entry.startswith("archive/") else
                              "archive/data.pkl"))
        with open(os.path.join(out, name + ".pt"), "wb") as f:
            f.write(buf.getvalue())

buf = io.BytesIO()
torch.save(collections.OrderedDict(a=torch.arange(4, dtype=torch.float32),
                                   b=torch.arange(4, dtype=torch.int32)), buf)
src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
pkl = src.read("archive/data.pkl")
assert pkl.count(b"X\x01\x00\x00\x001") == 1
out_buf = io.BytesIO()
with zipfile.ZipFile(out_buf, "w") as z:
    for i in src.infolist():
        data = src.read(i.filename)
        if i.filename == "archive/data.pkl":
            data = pkl.replace(b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000")
        z.writestr(zipfile.ZipInfo(i.filename, date_time=(2020, 1, 2, 3, 4, 6)), data)
with open(os.path.join(out, "two-types.pt"), "wb") as f:
    f.write(out_buf.getvalue())
