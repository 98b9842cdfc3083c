"""dcp_bomb - zstd "bombs" made from real torch 1.13 DCP saves.

    /usr/bin/python3 dcp_bomb.py STORE K N

Writes, with Debian's torch 1.13 (save_state_dict, no_dist=True), three
checkpoints in STORE. Each starts as a real save; the bombs are then
changed the way torch 2.x's ZStandard extension would have written them:
their .metadata is unpickled with torch, fields changed, pickled back.

  good13/        {"w": a 4 x 6 ramp, "step": 11} as written
  bomb-shared/   the same plus K small tensors t000.., each then made a
                 62914560-element float32 tensor whose chunk is ONE zstd
                 stream appended to the .distcp file: torch.save of
                 torch.zeros(62914560) (240 MiB) compressed by the zstd
                 CLI to a few KB. All K storage_data entries name the same
                 (file, offset, length), with transform_descriptors
                 ["stream.zstd/1"] as torch 2.x names its zstd transform
                 (torch 1.13 has none). A valid checkpoint of zeros.
  bomb-many/     as bomb-shared with N tensors, each naming its own copy
                 of the stream (N distinct offsets): N x 240 MiB to decode.

Prints a JSON object: {"numel": n, "frame": bytes of one stream,
"k": K, "n": N, "w": [the ramp as float32 hex]}.
"""

import dataclasses
import io
import json
import os
import pickle
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import torch113  # noqa: F401,E402  (torch 1.13 on Python 3.11)
import torch  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402

NUMEL = (240 << 20) // 4
ZSTD = "stream.zstd/1"


def zstd_frame():
    """torch.save of NUMEL float32 zeros, as one zstd frame (zstd CLI)."""
    buf = io.BytesIO()
    torch.save(torch.zeros(NUMEL, dtype=torch.float32), buf)
    r = subprocess.run(["zstd", "-19", "-q", "-c"], input=buf.getvalue(),
                       stdout=subprocess.PIPE, check=True, timeout=120)
    return r.stdout


def with_field(obj, **kw):
    try:
        for k, v in kw.items():
            setattr(obj, k, v)
        return obj
    except dataclasses.FrozenInstanceError:
        return dataclasses.replace(obj, **kw)


def save(d, sd):
    dcp.save_state_dict(sd, dcp.FileSystemWriter(d), no_dist=True)


def bomb(store, name, w, count, frame, shared):
    d = os.path.join(store, name)
    keys = ["t%03d" % i for i in range(count)]
    sd = {"w": w, "step": 11}
    sd.update({k: torch.zeros(4) for k in keys})
    save(d, sd)
    with open(os.path.join(d, ".metadata"), "rb") as f:
        md = pickle.load(f)  # our own file, just written: trusted here
    files = sorted({info.relative_path for info in md.storage_data.values()})
    rel = files[0]
    path = os.path.join(d, rel)
    offs = []
    with open(path, "ab") as f:
        for i in range(1 if shared else count):
            offs.append(f.tell())
            f.write(frame)
    size = torch.Size([NUMEL])
    for i, k in enumerate(keys):
        tsm = md.state_dict_metadata[k]
        tsm = with_field(tsm, size=size)
        tsm = with_field(tsm, chunks=[with_field(c, sizes=size)
                                      for c in tsm.chunks])
        md.state_dict_metadata[k] = tsm
    for idx in list(md.storage_data):
        if idx.fqn not in keys:
            continue
        i = keys.index(idx.fqn)
        info = md.storage_data[idx]
        info = with_field(info, relative_path=rel,
                          offset=offs[0 if shared else i], length=len(frame))
        info.transform_descriptors = [ZSTD]  # what torch 2.x's writer adds
        md.storage_data[idx] = info
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(md, f, protocol=4)


def main():
    store, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(store, exist_ok=True)
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    save(os.path.join(store, "good13"), {"w": w, "step": 11})
    frame = zstd_frame()
    bomb(store, "bomb-shared", w, k, frame, True)
    bomb(store, "bomb-many", w, n, frame, False)
    print(json.dumps({"numel": NUMEL, "frame": len(frame), "k": k, "n": n,
                      "w": w.numpy().tobytes().hex()}))


if __name__ == "__main__":
    main()
