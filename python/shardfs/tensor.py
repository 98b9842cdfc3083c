"""shardfs.tensor - one tensor of a checkpoint or safetensors file, read
as a numpy array on request.

A Tensor knows its name, safetensors dtype name and shape; numpy() reads
it whole (or maps it with mmap=True), t[...] reads a box of it. Arrays come
back as TensorArray, an ndarray that carries .dtype_name: the raw bits for
dtypes numpy lacks (BF16 as uint16, F8_E4M3 / F8_E5M2 as uint8, dtype_name
saying which), or float32 values with float32=True (shardfs.dtypes). A
reader object behind the Tensor does the I/O (a mount's tensors/ files,
or an offset in a safetensors file); every read checks that it got the
bytes the dtype and shape need.
"""

import operator

from .dtypes import ITEMSIZE, NP_TO_ST, np, raw_dtype, to_float32

_array_cls = None


def _array_class():
    global _array_cls
    if _array_cls is None:
        class TensorArray(np().ndarray):
            """An ndarray that knows which safetensors dtype its bits are:
            .dtype_name is "BF16" for the uint16 bits of a BF16 tensor, and
            the plain name (F32, I64, ...) of any native numpy dtype, also
            after astype() and arithmetic."""

            def __array_finalize__(self, obj):
                self._st_dtype = getattr(obj, "_st_dtype", None)

            @property
            def dtype_name(self):
                st = self._st_dtype
                if st is not None and raw_dtype(st) == self.dtype:
                    return st
                return NP_TO_ST.get(self.dtype.newbyteorder("<").str
                                    if self.dtype.byteorder == ">" else self.dtype.str)

        _array_cls = TensorArray
    return _array_cls


def labelled(arr, dtype_name):
    """arr as a TensorArray whose bits are dtype_name's (no copy)."""
    a = arr.view(_array_class())
    a._st_dtype = dtype_name
    return a


def finish(raw, dtype_name, float32):
    """The array a caller gets: raw bits, or float32 values on request."""
    if float32:
        return labelled(to_float32(raw, dtype_name), "F32")
    return labelled(raw, dtype_name)


class Tensor:
    """name, dtype_name, shape, itemsize, nbytes; numpy(); t[box]."""

    def __init__(self, name, dtype_name, shape, reader):
        self.name = name
        self.dtype_name = dtype_name
        self.shape = tuple(shape)
        self.itemsize = ITEMSIZE[dtype_name]
        n = self.itemsize
        for d in self.shape:
            n *= d
        self.nbytes = n
        self._reader = reader

    def __repr__(self):
        return "<shardfs.Tensor %r %s %s>" % (self.name, self.dtype_name, list(self.shape))

    @property
    def ndim(self):
        return len(self.shape)

    def numpy(self, float32=False, mmap=False):
        """The whole tensor: raw bits (BF16 as uint16, F8 as uint8, numpy's
        own dtype otherwise), or float32 values of a floating dtype with
        float32=True. mmap=True maps the file instead of reading it (read
        only; not with float32, which computes new values)."""
        if mmap and self.nbytes and not float32:
            return labelled(self._reader.memmap(self), self.dtype_name)
        raw = np().empty(self.shape, dtype=raw_dtype(self.dtype_name))
        if self.nbytes:
            self._reader.read_into(self, raw.reshape(-1).view(np().uint8))
        return finish(raw, self.dtype_name, float32)

    def __array__(self, dtype=None):
        a = np().asarray(self.numpy())
        return a if dtype is None else a.astype(dtype)

    def read_box(self, box, float32=False):
        """Elements [start, stop) along every dimension (box: one
        (start, stop) per dimension), read as one box."""
        box = [(int(a), int(b)) for a, b in box]
        if len(box) != self.ndim:
            raise IndexError("%s: a box of %d dimensions for a tensor of %d" % (
                self.name, len(box), self.ndim))
        for (a, b), n in zip(box, self.shape):
            if not 0 <= a <= b <= n:
                raise IndexError("%s: [%d, %d) is outside a dimension of %d" % (
                    self.name, a, b, n))
        if not self.ndim:
            return self.numpy(float32=float32)
        if any(a == b for a, b in box):
            raw = np().empty([b - a for a, b in box], dtype=raw_dtype(self.dtype_name))
        else:
            raw = self._reader.read_box(self, box)
        return finish(raw, self.dtype_name, float32)

    def __getitem__(self, key):
        """Basic indexing (ints, slices with any step, one Ellipsis) read as
        the smallest box that holds the selection (a 0-d array, not a
        scalar, when every dimension is an int)."""
        box, post = _box_of(key, self.shape, self.name)
        box_arr = self.read_box(box)
        out = box_arr[post]
        if not isinstance(out, np().ndarray):   # every dimension an int:
            out = box_arr.reshape(())           # a 0-d array, not a scalar
        return out


def _box_of(key, shape, name):
    """(box, numpy index into the box) for a basic index key."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("%s: at most one Ellipsis" % name)
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise IndexError("%s: %d indices for a tensor of %d dimensions" % (
            name, len(key), len(shape)))
    key = key + (slice(None),) * (len(shape) - len(key))
    box, post = [], []
    for k, n in zip(key, shape):
        if isinstance(k, slice):
            r = range(*k.indices(n))
            if not r:
                box.append((0, 0))
                post.append(slice(None))
                continue
            lo, hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
            box.append((lo, hi))
            stop = r[-1] - lo + (1 if r.step > 0 else -1)
            post.append(slice(r[0] - lo, stop if stop >= 0 else None, r.step))
            continue
        try:
            i = operator.index(k)
        except TypeError:
            raise TypeError("%s: only ints, slices and ... index a shardfs tensor, not %r"
                            % (name, type(k).__name__)) from None
        if not -n <= i < n:
            raise IndexError("%s: index %d is outside a dimension of %d" % (name, i, n))
        i %= n
        box.append((i, i + 1))
        post.append(0)
    return box, tuple(post)
