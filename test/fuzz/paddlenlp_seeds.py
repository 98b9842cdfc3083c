"""paddlenlp_seeds - seeds for fuzz_paddlenlp from the unified checkpoints
paddlenlp wrote.

    python3 test/fuzz/paddlenlp_seeds.py test/fuzz/corpus/paddlenlp

For each committed fixture (test/fixtures/paddlenlp/paddlenlp-*/NAME): the
parts fuzz_paddlenlp.c names, in its order, each as a 4-byte
little-endian length and the file's bytes (an empty part where the
fixture has no such file). Stdlib only.
"""
import glob
import os
import struct
import sys

PARTS = ["model.safetensors.index.json", "optimizer.safetensors.index.json",
         "master_weights.safetensors.index.json", "config.json",
         "model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors",
         "master_weights-00001-of-00001.safetensors"]
TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "paddlenlp",
                                       "paddlenlp-*", "*", ""))):
    d = d.rstrip("/")
    blob = b""
    for p in PARTS:
        b = b""
        if os.path.exists(os.path.join(d, p)):
            with open(os.path.join(d, p), "rb") as f:
                b = f.read()
        blob += struct.pack("<I", len(b)) + b
    name = "%s-%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d))
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")
