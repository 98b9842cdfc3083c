"""colossal_seeds - seeds for fuzz_colossal from the ColossalAI distributed
checkpoints PR 6181's own writer made.

    python3 test/fuzz/colossal_seeds.py test/fuzz/corpus/colossal

For each committed fixture (test/fixtures/colossal/colossal-*/NAME): every
file, in name order, as a 4-byte little-endian length, then its kind,
writer and shard number (one byte each; see fuzz_colossal.c), then its
bytes. Then st-sharded with writer 1's meta changed as test_colossal.py's
hostile variants change it (h-*: lengths, offsets, global_shape that lie,
a file out of the checkpoint). Stdlib only.
"""
import glob
import json
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
HOSTILE = {  # writer 1's meta entry NAME updated with these keys
    "h-lengths": ("up.weight", {"lengths": [20, 8]}),
    "h-overlap": ("up.weight", {"offsets": [8, 0]}),
    "h-gap": ("up.weight", {"lengths": [8, 8]}),
    "h-global": ("down.bias", {"global_shape": [9]}),
    "h-path": ("embed.weight", {"file": "../../etc/passwd"}),
}


def blob_of(d, edit=None):
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
        if edit and kind in (0, 1) and int(m.group(1)) == 1:
            meta = json.loads(b)
            meta["metadata"][edit[0]].update(edit[1])
            b = json.dumps(meta, indent=4).encode()
        head = bytes([kind, int(m.group(1)), int(m.group(2) or 0)])
        blob += struct.pack("<I", len(b) + 3) + head + b
    return blob


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "colossal",
                                       "colossal-*", "*", ""))):
    d = os.path.dirname(d)
    seeds = [(os.path.basename(d), None)]
    if os.path.basename(d) == "st-sharded":
        seeds += sorted(HOSTILE.items())
    for name, edit in seeds:
        blob = blob_of(d, edit)
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
        print("seed", name, len(blob), "bytes")
