"""deepspeed_seeds - seeds for fuzz_deepspeed from the checkpoints DeepSpeed
wrote.

    python3 test/fuzz/deepspeed_seeds.py test/fuzz/corpus/deepspeed

For each committed fixture (test/fixtures/deepspeed/deepspeed-*/NAME, the
tag `latest` names, and each other tag directory beside it as
NAME@TAG): the parts model states, then each rank's optimizer
states in rank order, each as a 4-byte little-endian length and its bytes
(see fuzz_deepspeed.c). Stdlib only.
"""
import glob
import os
import re
import struct
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
def seed(d, tag, suffix):
    model = (glob.glob(os.path.join(tag, "mp_rank_00_model_states.pt")) +
             glob.glob(os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt")))[0]
    ranks = sorted(glob.glob(os.path.join(tag, "*_mp_rank_00_optim_states.pt")),
                   key=lambda p: int(re.search(r"zero_pp_rank_(\d+)_", p).group(1)))
    blob = b""
    for p in [model] + ranks:
        with open(p, "rb") as f:
            b = f.read()
        blob += struct.pack("<I", len(b)) + b
    name = "%s-%s%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d),
                        suffix)
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")


for latest in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "deepspeed",
                                            "deepspeed-*", "*", "latest"))):
    d = os.path.dirname(latest)
    with open(latest) as f:
        first = f.read().strip()
    for t in [first] + sorted(x for x in os.listdir(d) if x != first):
        tag = os.path.join(d, t)
        if os.path.isdir(tag) and glob.glob(os.path.join(tag, "*_optim_states.pt")):
            seed(d, tag, "" if t == first else "@" + t)
