"""log_hostile - a real torch 1.13 DCP checkpoint whose keys would forge
log lines.

    /usr/bin/python3 log_hostile.py DIR BIGDIR

Writes, with Debian's torch 1.13 (save_state_dict, no_dist=True), a
checkpoint in DIR whose state dict holds "ok" and two keys a hostile
writer chose: one with U+2028 and the text of a forged log line after it,
one with bidi controls (U+202E, U+2066, U+2069). Then, as dcp_hostile.py
does, unpickles its .metadata with torch and pickles it back with the
chunks of those two keys at an absolute relative_path, so the mount leaves
them out with one log line each (the line that quotes the key).

BIGDIR gets a pytorch_model.bin (torch.save) of two expanded uint8 tensors
of 2^62 elements each (stride 0: one stored byte each) and a small one:
each tensor's size fits in off_t, their sum (the model.safetensors view)
does not.

Prints a JSON object: {"forged": [keys], "ok": "ok"}.
"""

import json
import os
import pickle
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402

FORGED = ["w\u2028shardfs: error: FORGED LINE",
          "b\u202eevil\u2066x\u2069"]


def main():
    d, bigdir = sys.argv[1], sys.argv[2]
    sd = {"ok": torch.arange(6, dtype=torch.float32)}
    for i, k in enumerate(FORGED):
        sd[k] = torch.full((2, 3), float(i + 1))
    dcp.save_state_dict(sd, dcp.FileSystemWriter(d), no_dist=True)
    mdp = os.path.join(d, ".metadata")
    with open(mdp, "rb") as f:
        md = pickle.load(f)  # our own file, just written: trusted here
    n = 0
    for k in md.storage_data:
        if k.fqn in FORGED:
            md.storage_data[k].relative_path = "/etc/passwd"
            n += 1
    if n != len(FORGED):
        sys.exit("the forged keys have %d chunks, not %d" % (n, len(FORGED)))
    with open(mdp, "wb") as f:
        pickle.dump(md, f, protocol=4)
    os.makedirs(bigdir, exist_ok=True)
    big = {"a": torch.zeros(1, dtype=torch.uint8).expand(2 ** 62),
           "b": torch.ones(1, dtype=torch.uint8).expand(2 ** 62),
           "c": torch.arange(4)}
    torch.save(big, os.path.join(bigdir, "pytorch_model.bin"))
    json.dump({"forged": FORGED, "ok": "ok"}, sys.stdout)


if __name__ == "__main__":
    main()
