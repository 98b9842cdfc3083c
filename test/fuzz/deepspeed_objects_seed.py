"""deepspeed_objects_seed - seeds that reach DeepSpeed's objects/ caps
(sf_deepspeed_obj.c's sf_ds_obj_held, sf_pickle_write.c) from a checkpoint
DeepSpeed wrote, with Debian's torch 1.13:

    /usr/bin/python3 test/fuzz/deepspeed_objects_seed.py test/fuzz/corpus

corpus/deepspeed/client-state-caps: zero2-2r's global_step2 with its model
states saved again holding client state: one string referenced 30000
times (the memo shares it; written out it passes 1 MiB), a list nested
100 deep, a plain int (parts as fuzz_deepspeed.c reads them).
corpus/pickle/objects-memo-deep: the same client state alone, pickled by
Python (protocol 2), for fuzz_pickle's write-back.
"""
import collections
import glob
import io
import os
import pickle
import struct
import sys

import torch

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
tag = os.path.join(TOP, "test", "fixtures", "deepspeed", "deepspeed-0.19.8",
                   "zero2-2r", "global_step2")


def client_state():
    deep = 1
    for _ in range(100):
        deep = [deep]
    return {"huge": ["x" * 100] * 30000, "deep": deep, "client_step": 7,
            "od": collections.OrderedDict([("a", 1.5), ("b", None)])}


sd = torch.load(os.path.join(tag, "mp_rank_00_model_states.pt"))
sd.update(client_state())
buf = io.BytesIO()
torch.save(sd, buf)
blob = struct.pack("<I", len(buf.getvalue())) + buf.getvalue()
for p in sorted(glob.glob(os.path.join(tag, "*_optim_states.pt"))):
    with open(p, "rb") as f:
        b = f.read()
    blob += struct.pack("<I", len(b)) + b
os.makedirs(os.path.join(out, "deepspeed"), exist_ok=True)
with open(os.path.join(out, "deepspeed", "client-state-caps"), "wb") as f:
    f.write(blob)
with open(os.path.join(out, "pickle", "objects-memo-deep"), "wb") as f:
    f.write(pickle.dumps(client_state(), protocol=2))
print("seeds written:", len(blob), "bytes and a pickle")
