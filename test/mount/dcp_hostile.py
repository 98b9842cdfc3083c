"""dcp_hostile - hostile variants of a real torch 1.13 DCP checkpoint.

    /usr/bin/python3 dcp_hostile.py STORE OUTSIDE

Writes, with Debian's torch 1.13 (save_state_dict, no_dist=True), one
small checkpoint and then copies of it in STORE that a hostile or broken
writer could leave, each changed in one way by unpickling its .metadata
with torch and pickling it back with a field changed (what a real torch
would read), or by changing the files:

  good/         as written
  evil-global/  .metadata names os.system (planner_data = os.system)
  escape/       w's chunk at relative_path ../../OUTSIDE-name/FILE
  abs/          w's chunk at an absolute relative_path (/etc/passwd)
  symlink/      w's chunk file is a symlink to a copy in OUTSIDE
  short/        w's chunk file cut short
  torn/         .metadata cut in half
  partial/      no .metadata (a save still running)
  junkchunk/    w's chunk archive overwritten with zeros
  twopkl/       w's chunk archive with its entry archive/version renamed
                others/data.pkl in place (same length): two data.pkl,
                readers disagree on which is the pickle (issue 30)

OUTSIDE (outside STORE) gets the real chunk files the escapes point at.
Prints a JSON object: {"tensors": {name: [dtype, shape, hex bytes]},
"objects": [keys], "victim": "w"}.
"""

import json
import os
import pickle
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402


def main():
    store, outside = sys.argv[1], sys.argv[2]
    os.makedirs(outside, exist_ok=True)
    good = os.path.join(store, "good")
    sd = {"w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
          "b": torch.arange(6, dtype=torch.int64) * -3,
          "step": 11}
    dcp.save_state_dict(sd, dcp.FileSystemWriter(good), no_dist=True)
    with open(os.path.join(good, ".metadata"), "rb") as f:
        md = pickle.load(f)  # our own file, just written: trusted here
    victim = [k for k in md.storage_data if k.fqn == "w"][0]
    vfile = md.storage_data[victim].relative_path
    shutil.copy(os.path.join(good, vfile), os.path.join(outside, vfile))

    def variant(name, change_md=None):
        d = os.path.join(store, name)
        shutil.copytree(good, d)
        if change_md:
            with open(os.path.join(good, ".metadata"), "rb") as f:
                m = pickle.load(f)
            change_md(m)
            with open(os.path.join(d, ".metadata"), "wb") as f:
                pickle.dump(m, f, protocol=4)
        return d

    def set_path(path):
        def change(m):
            k = [k for k in m.storage_data if k.fqn == "w"][0]
            m.storage_data[k].relative_path = path
        return change

    variant("evil-global", lambda m: setattr(m, "planner_data", os.system))
    rel_out = os.path.relpath(outside, os.path.join(store, "escape"))
    variant("escape", set_path(os.path.join(rel_out, vfile)))
    variant("abs", set_path("/etc/passwd"))
    d = variant("symlink")
    os.unlink(os.path.join(d, vfile))
    os.symlink(os.path.join(outside, vfile), os.path.join(d, vfile))
    d = variant("short")
    with open(os.path.join(d, vfile), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(good, vfile)) // 2)
    d = variant("torn")
    mdp = os.path.join(d, ".metadata")
    with open(mdp, "r+b") as f:
        f.truncate(os.path.getsize(mdp) // 2)
    d = variant("partial")
    os.unlink(os.path.join(d, ".metadata"))
    d = variant("junkchunk")
    with open(os.path.join(d, vfile), "r+b") as f:
        f.write(bytes(os.path.getsize(os.path.join(good, vfile))))

    d = variant("twopkl")
    si = md.storage_data[victim]
    with open(os.path.join(d, vfile), "r+b") as f:
        f.seek(si.offset)
        chunk = f.read(si.length)
        assert chunk.count(b"archive/version") == 2  # local + central header
        f.seek(si.offset)
        f.write(chunk.replace(b"archive/version", b"others/data.pkl"))

    out = {"tensors": {}, "objects": ["step"], "victim": "w"}
    names = {torch.float32: "F32", torch.int64: "I64"}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out["tensors"][k] = [names[v.dtype], list(v.shape),
                                 v.contiguous().numpy().tobytes().hex()]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
