"""shardfs.safetensors - read a safetensors file without the safetensors
package: the model.safetensors of a shardfs mount, or any other.

The layout: an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}), then the data; offsets are relative to the data's start.

The header is untrusted input and checked before anything is read by it,
with the rules of the safetensors library itself: N at most 100 MB
(HEADER_MAX) and inside the file; UTF-8 JSON, an object, no duplicate
keys; every dtype known (shardfs.dtypes); shapes lists of non-negative
integers; end - begin exactly the bytes dtype and shape need; the entries
tile the data section with no hole, overlap or trailing byte. Anything else
raises SafetensorsError naming the file and the rule, and nothing is read
past the file's end whatever the header says.
"""

import builtins
import json
import os
import struct

from .dtypes import DTYPES, ITEMSIZE
from .tensor import Tensor

HEADER_MAX = 100 * 1000 * 1000     # bytes of header JSON, as safetensors
MAX_NDIM = 64


class SafetensorsError(ValueError):
    """A safetensors file that breaks the format's rules."""


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError("duplicate key %r" % k[:200])
        out[k] = v
    return out


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(text, data_size):
    """Check header JSON text (bytes) against a data section of data_size
    bytes. Returns (metadata dict, {name: (dtype, shape tuple, begin,
    end)}). Raises SafetensorsError."""
    try:
        obj = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise SafetensorsError("header is not UTF-8: %s" % e) from None
    except RecursionError:
        raise SafetensorsError("header is not JSON: nested too deeply") from None
    except ValueError as e:
        if isinstance(e, SafetensorsError):
            raise
        raise SafetensorsError("header is not JSON: %s" % e) from None
    if not isinstance(obj, dict):
        raise SafetensorsError("header is not a JSON object")
    meta = obj.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError("__metadata__ is not an object of strings")
    entries = {}
    for name, e in obj.items():
        what = "tensor %r" % name[:200]
        if not isinstance(e, dict):
            raise SafetensorsError("%s: not an object" % what)
        dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dt, str) or dt not in DTYPES:
            raise SafetensorsError("%s: unknown dtype %r" % (what, dt if not isinstance(
                dt, str) else dt[:40]))
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM or
                not all(_int(d) and d >= 0 for d in shape)):
            raise SafetensorsError("%s: shape is not a list of sizes" % what)
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(_int(o) for o in offs)):
            raise SafetensorsError("%s: data_offsets is not [begin, end]" % what)
        begin, end = offs
        if not 0 <= begin <= end <= data_size:
            raise SafetensorsError("%s: data_offsets [%d, %d] outside the data (%d bytes)"
                                   % (what, begin, end, data_size))
        need = ITEMSIZE[dt]
        for d in shape:
            need *= d
        if end - begin != need:
            raise SafetensorsError("%s: holds %d bytes, %s %s needs %d"
                                   % (what, end - begin, dt, shape, need))
        entries[name] = (dt, tuple(shape), begin, end)
    pos = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != pos:
            raise SafetensorsError("tensor %r: data_offsets [%d, %d] %s" % (
                name[:200], begin, end, "overlap the tensor before" if begin < pos
                else "leave a hole after byte %d" % pos))
        pos = end
    if pos != data_size:
        raise SafetensorsError("the tensors end at byte %d of the data, the file has %d"
                               % (pos, data_size))
    return meta, entries


class SafetensorsFile:
    """An open safetensors file: names(), tensor(name) / [name] (a
    shardfs.Tensor: dtype_name, shape, numpy(), slicing), numpy(name),
    metadata. Use as a context manager, or close()."""

    def __init__(self, path):
        self.path = path
        self._f = builtins.open(path, "rb")
        try:
            self._load()
        except BaseException:
            self._f.close()
            raise

    def _load(self):
        size = os.fstat(self._f.fileno()).st_size
        where = "%s: " % self.path
        if size < 8:
            raise SafetensorsError(where + "%d bytes: shorter than the header length" % size)
        (n,) = struct.unpack("<Q", self._read(0, 8))
        if n > HEADER_MAX:
            raise SafetensorsError(where + "header of %d bytes: over the %d-byte limit"
                                   % (n, HEADER_MAX))
        if 8 + n > size:
            raise SafetensorsError(where + "header of %d bytes runs past the end of the "
                                   "file (%d bytes)" % (n, size))
        try:
            self.metadata, self._entries = parse_header(self._read(8, n), size - 8 - n)
        except SafetensorsError as e:
            raise SafetensorsError(where + str(e)) from None
        self.data_start = 8 + n
        self.size = size

    def _read(self, off, n):
        self._f.seek(off)
        b = self._f.read(n)
        if len(b) != n:
            raise OSError("%s: short read at byte %d (the file shrank?)" % (self.path, off))
        return b

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def names(self):
        """Tensor names, sorted."""
        return sorted(self._entries)

    def __iter__(self):
        return iter(self.names())

    def __len__(self):
        return len(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def tensor(self, name):
        dt, shape, begin, end = self._entries[name]
        return Tensor(name, dt, shape, _StReader(self, self.data_start + begin))

    __getitem__ = tensor

    def numpy(self, name, float32=False, mmap=False):
        return self.tensor(name).numpy(float32=float32, mmap=mmap)


class _StReader:
    """Tensor bytes at a fixed offset of an open safetensors file."""

    def __init__(self, stf, offset):
        self.stf, self.offset = stf, offset

    def read_into(self, t, buf):
        f = self.stf._f
        f.seek(self.offset)
        view, done = memoryview(buf), 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise OSError("%s: %s: short read" % (self.stf.path, t.name))
            done += n

    def memmap(self, t):
        from .dtypes import raw_dtype, np
        return np().memmap(self.stf._f, dtype=raw_dtype(t.dtype_name), mode="r",
                           offset=self.offset, shape=t.shape)

    def read_box(self, t, box):
        from .dtypes import np
        whole = self.memmap(t) if t.nbytes else t.numpy()
        return np().array(whole[tuple(slice(a, b) for a, b in box)])
