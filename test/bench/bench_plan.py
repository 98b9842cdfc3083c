#!/usr/bin/python3
"""bench_plan.py - list what bench.sh reads through a mount.

Usage: bench_plan.py CKPT_DIR MOUNT_ROOT tensors|slices
  tensors  MOUNT_ROOT/tensors/NAME for every tensor of the manifest
  slices   for every tensor sharded along dimension 1 (box shards whose
           dim-1 range is not the whole dimension), one slice path
           MOUNT_ROOT/tensors/NAME@S:E,S:E,... per distinct shard box, so
           the slices cover exactly the tensor's bytes
Prints one path per line. Reads only the manifest (bounded by its size)."""

import json
import os
import sys

MAX_MANIFEST = 256 << 20


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in ("tensors", "slices"):
        sys.stderr.write(__doc__)
        return 2
    ckpt, root, mode = sys.argv[1:]
    path = os.path.join(ckpt, "manifest.json")
    if os.path.getsize(path) > MAX_MANIFEST:
        sys.stderr.write("manifest too large\n")
        return 1
    with open(path) as f:
        man = json.load(f)
    out = []
    for name in sorted(man["tensors"]):
        t = man["tensors"][name]
        base = os.path.join(root, "tensors", name)
        if mode == "tensors":
            out.append(base)
            continue
        shape = t["shape"]
        boxes = sorted({(tuple(s["offsets"]), tuple(s["lengths"]))
                        for s in t["shards"] if "offsets" in s})
        if len(shape) < 2 or not boxes or len(boxes) != len(t["shards"]):
            continue
        if all(l[1] == shape[1] for _, l in boxes):
            continue               # not split along dimension 1
        for offs, lens in boxes:
            spec = ",".join("%d:%d" % (o, o + l) for o, l in zip(offs, lens))
            out.append(base + "@" + spec)
    sys.stdout.write("".join(p + "\n" for p in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
