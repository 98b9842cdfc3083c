"""torch_v3 - torch.save archives holding tensors the way torch 2.x saves
the types torch 1.13 lacks (float8_e4m3fn, float8_e5m2, uint16, uint32,
uint64).

torch 2.x pickles such a tensor (torch/_tensor.py, _reduce_ex_internal:
the dtypes of torch.storage._new_dtypes()) as

    torch._utils._rebuild_tensor_v3(storage, storage_offset, size, stride,
                                    requires_grad, backward_hooks, dtype)

with storage an UntypedStorage, whose persistent id (torch/serialization.py,
_save) is ('storage', torch.storage.UntypedStorage, KEY, 'cpu', NBYTES),
and dtype the global torch.<name>. No torch 2.x is installed here, and no
committed fixture holds such a tensor, so Debian's torch 1.13 writes the
archive itself (its own zip writer, data/KEY records and persistent ids:
1.13's UntypedStorage gives the same id as 2.x's) and Python's pickle
emits the call, through stand-ins for the two names 1.13 lacks (the
rebuild function and the dtype) that pickle under torch's own names. The
data.pkl opcodes are then those torch 2.x writes:

    GLOBAL 'torch._utils _rebuild_tensor_v3' MARK
      MARK 'storage' GLOBAL 'torch.storage UntypedStorage' KEY 'cpu' NBYTES
      TUPLE BINPERSID  OFFSET SIZE STRIDE NEWFALSE
      GLOBAL 'collections OrderedDict' EMPTY_TUPLE REDUCE
      GLOBAL 'torch <dtype>'
    TUPLE REDUCE

Use with /usr/bin/python3 (torch 1.13):

    import torch_v3
    st = torch_v3.untyped(raw_bytes)
    torch.save({"w": torch_v3.V3(st, "float8_e4m3fn", (2, 3))}, path)
"""

import collections

import torch
import torch._utils

NEW_DTYPES = ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
SIZE = {"float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2, "uint32": 4,
        "uint64": 8}
# the safetensors names shardfs shows them as
ST_NAME = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
           "uint16": "U16", "uint32": "U32", "uint64": "U64"}


def _rebuild_tensor_v3(*args):
    raise RuntimeError("torch 1.13 cannot load a torch 2.x _rebuild_tensor_v3 tensor")


_rebuild_tensor_v3.__module__ = "torch._utils"
_rebuild_tensor_v3.__qualname__ = "_rebuild_tensor_v3"


class _DType:
    """A torch dtype 1.13 lacks: pickles as the global torch.<name>, as a
    torch.dtype does (its __reduce__ gives its name)."""

    def __init__(self, name):
        self.name = name
        self.__module__ = "torch"

    def __reduce__(self):
        return self.name


def install():
    """Put the stand-ins where pickle looks them up (this process only)."""
    if getattr(torch._utils, "_rebuild_tensor_v3", None) is not _rebuild_tensor_v3:
        torch._utils._rebuild_tensor_v3 = _rebuild_tensor_v3
    for n in NEW_DTYPES:
        if not isinstance(getattr(torch, n, None), _DType):
            setattr(torch, n, _DType(n))


def untyped(raw):
    """A real torch.UntypedStorage holding the bytes raw."""
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return t.storage()._storage  # torch 1.13: the TypedStorage's UntypedStorage


class V3:
    """A tensor of a torch 2.x dtype: a view (offset, size, stride in
    elements of dtype) of the bytes of storage."""

    def __init__(self, storage, dtype, size, stride=None, offset=0):
        install()
        self.storage, self.dtype, self.offset = storage, dtype, offset
        self.size = tuple(size)
        if stride is None:
            stride, n = [], 1
            for d in reversed(self.size):
                stride.insert(0, n)
                n *= d
        self.stride = tuple(stride)

    def __reduce_ex__(self, proto):
        return (_rebuild_tensor_v3,
                (self.storage, self.offset, self.size, self.stride, False,
                 collections.OrderedDict(), getattr(torch, self.dtype)))

    def view_bytes(self, raw):
        """The bytes of the view, row-major (what a reader must serve)."""
        isz = SIZE[self.dtype]
        out = bytearray()

        def walk(d, base):
            if d == len(self.size):
                out.extend(raw[base * isz:(base + 1) * isz])
                return
            for i in range(self.size[d]):
                walk(d + 1, base + i * self.stride[d])
        walk(0, self.offset)
        return bytes(out)
