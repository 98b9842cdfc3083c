"""torchsave_seeds - seeds for fuzz_torchsave, written by a real torch.

    /usr/bin/python3 test/fuzz/torchsave_seeds.py test/fuzz/corpus/torchsave

torch.save (Debian's torch 1.13) of the shapes the reader must handle: a
tensor, a transposed view, a sliced view with a storage offset, a 0-d and
an empty tensor, BF16/F16/I64/BOOL, an nn.Parameter, an OrderedDict of
tensors with a non-tensor value, and a plain int (no tensor: refused).
"""
import collections
import io
import os
import sys

import torch

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
