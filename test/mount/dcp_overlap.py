"""dcp_overlap - overlapping and replicated chunks in a real torch 1.13 DCP
checkpoint (issue 30, item 2).

    /usr/bin/python3 dcp_overlap.py STORE

Writes, with Debian's torch 1.13 (save_state_dict, no_dist=True), one
checkpoint, and copies of it in STORE whose .metadata is unpickled with
torch, changed, and pickled back:

  ov-partial/  w [3, 6] as two chunks that overlap partially: [0, 0] 3 x 4
               (the zeros of tensor a) and [0, 2] 3 x 4 (the ones of b)
  ov-repdiff/  w's chunk listed twice (as ranks that all wrote a replicated
               tensor list it) and two storage_data entries for its key:
               the one written, then a copy holding -w in __1_0.distcp
               (torch's dict keeps the last: that is what dcp.load reads)
  ov-repsame/  the same with __1_0.distcp an identical copy of the bytes

Two storage_data entries of one key cannot live in a Python dict
(MetadataIndex compares fqn and offset): they are pickled while
MetadataIndex also compares its index, as a writer that appended both
would leave them; torch reads such a file as it reads any.

Then reads every variant back with torch's own dcp.load_state_dict and
prints a JSON object: {VARIANT: {"w": hex of w as torch loads it,
"others": {name: hex}}}.
"""

import contextlib
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
from torch.distributed._shard.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata, MetadataIndex)


def load_md(d):
    with open(os.path.join(d, ".metadata"), "rb") as f:
        return pickle.load(f)  # our own file, just written: trusted here


def dump_md(m, d):
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(m, f, protocol=4)


@contextlib.contextmanager
def keys_with_index():
    """MetadataIndex compares its index too, meanwhile: equal keys with
    other indexes stay apart in a dict (and in its pickle)."""
    eq, h = MetadataIndex.__eq__, MetadataIndex.__hash__
    MetadataIndex.__eq__ = lambda a, b: (a.fqn, a.offset, a.index) == \
        (b.fqn, b.offset, b.index)
    MetadataIndex.__hash__ = lambda a: hash((a.fqn, a.offset, a.index))
    try:
        yield
    finally:
        MetadataIndex.__eq__, MetadataIndex.__hash__ = eq, h


def torch_load(d, shapes):
    sd = {k: torch.empty(s, dtype=torch.float32) for k, s in shapes.items()}
    dcp.load_state_dict(sd, dcp.FileSystemReader(d), no_dist=True)
    return {k: v.contiguous().numpy().tobytes().hex() for k, v in sd.items()}


def main():
    store = sys.argv[1]
    base = os.path.join(store, ".base")
    neg = os.path.join(store, ".neg")
    w = torch.arange(18, dtype=torch.float32).reshape(3, 6)
    sd = {"w": w, "a": torch.zeros(3, 4), "b": torch.ones(3, 4),
          "c": torch.arange(5, dtype=torch.float32) * 2, "step": 3}
    dcp.save_state_dict(sd, dcp.FileSystemWriter(base), no_dist=True)
    dcp.save_state_dict({"w": -w - 1}, dcp.FileSystemWriter(neg), no_dist=True)
    out = {}

    # ov-partial: w from a's and b's stored bytes, overlapping in columns 2-3
    d = os.path.join(store, "ov-partial")
    shutil.copytree(base, d)
    m = load_md(base)
    st = m.state_dict_metadata["w"]
    st.chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([3, 4])),
                 ChunkStorageMetadata(offsets=torch.Size([0, 2]), sizes=torch.Size([3, 4]))]
    sa = [v for k, v in m.storage_data.items() if k.fqn == "a"][0]
    sb = [v for k, v in m.storage_data.items() if k.fqn == "b"][0]
    for k in [k for k in m.storage_data if k.fqn == "w"]:
        del m.storage_data[k]
    m.storage_data[MetadataIndex("w", [0, 0], 0)] = sa
    m.storage_data[MetadataIndex("w", [0, 2], 1)] = sb
    dump_md(m, d)

    # ov-repdiff, ov-repsame: w's chunk twice, two storage entries of its key
    mneg = load_md(neg)
    wneg = [v for k, v in mneg.storage_data.items() if k.fqn == "w"][0]
    for name in ("ov-repdiff", "ov-repsame"):
        d = os.path.join(store, name)
        shutil.copytree(base, d)
        m = load_md(base)
        st = m.state_dict_metadata["w"]
        st.chunks = [st.chunks[0], ChunkStorageMetadata(offsets=st.chunks[0].offsets,
                                                        sizes=st.chunks[0].sizes)]
        (k0, s0), = [(k, v) for k, v in m.storage_data.items() if k.fqn == "w"]
        if name == "ov-repdiff":
            shutil.copy(os.path.join(neg, wneg.relative_path),
                        os.path.join(d, "__1_0.distcp"))
            s1 = type(wneg)(relative_path="__1_0.distcp", offset=wneg.offset,
                            length=wneg.length)
        else:
            shutil.copy(os.path.join(base, s0.relative_path),
                        os.path.join(d, "__1_0.distcp"))
            s1 = type(s0)(relative_path="__1_0.distcp", offset=s0.offset,
                          length=s0.length)
        del m.storage_data[k0]
        with keys_with_index():
            m.storage_data = dict(m.storage_data)
            m.storage_data[MetadataIndex("w", [0, 0], 0)] = s0
            m.storage_data[MetadataIndex("w", [0, 0], 1)] = s1
            assert len([k for k in m.storage_data if k.fqn == "w"]) == 2
            dump_md(m, d)

    for name in ("ov-partial", "ov-repdiff", "ov-repsame"):
        d = os.path.join(store, name)
        got = torch_load(d, {"w": (3, 6), "a": (3, 4), "b": (3, 4), "c": (5,)})
        out[name] = {"w": got.pop("w"), "others": got}
    out["original_w"] = w.numpy().tobytes().hex()
    shutil.rmtree(base)
    shutil.rmtree(neg)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
