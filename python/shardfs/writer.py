"""shardfs.writer - save one rank's shards of a state dict through its
shardfs mount (SPEC section 4).

A rank process talks only to the shardfs daemon of its own rank, through
ordinary file calls:

    import shardfs
    shardfs.save("/mnt/sf", "step-3000", [
        shardfs.Shard("wq", wq_local, shape=[4096, 4096], offsets=[1024 * rank, 0]),  # box
        shardfs.Shard("embed", flat_part, shape=[32000, 4096], flat=byte_off),        # flat range
        shardfs.Shard("norm", norm),                                                  # whole tensor
    ], files={"config.json": json.dumps(cfg)}, commit=True)

What save() does, in order (every step is idempotent, so every rank runs it):
  1. mkdir -p MOUNT/CKPT/tensors (and subdirectories for names with '/');
  2. declare every tensor: many per setxattr of user.shardfs.declare on
     tensors/ (declare_many: a JSON object, at most DECLARE_BATCH bytes
     each), else one by one: create tensors/NAME, set user.shardfs.dtype and
     user.shardfs.shape (declarations must agree across ranks);
  3. write each shard: a box into tensors/NAME@START:STOP,... sequentially
     from offset 0; a flat range with pwrite at its byte offset of the
     flattened tensor (one handle, so adjacent ranges join one shard);
     save() opens them relative to an open tensors/ (openat);
  4. write root files (config.json, tokenizer files) as plain files;
  5. close everything (a close error means the shard was dropped), then
     commit: setxattr user.shardfs.commit = 1 on MOUNT/CKPT. Under MPI every
     rank must commit (the commit is collective across the daemons).
commit() raises CommitError carrying the daemon's reason (user.shardfs.state,
e.g. "failed: tensor 'wq': gap at ..."), and the checkpoint stays writable.

Data: numpy arrays, raw bytes (with dtype=), or torch tensors (torch is
never imported here: a tensor passed in means torch is loaded already; BF16
is written through an int16 view). numpy has no BF16 or F8: pass the raw
bits as a uint16 / uint8 array with dtype="BF16" / "F8_E4M3". Bytes are
written row-major little-endian. Standard library + numpy.
"""

import errno
import json
import os
import sys
from collections import namedtuple

from .dtypes import ITEMSIZE, NP_TO_ST, np

__all__ = ["Shard", "CommitError", "ITEMSIZE", "STATE_MAX", "DECLARE_BATCH", "as_bytes",
           "declare", "declare_many", "write_shard", "write_file", "state", "commit",
           "save"]

STATE_MAX = 4096           # bytes of user.shardfs.state we read back
DECLARE_BATCH = 60000      # bytes of one user.shardfs.declare value (the kernel takes 65536)


class Shard(namedtuple("Shard", "name data shape offsets flat dtype")):
    """One local piece of a tensor.

    name     tensor name ('/' in it makes subdirectories under tensors/)
    data     the local piece: numpy array, torch tensor, or raw bytes
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


def _torch_tensor_type():
    torch = sys.modules.get("torch")        # only if the caller loaded it
    return torch, (getattr(torch, "Tensor", None) if torch else None)


def as_bytes(data, dtype=None):
    """(safetensors dtype name, shape, row-major little-endian bytes as a
    memoryview, no copy when data already is contiguous little-endian)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        if dtype is None:
            raise TypeError("raw bytes need dtype=")
        return dtype, (len(data),), memoryview(data).cast("B")
    n = np()
    torch, tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(data, tensor_type):
        t = data.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t, dtype = t.view(torch.int16), dtype or "BF16"
        data = t.numpy()
    a = n.asarray(data)
    le = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    a = n.asarray(a, dtype=le, order="C")     # keeps 0-d arrays 0-d
    name = dtype or getattr(data, "dtype_name", None) or NP_TO_ST.get(a.dtype.str)
    if name not in ITEMSIZE:
        raise TypeError("no safetensors dtype for numpy %s (pass dtype=)" % a.dtype)
    if ITEMSIZE[name] != a.dtype.itemsize:
        raise TypeError("dtype %s does not match numpy %s" % (name, a.dtype))
    return name, a.shape, memoryview(a.reshape(-1).view(n.uint8))


def _pwrite_all(fd, buf, off):
    view = memoryview(buf)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def _write_new(path, buf, off=0, flags=0, dir_fd=None):
    """Open path (relative to dir_fd when given) for writing, write buf at
    off, close; a close error (a shard the daemon dropped) raises like a
    write error."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644, dir_fd=dir_fd)
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


def declare_many(mount, ckpt, decls):
    """Declare {name: (dtype, shape)} with as few setxattr calls of
    user.shardfs.declare on tensors/ as DECLARE_BATCH allows (one request
    each instead of six per tensor). A batch the daemon refuses (EINVAL:
    a disagreeing declaration, or a daemon without user.shardfs.declare)
    is declared again one by one, so the error names its tensor."""
    tdir = os.path.join(mount, ckpt, "tensors")
    os.makedirs(tdir, exist_ok=True)
    batch, size = {}, 2

    def send():
        value = json.dumps({k: {"dtype": d, "shape": sh} for k, (d, sh) in batch.items()},
                           separators=(",", ":")).encode()
        try:
            os.setxattr(tdir, "user.shardfs.declare", value)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.E2BIG):
                raise
            for k, (d, sh) in batch.items():
                declare(mount, ckpt, k, d, sh)
        batch.clear()

    for name, (dtype, shape) in decls.items():
        shape = [int(d) for d in shape]
        one = len(json.dumps({name: {"dtype": dtype, "shape": shape}},
                             separators=(",", ":")))
        if batch and size + one > DECLARE_BATCH:
            send()
            size = 2
        batch[name] = (dtype, shape)
        size += one
    if batch:
        send()


def _shape_of(shard, local_shape):
    return [int(d) for d in (shard.shape if shard.shape is not None else local_shape)]


def write_shard(mount, ckpt, shard):
    """Declare the shard's tensor and write its bytes (box or flat)."""
    dtype, local_shape, buf = as_bytes(shard.data, shard.dtype)
    declare(mount, ckpt, shard.name, dtype, _shape_of(shard, local_shape))
    _write_declared(mount, ckpt, shard, local_shape, buf)


def _write_declared(mount, ckpt, shard, local_shape, buf, tensors_fd=None):
    """Write the bytes of a shard whose tensor is declared (box or flat);
    with tensors_fd (an open tensors/), opened relative to it, which spares
    the daemon a lookup of the checkpoint (never cached) per shard."""
    shape = _shape_of(shard, local_shape)
    path = shard.name if tensors_fd is not None else \
        os.path.join(mount, ckpt, "tensors", shard.name)
    if shard.offsets is not None:
        if len(shard.offsets) != len(shape) or len(local_shape) != len(shape):
            raise ValueError("%s: box of %d dims in a tensor of %d" % (
                shard.name, len(shard.offsets), len(shape)))
        spec = ",".join("%d:%d" % (o, o + n) for o, n in zip(shard.offsets, local_shape))
        _write_new(path + "@" + spec, buf, dir_fd=tensors_fd)
    else:
        _write_new(path, buf, shard.flat or 0, dir_fd=tensors_fd)


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
    prepared, decls = [], {}
    for shard in shards:
        dtype, local_shape, buf = as_bytes(shard.data, shard.dtype)
        want = (dtype, _shape_of(shard, local_shape))
        if decls.setdefault(shard.name, want) != want:
            raise ValueError("%s: shards of one tensor disagree on dtype or shape: %s and %s"
                             % (shard.name, decls[shard.name], want))
        prepared.append((shard, local_shape, buf))
    declare_many(mount, ckpt, decls)
    tfd = os.open(os.path.join(mount, ckpt, "tensors"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for shard, local_shape, buf in prepared:
            _write_declared(mount, ckpt, shard, local_shape, buf, tensors_fd=tfd)
    finally:
        os.close(tfd)
    for name, content in sorted((files or {}).items()):
        write_file(mount, ckpt, name, content)
    if commit:
        _commit(mount, ckpt)
