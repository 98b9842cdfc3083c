#!/usr/bin/python3
"""shardfs_save - save one rank's shards of a state dict through its shardfs mount.

This is the writer example of SPEC section 4: a rank process talks only to
the shardfs daemon of its own rank, through ordinary file calls. Copy it,
or import it:

    import shardfs_save as sfs
    sfs.save("/mnt/sf", "step-3000", [
        sfs.Shard("wq", wq_local, shape=[4096, 4096], offsets=[1024 * rank, 0]),  # box
        sfs.Shard("embed", flat_part, shape=[32000, 4096], flat=byte_off),        # flat range
        sfs.Shard("norm", norm),                                                  # whole tensor
    ], files={"config.json": json.dumps(cfg)}, commit=True)

What save() does, in order (every step is idempotent, so every rank runs it):
  1. mkdir -p MOUNT/CKPT/tensors (and subdirectories for names with '/');
  2. declare each tensor: create tensors/NAME, set user.shardfs.dtype and
     user.shardfs.shape (declarations must agree across ranks);
  3. write each shard: a box into tensors/NAME@START:STOP,... sequentially
     from offset 0; a flat range with pwrite at its byte offset of the
     flattened tensor (one handle, so adjacent ranges join one shard);
  4. write root files (config.json, tokenizer files) as plain files;
  5. close everything (a close error means the shard was dropped), then
     commit: setxattr user.shardfs.commit = 1 on MOUNT/CKPT. Under MPI every
     rank must commit (the commit is collective across the daemons).
commit() raises CommitError carrying the daemon's reason (user.shardfs.state,
e.g. "failed: tensor 'wq': gap at ..."), and the checkpoint stays writable.

Data: numpy arrays, or torch tensors when torch is importable (BF16 is
written through an int16 view). numpy has no BF16 or F8: pass the raw bits
as a uint16 / uint8 array with dtype="BF16" / "F8_E4M3". Bytes are written
row-major little-endian. Standard library + numpy (+ torch if present).

CLI:
  shardfs_save.py demo MOUNT CKPT [--rank R --world W --seed S --no-commit --check]
      save rank R's shards of a small random state dict (the same full
      tensors on every rank, from the seed), then commit; --check reads the
      committed tensors back and compares them with the full state dict.
  shardfs_save.py commit MOUNT CKPT     commit; print the reason on failure
  shardfs_save.py state MOUNT CKPT      print user.shardfs.state
"""

import argparse
import json
import os
import sys
from collections import namedtuple

import numpy as np

try:
    import torch
except ImportError:        # numpy alone is enough
    torch = None

STATE_MAX = 4096           # bytes of user.shardfs.state we read back

# numpy dtype (little-endian) -> safetensors dtype name
_NP_TO_ST = {
    "<f8": "F64", "<f4": "F32", "<f2": "F16",
    "<i8": "I64", "<i4": "I32", "<i2": "I16", "|i1": "I8",
    "<u8": "U64", "<u4": "U32", "<u2": "U16", "|u1": "U8", "|b1": "BOOL",
}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
            "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2,
            "U8": 1, "BOOL": 1}


class Shard(namedtuple("Shard", "name data shape offsets flat dtype")):
    """One local piece of a tensor.

    name     tensor name ('/' in it makes subdirectories under tensors/)
    data     the local piece: numpy array or torch tensor
    shape    the FULL tensor's shape (default: data's shape, a whole tensor)
    offsets  a box: the piece's start along every dimension, in elements;
             it lands at tensors/NAME@o0:o0+n0,o1:o1+n1,...
    flat     a flat range: the piece's byte offset in the flattened tensor
             (data is taken as flat bytes, whatever its shape; it may be
             raw bytes cut anywhere, with dtype= and shape= given)
    dtype    safetensors dtype name (default: from data's dtype)
    Neither offsets nor flat: the whole tensor, written flat at offset 0
    (replicated tensors are simply saved whole by every rank).
    """
    __slots__ = ()

    def __new__(cls, name, data, shape=None, offsets=None, flat=None, dtype=None):
        if offsets is not None and flat is not None:
            raise ValueError("%s: a shard is a box or a flat range, not both" % name)
        return super().__new__(cls, name, data, shape, offsets, flat, dtype)


class CommitError(OSError):
    """The daemon refused the commit; .reason is its user.shardfs.state."""

    def __init__(self, err, path, reason):
        super().__init__(err, "commit of %s: %s" % (path, reason))
        self.reason = reason


def as_bytes(data, dtype=None):
    """(safetensors dtype name, shape, row-major little-endian bytes as a
    memoryview, no copy when data already is contiguous little-endian)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        if dtype is None:
            raise TypeError("raw bytes need dtype=")
        return dtype, (len(data),), memoryview(data).cast("B")
    if torch is not None and isinstance(data, torch.Tensor):
        t = data.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t, dtype = t.view(torch.int16), dtype or "BF16"
        data = t.numpy()
    a = np.asarray(data)
    le = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    a = np.asarray(a, dtype=le, order="C")     # keeps 0-d arrays 0-d
    name = dtype or _NP_TO_ST.get(a.dtype.str)
    if name not in ITEMSIZE:
        raise TypeError("no safetensors dtype for numpy %s (pass dtype=)" % a.dtype)
    if ITEMSIZE[name] != a.dtype.itemsize:
        raise TypeError("dtype %s does not match numpy %s" % (name, a.dtype))
    return name, a.shape, memoryview(a.reshape(-1).view(np.uint8))


def _pwrite_all(fd, buf, off):
    view = memoryview(buf)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def _write_new(path, buf, off=0, flags=0):
    """Open path for writing, write buf at off, close; a close error (a shard
    the daemon dropped) raises like a write error."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        _pwrite_all(fd, buf, off)
    finally:
        os.close(fd)


def declare(mount, ckpt, name, dtype, shape):
    """Create tensors/NAME and set its dtype and shape (idempotent)."""
    path = os.path.join(mount, ckpt, "tensors", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    os.setxattr(path, "user.shardfs.dtype", dtype.encode())
    os.setxattr(path, "user.shardfs.shape",
                json.dumps([int(d) for d in shape], separators=(",", ":")).encode())


def write_shard(mount, ckpt, shard):
    """Declare the shard's tensor and write its bytes (box or flat)."""
    dtype, local_shape, buf = as_bytes(shard.data, shard.dtype)
    shape = list(shard.shape if shard.shape is not None else local_shape)
    declare(mount, ckpt, shard.name, dtype, shape)
    path = os.path.join(mount, ckpt, "tensors", shard.name)
    if shard.offsets is not None:
        if len(shard.offsets) != len(shape) or len(local_shape) != len(shape):
            raise ValueError("%s: box of %d dims in a tensor of %d" % (
                shard.name, len(shard.offsets), len(shape)))
        spec = ",".join("%d:%d" % (o, o + n) for o, n in zip(shard.offsets, local_shape))
        _write_new(path + "@" + spec, buf)
    else:
        _write_new(path, buf, shard.flat or 0)


def write_file(mount, ckpt, name, content):
    """A plain file at the checkpoint root (config.json, tokenizer files)."""
    if isinstance(content, str):
        content = content.encode()
    _write_new(os.path.join(mount, ckpt, name), content, flags=os.O_TRUNC)


def state(mount, ckpt):
    """The checkpoint's state: "writing", "committed" or "failed: REASON"."""
    return os.getxattr(os.path.join(mount, ckpt), "user.shardfs.state").decode(
        errors="replace")[:STATE_MAX]


def commit(mount, ckpt):
    """Commit (collective under MPI); raise CommitError with the reason."""
    path = os.path.join(mount, ckpt)
    try:
        os.setxattr(path, "user.shardfs.commit", b"1")
    except OSError as e:
        try:
            reason = state(mount, ckpt)
        except OSError as e2:
            reason = "(state unreadable: %s)" % e2.strerror
        raise CommitError(e.errno, path, reason) from None


_commit = commit           # save()'s `commit` argument hides the function


def save(mount, ckpt, shards, files=None, commit=True):
    """Save this rank's shards (iterable of Shard) and root files
    ({name: bytes or str}) into MOUNT/CKPT, then commit unless told not to."""
    os.makedirs(os.path.join(mount, ckpt, "tensors"), exist_ok=True)
    for shard in shards:
        write_shard(mount, ckpt, shard)
    for name, content in sorted((files or {}).items()):
        write_file(mount, ckpt, name, content)
    if commit:
        _commit(mount, ckpt)


# ----------------------------------------------------------------- demo

def demo_state_dict(seed):
    """A small state dict, identical on every rank for the same seed."""
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    bf16 = lambda *s: (f32(*s).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    return {
        "embed.weight": ("BF16", bf16(512, 64)),        # flat ranges (FSDP-style)
        "layers/0/attn.wq": ("BF16", bf16(64, 64)),     # dim-0 boxes (column-parallel)
        "layers/0/attn.wo": ("BF16", bf16(64, 64)),     # dim-1 boxes (row-parallel)
        "layers/0/mlp.w1": (None, f32(128, 64)),        # dim-0 boxes, F32
        "layers/0/norm": (None, f32(64)),               # replicated
        "step": (None, np.array([3000], dtype=np.int64)),  # replicated
    }


def demo_shards(sd, rank, world):
    """Rank `rank`'s pieces of the demo state dict, tensor-parallel style."""
    shards = []
    for name, (dt, full) in sorted(sd.items()):
        if name.startswith("embed"):
            raw = full.tobytes()      # cuts need not fall on elements
            cut = lambda r: len(raw) * r // world + (3 if 0 < r < world else 0)  # noqa: E731
            shards.append(Shard(name, raw[cut(rank):cut(rank + 1)], shape=full.shape,
                                flat=cut(rank), dtype=dt))
        elif name.endswith(("wq", "w1", "wo")):
            dim = 1 if name.endswith("wo") else 0
            n = full.shape[dim] // world
            piece = np.take(full, range(rank * n, full.shape[dim] if rank == world - 1
                                        else (rank + 1) * n), axis=dim)
            offs = [0, 0]
            offs[dim] = rank * n
            shards.append(Shard(name, piece, shape=full.shape, offsets=offs, dtype=dt))
        else:
            shards.append(Shard(name, full, dtype=dt))
    return shards


def demo_check(mount, ckpt, sd):
    """Read every committed tensor back; return the names that differ."""
    bad = []
    for name, (dt, full) in sorted(sd.items()):
        with open(os.path.join(mount, ckpt, "tensors", name), "rb") as f:
            if f.read() != as_bytes(full, dt)[2]:
                bad.append(name)
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="save one rank's shards of a random state dict")
    for p in (d, sub.add_parser("commit"), sub.add_parser("state")):
        p.add_argument("mount")
        p.add_argument("ckpt")
    d.add_argument("--rank", type=int, default=0)
    d.add_argument("--world", type=int, default=1)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-commit", action="store_true")
    d.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "state":
            print(state(args.mount, args.ckpt))
        elif args.cmd == "commit":
            commit(args.mount, args.ckpt)
            print("committed %s" % os.path.join(args.mount, args.ckpt))
        else:
            if not 0 <= args.rank < args.world:
                ap.error("--rank must be in [0, --world)")
            sd = demo_state_dict(args.seed)
            shards = demo_shards(sd, args.rank, args.world)
            save(args.mount, args.ckpt, shards,
                 files={"config.json": json.dumps({"seed": args.seed, "world": args.world})}
                 if args.rank == 0 else None, commit=not args.no_commit)
            print("rank %d: saved %d shards of %d tensors%s" % (
                args.rank, len(shards), len(sd), "" if args.no_commit else ", committed"))
            if args.check and not args.no_commit:
                bad = demo_check(args.mount, args.ckpt, sd)
                if bad:
                    print("read back differs: %s" % ", ".join(bad), file=sys.stderr)
                    return 1
                print("read back: %d tensors equal" % len(sd))
    except OSError as e:
        print("shardfs_save: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
