"""colossal_seeds - seeds for fuzz_colossal from the ColossalAI distributed
checkpoints PR 6181's own writer made.

    python3 test/fuzz/colossal_seeds.py test/fuzz/corpus/colossal

For each committed fixture (test/fixtures/colossal/colossal-*/NAME): every
file, in name order, as a 4-byte little-endian length, then its kind,
writer and shard number (one byte each; see fuzz_colossal.c), then its
bytes. Stdlib only.
"""
import glob
import os
import re
import struct
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KINDS = [(0, r"pytorch_model-meta-dist-(\d+)\.index\.json()"),
         (1, r"pytorch_model-meta-dist-(\d+)\.json()"),
         (2, r"model-dist-(\d+)-shard-(\d+)\.safetensors"),
         (3, r"pytorch_model-dist-(\d+)-shard-(\d+)\.bin"),
         (4, r"pytorch_model-dist-(\d+)\.bin()"),
         (5, r"pytorch_model-dist-(\d+)\.safetensors()")]
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "colossal",
                                       "colossal-*", "*", ""))):
    d = os.path.dirname(d)
    blob = b""
    for p in sorted(os.listdir(d)):
        for kind, rx in KINDS:
            m = re.fullmatch(rx, p)
            if m:
                break
        else:
            continue
        with open(os.path.join(d, p), "rb") as f:
            b = f.read()
        head = bytes([kind, int(m.group(1)), int(m.group(2) or 0)])
        blob += struct.pack("<I", len(b) + 3) + head + b
    name = os.path.basename(d)
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")
