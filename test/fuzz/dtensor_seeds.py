"""dtensor_seeds - seeds for fuzz_dtensor from the per-rank DTensor pickles
torch wrote.

    python3 test/fuzz/dtensor_seeds.py test/fuzz/corpus/dtensor

For each committed fixture (test/fixtures/dtensor/torch-*/NAME): every
rank's model_world_size_W_rank_R.pt in rank order, each as a 4-byte
little-endian length and its bytes (see fuzz_dtensor.c). Stdlib only.
"""
import glob
import os
import re
import struct
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "dtensor",
                                       "torch-*", "*", ""))):
    d = os.path.dirname(d)
    ranks = sorted(glob.glob(os.path.join(d, "model_world_size_*_rank_*.pt")),
                   key=lambda p: int(re.search(r"_rank_(\d+)\.pt$", p).group(1)))
    blob = b""
    for p in ranks:
        with open(p, "rb") as f:
            b = f.read()
        blob += struct.pack("<I", len(b)) + b
    name = "%s-%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d))
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")
