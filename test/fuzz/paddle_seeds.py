"""paddle_seeds - seeds for fuzz_paddle from the checkpoints paddle wrote.

    python3 test/fuzz/paddle_seeds.py test/fuzz/corpus/paddle

For each committed fixture whose files fit fuzz_paddle's input
(test/fixtures/paddle/paddle-*/NAME with 0.metadata and at most four
R_0.distcp): the parts 0.metadata, 0_0.distcp, 1_0.distcp ..., each as a
4-byte little-endian length and its bytes (see fuzz_paddle.c). Stdlib only.
"""
import glob
import os
import struct
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "paddle", "paddle-*", "*", ""))):
    d = d.rstrip("/")
    ranks = sorted(glob.glob(os.path.join(d, "*_0.distcp")))
    if not os.path.exists(os.path.join(d, "0.metadata")) or not ranks or len(ranks) > 4:
        continue
    parts = [os.path.join(d, "0.metadata")] + \
        [os.path.join(d, "%d_0.distcp" % r) for r in range(len(ranks))]
    blob = b""
    for p in parts:
        with open(p, "rb") as f:
            b = f.read()
        blob += struct.pack("<I", len(b)) + b
    name = "%s-%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d))
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")
