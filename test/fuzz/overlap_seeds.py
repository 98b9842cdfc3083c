"""overlap_seeds - fuzz seeds with overlapping and replicated chunks
(issue 30, item 2), made from files the frameworks wrote.

    /usr/bin/python3 test/fuzz/overlap_seeds.py test/fuzz/corpus

corpus/dcp/ (per-rank documents of the committed torch 2.15 perrank4
checkpoint, one of fuzz_dcp's chunk directories; each __R.metadata is
unpickled with stand-in classes under torch's names, changed and pickled
back, so the globals are the ones torch wrote):
  seed-overlap-partial.ranks  rank 1 also lists rows at [2, 0] 3 x 3 (its
                              own stored chunk): rows 2 held twice
  seed-overlap-replica.ranks  rank 1 also lists rows at [0, 0] (rank 0's
                              box) stored in its own file: a replica with
                              other bytes; rank 0's storage_data holds its
                              rows key twice (the last pointing at rank 1's
                              bytes): one document's repeats
corpus/paddle/ (paddle 3.3.1's replicas2 fixture, changed as
test/mount/test_overlap.py does):
  overlap-repdiff             the replica paddle does not read holds other values
  overlap-partial             rows' chunks [0, 0] 3 x 3 and [2, 0] 3 x 3
Needs numpy (the .distcp arrays); no torch, no paddle.
"""
import copy
import copyreg
import os
import pickle
import shutil
import struct
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(TOP, "test", "mount"))
import test_overlap  # noqa: E402  (the paddle variants it mounts; numpy,
#                       imported before any stand-in module is made)


class Stub:
    """Any pickled object: REDUCE arguments in _a, BUILD state in _s."""

    def __new__(cls, *args):
        o = object.__new__(cls)
        o._a, o._s = args, None
        return o

    def __setstate__(self, st):
        self._s = st

    def __reduce_ex__(self, proto):
        if self._a:
            return (type(self), self._a, self._s)
        return (copyreg.__newobj__, (type(self),), self._s)


def stub(module, name):
    mod = sys.modules.setdefault(module, types.ModuleType(module))
    cls = getattr(mod, name, None)
    if cls is None:
        cls = type(name, (Stub,), {"__module__": module, "__qualname__": name})
        setattr(mod, name, cls)
    return cls


class Stubs(pickle.Unpickler):
    def find_class(self, module, name):
        return stub(module, name)


def dcp_seeds(out):
    src = os.path.join(TOP, "test", "fixtures", "dcp", "torch-2.15-ext", "perrank4")
    docs = []
    for r in range(4):
        with open(os.path.join(src, "__%d.metadata" % r), "rb") as f:
            docs.append(Stubs(f).load())

    def rows_entry(m):
        return [(k, v) for k, v in m._s["storage_data"].items()
                if k._s["fqn"] == "rows"][0]

    def add_chunk(m, off, info):
        """m lists rows at off (3 x 3) too, stored as info."""
        rows = m._s["state_dict_metadata"]["rows"]
        ch = copy.deepcopy(rows._s["chunks"][0])
        ch._s["offsets"]._a = (off,)
        rows._s["chunks"].append(ch)
        k = copy.deepcopy(rows_entry(m)[0])
        k._s["offset"]._a = (off,)
        m._s["storage_data"][k] = info

    def write(name, ds):
        blob = b"SFDCPR\n" + b"\nSFDCPR\n".join(pickle.dumps(d, protocol=4) for d in ds)
        with open(os.path.join(out, "dcp", name), "wb") as f:
            f.write(blob)
        print("seed", name, len(blob), "bytes")

    ds = copy.deepcopy(docs)
    add_chunk(ds[1], (2, 0), rows_entry(ds[1])[1])
    write("seed-overlap-partial.ranks", ds)
    ds = copy.deepcopy(docs)
    r1 = rows_entry(ds[1])[1]
    add_chunk(ds[1], (0, 0), r1)
    k0 = copy.deepcopy(rows_entry(ds[0])[0])
    k0._s["index"] = 1
    ds[0]._s["storage_data"][k0] = copy.deepcopy(r1)
    ds[0]._s["storage_data"][k0]._s["relative_path"] = "__1_0.distcp"
    write("seed-overlap-replica.ranks", ds)


def paddle_seeds(out):
    tmp = tempfile.mkdtemp()
    try:
        test_overlap.paddle_variants(tmp)
        for v, name in (("pd-repdiff", "overlap-repdiff"), ("pd-partial", "overlap-partial")):
            d = os.path.join(tmp, v)
            blob = b""
            for p in ["0.metadata"] + ["%d_0.distcp" % r for r in range(2)]:
                with open(os.path.join(d, p), "rb") as f:
                    b = f.read()
                blob += struct.pack("<I", len(b)) + b
            with open(os.path.join(out, "paddle", name), "wb") as f:
                f.write(blob)
            print("seed", name, len(blob), "bytes")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    dcp_seeds(sys.argv[1])
    paddle_seeds(sys.argv[1])
