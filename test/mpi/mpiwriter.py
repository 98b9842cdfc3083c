#!/usr/bin/python3
"""mpiwriter - one rank's writer process for the MPI write tests.

Role: run a JSON plan of SPEC section 4 file calls against this rank's own
mount: mkdir of the checkpoint, declarations (create + the dtype and shape
xattrs), box shards written sequentially into `tensors/NAME@SPEC` in
uneven write sizes, flat runs pwritten into `tensors/NAME`, and root files.
Shard bytes come from a source file (the tensor's unsharded bytes), taken
at the box's or run's positions, optionally XORed to make a conflicting
copy. Exits 0 when every call succeeded, 1 with the failing call printed
otherwise. Standard library + numpy only (run with /usr/bin/python3).

usage: mpiwriter.py PLAN.json
  plan = {"root": MOUNT/CKPT, "ops": [op, ...]}
  op   = {"op": "declare", "name", "dtype", "shape"}
       | {"op": "box", "name", "src", "itemsize", "shape", "box": [[a, b], ...], "xor"}
       | {"op": "flat", "name", "src", "runs": [[off, len], ...], "chunk"}
       | {"op": "file", "name", "src"}
"""

import json
import os
import sys

import numpy as np

UINT = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}
MAX_SRC = 1 << 30       # a source file larger than this is a plan error


def read_src(path):
    if os.path.getsize(path) > MAX_SRC:
        raise ValueError("source %s is too large" % path)
    with open(path, "rb") as f:
        return f.read()


def box_bytes(src, itemsize, shape, box):
    a = np.frombuffer(src, dtype=UINT[itemsize]).reshape(tuple(shape))
    return a[tuple(slice(x, y) for x, y in box)].tobytes()


def spec_of(box):
    return ",".join("%d:%d" % (a, b) for a, b in box)


def write_all(fd, data, sizes):
    """write() data sequentially in the cycling sizes."""
    pos, i = 0, 0
    while pos < len(data):
        n = os.write(fd, data[pos:pos + sizes[i % len(sizes)]])
        if n <= 0:
            raise OSError("short write")
        pos += n
        i += 1


def do_op(root, op):
    tdir = os.path.join(root, "tensors")
    kind = op["op"]
    if kind == "declare":
        p = os.path.join(tdir, op["name"])
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        os.setxattr(p, "user.shardfs.dtype", op["dtype"].encode())
        os.setxattr(p, "user.shardfs.shape",
                    json.dumps(op["shape"]).replace(" ", "").encode())
    elif kind == "box":
        data = box_bytes(read_src(op["src"]), op["itemsize"], op["shape"],
                         op["box"])
        if op.get("xor"):
            data = bytes(b ^ op["xor"] for b in data)
        p = os.path.join(tdir, op["name"]) + "@" + spec_of(op["box"])
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            write_all(fd, data, [7777, 65536, 1, 300000])
        finally:
            os.close(fd)
    elif kind == "flat":
        src = read_src(op["src"])
        chunk = op.get("chunk", 1 << 20)
        fd = os.open(os.path.join(tdir, op["name"]), os.O_WRONLY)
        try:
            for off, ln in op["runs"]:
                pos = off
                while pos < off + ln:
                    n = min(chunk, off + ln - pos)
                    if os.pwrite(fd, src[pos:pos + n], pos) != n:
                        raise OSError("short pwrite")
                    pos += n
        finally:
            os.close(fd)
    elif kind == "file":
        with open(os.path.join(root, op["name"]), "wb") as f:
            f.write(read_src(op["src"]))
    else:
        raise ValueError("unknown op %r" % kind)


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    root = plan["root"]
    os.makedirs(os.path.join(root, "tensors"), exist_ok=True)
    for op in plan["ops"]:
        try:
            do_op(root, op)
        except (OSError, ValueError) as e:
            print("mpiwriter: %s %s: %s" % (op["op"], op.get("name"), e))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
