"""shardfs.checkpoint - a checkpoint directory of a shardfs mount
(MOUNT/CKPT), read through its files (SPEC section 3).

Tensor names are the files under tensors/ ('/' in a name is a directory);
each one's dtype and shape are its xattrs user.shardfs.dtype and
user.shardfs.shape; its bytes are the file, row-major little-endian; a box
is the file tensors/NAME@START:STOP,... that the daemon assembles. Nothing
here writes (shardfs.save does).

Whole tensors are read by the direct data path where the mount offers it
(shardfs.direct: this node's store files read in process, checksums
checked here) unless direct=False or SHARDFS_DIRECT=0; every byte it cannot
read and check is read through the mount.
"""

import builtins
import json
import os

from .dtypes import DTYPES, np, raw_dtype
from .tensor import Tensor

XATTR_MAX = 65536


def _xattr_text(path, name):
    return os.getxattr(path, name)[:XATTR_MAX].decode("utf-8", errors="replace")


class Checkpoint:
    """A mounted checkpoint: names(), tensor(name) / [name], numpy(name),
    safetensors() (its model.safetensors, a shardfs.SafetensorsFile),
    format, state."""

    def __init__(self, path, direct=None):
        self.path = path
        self._tdir = os.path.join(path, "tensors")
        if not os.path.isdir(self._tdir):
            raise ValueError("%s: no tensors/ directory: not a checkpoint of a shardfs "
                             "mount (open a safetensors file by its path)" % path)
        try:
            self.format = _xattr_text(path, "user.shardfs.format")
        except OSError as e:
            raise ValueError("%s: no user.shardfs.format attribute (%s): not a "
                             "checkpoint of a shardfs mount" % (path, e.strerror)) from None
        self._names = None
        self._mount_reader = _MountReader(self)
        if direct is None:
            direct = os.environ.get("SHARDFS_DIRECT", "1") != "0"
        self._reader = self._mount_reader
        if direct:
            from . import direct as _direct
            self._reader = _direct.DirectReader(self, self._mount_reader)

    @property
    def stats(self):
        """Bytes read directly and through the mount, and why ({} when the
        direct path is off)."""
        return getattr(self._reader, "stats", {})

    def __repr__(self):
        return "<shardfs.Checkpoint %s (%s)>" % (self.path, self.format)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def state(self):
        """"committed", "writing" or "failed: REASON"."""
        return _xattr_text(self.path, "user.shardfs.state")

    def names(self):
        """Every tensor name, sorted (byte order, as the mount lists them)."""
        if self._names is None:
            out = []
            for dirpath, dirnames, filenames in os.walk(self._tdir):
                dirnames.sort()
                rel = os.path.relpath(dirpath, self._tdir)
                for f in filenames:
                    out.append(f if rel == "." else rel.replace(os.sep, "/") + "/" + f)
            self._names = sorted(out, key=lambda s: s.encode())
        return list(self._names)

    def __iter__(self):
        return iter(self.names())

    def __len__(self):
        return len(self.names())

    def __contains__(self, name):
        return "@" not in name and os.path.isfile(self.tensor_path(name))

    def tensor_path(self, name, box=None):
        """MOUNT/CKPT/tensors/NAME, or with box [(start, stop), ...] the
        slice file NAME@START:STOP,..."""
        p = os.path.join(self._tdir, name)
        if box is not None:
            p += "@" + ",".join("%d:%d" % (a, b) for a, b in box)
        return p

    def tensor(self, name):
        path = self.tensor_path(name)
        dt = _xattr_text(path, "user.shardfs.dtype")
        if dt not in DTYPES:
            raise ValueError("%s: unknown dtype %r" % (path, dt[:40]))
        shape = json.loads(_xattr_text(path, "user.shardfs.shape"))
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError("%s: user.shardfs.shape is not a list of sizes" % path)
        return Tensor(name, dt, shape, self._reader)

    __getitem__ = tensor

    def numpy(self, name, float32=False, mmap=False):
        return self.tensor(name).numpy(float32=float32, mmap=mmap)

    def safetensors(self):
        """The mount's model.safetensors of this checkpoint, opened."""
        from .safetensors import SafetensorsFile
        return SafetensorsFile(os.path.join(self.path, "model.safetensors"))


def _read_exact(path, buf, what):
    """Fill buf (a writable byte view) from the start of path; the file
    must hold exactly len(buf) bytes."""
    view, done = memoryview(buf), 0
    with builtins.open(path, "rb", buffering=0) as f:
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise OSError("%s: %d bytes, %s needs %d" % (path, done, what, len(view)))
            done += n
        if f.read(1):
            raise OSError("%s: longer than the %d bytes %s needs" % (path, len(view), what))


class _MountReader:
    def __init__(self, ck):
        self.ck = ck

    def read_into(self, t, buf):
        _read_exact(self.ck.tensor_path(t.name), buf,
                    "%s %s" % (t.dtype_name, list(t.shape)))

    def memmap(self, t):
        path = self.ck.tensor_path(t.name)
        size = os.stat(path).st_size
        if size != t.nbytes:
            raise OSError("%s: %d bytes, %s %s needs %d" % (
                path, size, t.dtype_name, list(t.shape), t.nbytes))
        return np().memmap(path, dtype=raw_dtype(t.dtype_name), mode="r", shape=t.shape)

    def read_box(self, t, box):
        raw = np().empty([b - a for a, b in box], dtype=raw_dtype(t.dtype_name))
        _read_exact(self.ck.tensor_path(t.name, box), raw.reshape(-1).view(np().uint8),
                    "the box %s" % (box,))
        return raw
