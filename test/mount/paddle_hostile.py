"""paddle_hostile - hostile variants of a real paddle checkpoint.

    /usr/bin/python3 paddle_hostile.py FIXTURE STORE OUTSIDE

FIXTURE is a committed checkpoint paddle 3.3.1 wrote (2 ranks:
test/fixtures/paddle/paddle-3.3.1/shard2). Copies it into STORE as:

  good/          as written
  evil-global/   metadata names os.system (flat_mapping = os.system)
  evil-distcp/   0_0.distcp names os.system (its name table = os.system)
  escape/        the victim's chunk in 0_0.distcp at ../../OUTSIDE-name/0_0.distcp
  abs/           the victim's chunk at an absolute path (/etc/passwd)
  symlink/       0_0.distcp is a symlink to a copy in OUTSIDE
  short/         0_0.distcp cut short
  shape/         the victim's array in 0_0.distcp reshaped (3 x 3 -> 9)
  dtype/         the metadata says float64 for the victim
  fortran/       the victim's array in 0_0.distcp saved in Fortran order
                 (the same values: still served, through strides)
  escaped/       the victim's array data in 0_0.distcp pickled as Python
                 2 pickled a str, an escaped protocol-0 STRING
                 (S'\x00\x00...'): numpy reads the decoded bytes (checked
                 here), the file holds their escaped text (issue 30)
  old/           the metadata as paddle 2.5 wrote it (module
                 paddle.distributed.checkpoint.metadata, no dtype, no
                 global shape): both taken from the chunks
  torn/          metadata cut in half
  partial/       no metadata (a save still running)
  locked/        paddle's 0.metadata.lock still there
  wide/          the tensor cols (4 x 6, two chunks) stored one element
                 per chunk, each in a data file of its own (26 files: more
                 than the 16 a growing registry first holds, while
                 the earlier chunks of the same tensor are still pending)

The metadata is rewritten by unpickling it with stand-ins for paddle's
three dataclasses (registered under paddle's module name, so pickling them
back names the same globals paddle wrote) and the .distcp with numpy:
no paddle is needed. Prints a JSON object: {"victim": key, "in_file0":
[keys with a chunk in 0_0.distcp], "outside": the copy's path}.
"""

import copy
import io
import json
import os
import pickle
import shutil
import sys
import types

import numpy as np

MOD = "paddle.distributed.flex_checkpoint.dcp.metadata"
MOD_OLD = "paddle.distributed.checkpoint.metadata"  # paddle before 3.1
VICTIM = "rows"
FILE0 = "0_0.distcp"


def stub_module(mod=MOD):
    m = types.ModuleType(mod)
    for name in ("Metadata", "LocalTensorMetadata", "LocalTensorIndex"):
        cls = type(name, (), {"__module__": mod})
        setattr(m, name, cls)
    sys.modules[mod] = m
    parts = mod.split(".")
    for i in range(1, len(parts)):  # pickle imports the module by name
        sys.modules.setdefault(".".join(parts[:i]),
                               types.ModuleType(".".join(parts[:i])))
    return m


def to_old(m):
    """The metadata as paddle 2.5 wrote it: the old module path,
    LocalTensorMetadata(global_offset, local_shape) and
    LocalTensorIndex(tensor_key, global_offset) only."""
    old = sys.modules[MOD_OLD]

    def conv(o, cls, keep):
        n = cls.__new__(cls)
        n.__dict__.update({k: v for k, v in o.__dict__.items() if k in keep})
        return n
    out = old.Metadata.__new__(old.Metadata)
    out.state_dict_metadata = {
        k: [conv(c, old.LocalTensorMetadata, ("global_offset", "local_shape"))
            for c in v] for k, v in m.state_dict_metadata.items()}
    out.storage_metadata = {
        conv(k, old.LocalTensorIndex, ("tensor_key", "global_offset")): f
        for k, f in m.storage_metadata.items() if k.__dict__.get("replica_id") in (None, 0)}
    return out


class MdUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module in (MOD, MOD_OLD):
            return getattr(sys.modules[module], name)
        raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))


class NpUnpickler(pickle.Unpickler):
    """numpy 2 wrote numpy._core; Debian's numpy 1 has numpy.core."""

    def find_class(self, module, name):
        if module.startswith("numpy._core"):
            module = "numpy.core" + module[len("numpy._core"):]
        return super().find_class(module, name)


class EscapingPickler(pickle._Pickler):
    """The pure-Python pickler, but the bytes equal to `target` are written
    as Python 2's pickle wrote a str, a protocol-0 STRING: S'<repr>'\n
    (escapes for every byte outside printable ASCII). Any protocol's
    unpickler reads the opcode; with encoding='latin1' numpy gets the
    decoded bytes back."""

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, f, target):
        super().__init__(f, protocol=4)
        self.target = target

    def save_bytes(self, obj):
        if obj != self.target:
            return pickle._Pickler.save_bytes(self, obj)
        self.write(pickle.STRING + repr(obj)[1:].encode("ascii") + b"\n")
        self.memoize(obj)
    dispatch[bytes] = save_bytes


def load_md(path):
    with open(path, "rb") as f:
        return MdUnpickler(f).load()


def dump(obj, path):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)


def wide(src, store, key="cols"):
    """Variant wide/: key's elements each one chunk in a file of its own,
    the values those paddle stored."""
    d = os.path.join(store, "wide")
    shutil.copytree(src, d)
    m = load_md(os.path.join(src, "0.metadata"))
    chunks = m.state_dict_metadata[key]
    shape = tuple(chunks[0].global_shape)
    full = None
    for k, fname in list(m.storage_metadata.items()):
        if k.tensor_key != key:
            continue
        with open(os.path.join(src, fname), "rb") as f:
            arr = NpUnpickler(f).load()[key]  # our own fixture: trusted here
        if full is None:
            full = np.zeros(shape, dtype=arr.dtype)
        o = tuple(k.global_offset)
        full[o[0]:o[0] + arr.shape[0], o[1]:o[1] + arr.shape[1]] = arr
        idx = k
        del m.storage_metadata[k]
    news = []
    for n, (i, j) in enumerate((i, j) for i in range(shape[0]) for j in range(shape[1])):
        c = copy.copy(chunks[0])
        c.__dict__ = dict(chunks[0].__dict__, global_offset=(i, j), local_shape=(1, 1))
        news.append(c)
        x = copy.copy(idx)
        x.__dict__ = dict(idx.__dict__, global_offset=(i, j))
        fname = "%d_0.distcp" % (2 + n)
        m.storage_metadata[x] = fname
        dump({key: full[i:i + 1, j:j + 1].copy()}, os.path.join(d, fname))
    m.state_dict_metadata[key] = news
    dump(m, os.path.join(d, "0.metadata"))


def main():
    src, store, outside = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(outside, exist_ok=True)
    stub_module()
    stub_module(MOD_OLD)
    md = load_md(os.path.join(src, "0.metadata"))
    in_file0 = sorted({k.tensor_key for k, f in md.storage_metadata.items() if f == FILE0})
    shutil.copy(os.path.join(src, FILE0), os.path.join(outside, FILE0))

    def variant(name, change_md=None):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        if change_md:
            m = load_md(os.path.join(src, "0.metadata"))
            change_md(m)
            dump(m, os.path.join(d, "0.metadata"))
        return d

    def set_path(path):
        def change(m):
            for k in list(m.storage_metadata):
                if k.tensor_key == VICTIM and m.storage_metadata[k] == FILE0:
                    m.storage_metadata[k] = path
        return change

    def change_distcp(d, fn):
        with open(os.path.join(src, FILE0), "rb") as f:
            sd = NpUnpickler(f).load()  # our own fixture: trusted here
        fn(sd)
        dump(sd, os.path.join(d, FILE0))

    variant("good")
    variant("evil-global", lambda m: setattr(m, "flat_mapping", os.system))
    d = variant("evil-distcp")
    change_distcp(d, lambda sd: sd.__setitem__("StructuredToParameterName@@", os.system))
    rel_out = os.path.relpath(outside, os.path.join(store, "escape"))
    variant("escape", set_path(os.path.join(rel_out, FILE0)))
    variant("abs", set_path("/etc/passwd"))
    d = variant("symlink")
    os.unlink(os.path.join(d, FILE0))
    os.symlink(os.path.join(outside, FILE0), os.path.join(d, FILE0))
    d = variant("short")
    with open(os.path.join(d, FILE0), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(src, FILE0)) * 2 // 3)
    d = variant("shape")
    change_distcp(d, lambda sd: sd.__setitem__(VICTIM, sd[VICTIM].reshape(-1)))

    def f64(m):
        for i, c in enumerate(m.state_dict_metadata[VICTIM]):
            c.__dict__["dtype"] = "float64"
    variant("dtype", f64)
    d = variant("fortran")
    change_distcp(d, lambda sd: sd.__setitem__(VICTIM, np.asfortranarray(sd[VICTIM])))
    d = variant("escaped")
    with open(os.path.join(src, FILE0), "rb") as f:
        sd = NpUnpickler(f).load()  # our own fixture: trusted here
    raw = sd[VICTIM].tobytes()
    assert any(c < 0x20 or c >= 0x7f for c in raw), "the victim needs escapes"
    buf = io.BytesIO()
    EscapingPickler(buf, raw).dump(sd)
    data = buf.getvalue()
    assert (pickle.STRING + repr(raw)[1:].encode("ascii") + b"\n") in data, \
        "no escaped STRING"
    back = NpUnpickler(io.BytesIO(data), encoding="latin1").load()
    assert back[VICTIM].tobytes() == raw and back[VICTIM].shape == sd[VICTIM].shape, \
        "numpy does not read the escaped STRING back as the array"
    for k, v in sd.items():  # the other arrays are as they were
        assert k == VICTIM or not hasattr(v, "tobytes") or back[k].tobytes() == v.tobytes()
    with open(os.path.join(d, FILE0), "wb") as f:
        f.write(data)
    d = variant("old")
    dump(to_old(load_md(os.path.join(src, "0.metadata"))), os.path.join(d, "0.metadata"))
    d = variant("torn")
    with open(os.path.join(d, "0.metadata"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(src, "0.metadata")) // 2)
    d = variant("partial")
    os.unlink(os.path.join(d, "0.metadata"))
    d = variant("locked")
    open(os.path.join(d, "0.metadata.lock"), "wb").close()
    wide(src, store)
    print(json.dumps({"victim": VICTIM, "in_file0": in_file0,
                      "outside": os.path.join(outside, FILE0)}))


if __name__ == "__main__":
    main()
