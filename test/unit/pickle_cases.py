#!/usr/bin/python3
"""pickle_cases.py - write the pickle corpus test/corpus/pickle/ that
test_pickle replays against core/formats/sf_pickle.c.

Run with Debian's interpreter (it has numpy and torch 1.13):

    /usr/bin/python3 test/unit/pickle_cases.py test/corpus/pickle

valid/CASE/input.pkl     a pickle the real tools wrote (pickle.dumps,
                         numpy, torch.save, torch's DCP save_state_dict)
valid/CASE/expected.txt  the canonical dump of its value, computed HERE from
                         Python's own unpickler (below), never from the C
                         reader's output
valid/CASE/allow.txt     the globals it names, "module name" per line
valid/CASE/raw.bin       (numpy cases) the array's bytes, arr.tobytes()
invalid/CASE/input.pkl   a malformed or hostile pickle
invalid/CASE/error       "CODE substring": the error (SF_EFORMAT,
                         SF_EREFUSED, SF_ETOOBIG) and a substring of the
                         reason (test/unit/corpus_case.h reads it)
special/CASE/input.pkl   pickles numpy and dataclasses wrote, checked by
                         property in test_pickle.c (what.txt says which;
                         data.bin: a numpy array's bytes)

Python's view: SymUnpickler is CPython's C unpickler with find_class,
persistent_load and the objects it builds replaced by inert records: a
global becomes a Global class (never imported), calling it (REDUCE) or its
__new__ (NEWOBJ) an Obj, BUILD the Obj's state, APPENDS/SETITEMS on it its
elems/items. So expected.txt is Python's reading of the opcodes, dumped by
dump() below in the format test_pickle.c's dumper prints:

  None True False 12 -3          none, bools, ints
  f:1.5                          floats, '%.17g'
  'abc\\xc3\\xa9'                  str as UTF-8, bytes outside 0x20..0x7e
                                 and \\ ' as \\xHH; longer than 64 bytes:
                                 s:LEN#FNV1A64
  b'..' / b:LEN#FNV1A64          bytes (same escaping; long: a hash)
  (a, b)  [a, b]  {k: v}         tuple; list, set, frozenset; dict
  G(module.name)                 a global
  OBJ(callable, args[, new][, kwargs=D][, state=S][, items=D][, elems=L])
  PID(v)                         a persistent id
  ...                            a value already open on the path (cycle)
"""

import collections
import dataclasses
import io
import os
import pickle
import shutil
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "..", "interop"))

MISSING = object()


class Obj:
    """A call (REDUCE) or cls.__new__ (NEWOBJ) that was never made."""

    def __init__(self, callable_, args, kwargs, newobj):
        self.callable = callable_
        self.args = args
        self.kwargs = kwargs
        self.newobj = newobj
        self.state = MISSING
        self.items = None
        self.elems = None

    def __setstate__(self, state):  # BUILD
        if self.state is not MISSING:
            raise ValueError("BUILD twice")
        self.state = state

    def __setitem__(self, k, v):  # SETITEM(S) on an object
        if self.items is None:
            self.items = []
        self.items.append((k, v))

    def append(self, v):  # APPEND(S) on an object
        if self.elems is None:
            self.elems = []
        self.elems.append(v)

    def extend(self, vs):
        for v in vs:
            self.append(v)


class GlobalMeta(type):
    def __call__(cls, *args, **kw):  # REDUCE: callable(*args)
        assert not kw
        return Obj(cls, args, None, False)


def _sym_new(cls, *args, **kw):  # NEWOBJ / NEWOBJ_EX: cls.__new__
    return Obj(cls, args, kw, True)


class PersId:
    def __init__(self, pid):
        self.pid = pid


class SymUnpickler(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f, encoding="bytes")
        self.globals = set()
        self.cache = {}

    def find_class(self, module, name):
        self.globals.add((module, name))
        key = (module, name)
        if key not in self.cache:
            self.cache[key] = GlobalMeta(
                "G", (), {"module": module, "name": name, "__new__": _sym_new})
        return self.cache[key]

    def persistent_load(self, pid):
        return PersId(pid)


def sym_load(data):
    u = SymUnpickler(io.BytesIO(data))
    v = u.load()
    return v, u.globals


def fnv(b):
    h = 0xcbf29ce484222325
    for c in b:
        h ^= c
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def esc(b):
    return "".join(chr(c) if 0x20 <= c < 0x7f and c not in (0x5c, 0x27)
                   else "\\x%02x" % c for c in b)


def dump(v, path=()):
    if v is None:
        return "None"
    if v is True:
        return "True"
    if v is False:
        return "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "f:" + format(v, ".17g")
    if isinstance(v, str):
        b = v.encode("utf-8")
        return "'%s'" % esc(b) if len(b) <= 64 else "s:%d#%s" % (len(b), fnv(b))
    if isinstance(v, (bytes, bytearray)):
        b = bytes(v)
        return "b'%s'" % esc(b) if len(b) <= 64 else "b:%d#%s" % (len(b), fnv(b))
    if isinstance(v, GlobalMeta):
        return "G(%s.%s)" % (v.module, v.name)
    if id(v) in path:
        return "..."
    p = path + (id(v),)
    if isinstance(v, tuple):
        return "(" + ", ".join(dump(x, p) for x in v) + ")"
    if isinstance(v, (list, set, frozenset)):
        return "[" + ", ".join(dump(x, p) for x in v) + "]"
    if isinstance(v, dict):
        return dump_pairs(v.items(), p)
    if isinstance(v, PersId):
        return "PID(%s)" % dump(v.pid, p)
    if isinstance(v, Obj):
        s = "OBJ(" + dump(v.callable, p) + ", " + dump(v.args, p)
        if v.newobj:
            s += ", new"
        if v.kwargs:
            s += ", kwargs=" + dump_pairs(v.kwargs.items(), p)
        if v.state is not MISSING:
            s += ", state=" + dump(v.state, p)
        if v.items is not None:
            s += ", items=" + dump_pairs(v.items, p)
        if v.elems is not None:
            s += ", elems=" + dump(v.elems, p)
        return s + ")"
    raise TypeError("cannot dump %r" % type(v))


def dump_pairs(pairs, p):
    return "{" + ", ".join(dump(k, p) + ": " + dump(x, p) for k, x in pairs) + "}"


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def valid(out, name, data, raw=None):
    v, globs = sym_load(data)
    d = os.path.join(out, "valid", name)
    write(os.path.join(d, "input.pkl"), data)
    write(os.path.join(d, "expected.txt"), (dump(v) + "\n").encode())
    write(os.path.join(d, "allow.txt"),
          "".join("%s %s\n" % g for g in sorted(globs)).encode())
    if raw is not None:
        write(os.path.join(d, "raw.bin"), raw)


def invalid(out, name, data, code, reason):
    d = os.path.join(out, "invalid", name)
    write(os.path.join(d, "input.pkl"), data)
    write(os.path.join(d, "error"), ("%s %s\n" % (code, reason)).encode())


# --- the values --------------------------------------------------------

@dataclasses.dataclass
class Point:
    x: int
    y: float
    name: str


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


class Tagged(list):
    """A list subclass with an attribute: NEWOBJ, APPENDS on it, BUILD."""


def nested_value():
    shared = [7, "shared"]
    selfref = [1, 2]
    selfref.append(selfref)
    return {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31,
                 2**40, -2**40, 2**63 - 1, -2**63],
        "floats": [0.0, -0.0, 1.5, -2.25e-300, 1e300, float("inf"),
                   3.141592653589793, 0.1],
        "str": ["", "abc", "caf\u00e9", "na\u00efve \u2603", "\U0001f600 emoji",
                "quote' back\\ nl\n cr\r", "x" * 100],
        "bytes": [b"", b"\x00\x01\xff'\\", bytes(range(256)) * 20],
        "bytearray": bytearray(b"xyz"),
        "tuple": (1, (2, 3), (), ("a",)),
        "set": {1, 2, 3},
        "frozenset": frozenset({4, 5}),
        "consts": [True, False, None],
        "shared": [shared, shared, (shared,)],
        "self": selfref,
        1: "int key",
        (1, 2): "tuple key",
        None: "none key",
    }


def gen_plain(out):
    v = nested_value()
    for proto in range(6):
        data = pickle.dumps(v, protocol=proto)
        assert pickle.loads(data)["ints"] == v["ints"]
        valid(out, "nested_p%d" % proto, data)
    valid(out, "ordered_dict_p2", pickle.dumps(
        collections.OrderedDict([("a", 1), ("b", [1, 2])]), protocol=2))
    valid(out, "ordered_dict_p4", pickle.dumps(
        collections.OrderedDict([("a", 1), ("b", [1, 2])]), protocol=4))
    for proto in (2, 4):
        valid(out, "dataclass_p%d" % proto,
              pickle.dumps([Point(3, -0.5, "p\u00e9"), Point(4, 2.0, "q")],
                           protocol=proto))
        valid(out, "slots_p%d" % proto,
              pickle.dumps(Slotted(1, "two"), protocol=proto))
    t = Tagged([1, 2, 3])
    t.tag = "hello"
    valid(out, "list_subclass_p4", pickle.dumps(t, protocol=4))
    valid(out, "scalar_int_p0", pickle.dumps(-42, protocol=0))
    valid(out, "scalar_none_p5", pickle.dumps(None, protocol=5))
    valid(out, "empty_containers_p1", pickle.dumps(([], {}, ()), protocol=1))


def plain_value(proto):
    """The plain data of main's first corpus (proto0..5, long_list)."""
    shared = [1, 2]
    v = {"none": None, "t": True, "f": False,
         "ints": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**40, -2**40,
                  2**63 - 1, -2**63],
         "floats": (0.0, -1.5, 3.141592653589793, 1e300),
         "ascii": "hello world",
         "shared": (shared, shared),
         "nested": {"a": [{"b": ((),)}], 7: "seven"}}
    if proto >= 1:
        v["unicode"] = "gr\u00fc\u00df \u4e16\u754c \U0001F600"
    if proto >= 3:
        v["short_bytes"] = b"\x00\x01\xff"
        v["long_bytes"] = bytes(range(256)) * 17
    if proto >= 4:
        v["set"] = {1, 2, 3}
        v["frozen"] = frozenset(["x"])
    cyc = [1]
    cyc.append(cyc)
    v["cycle"] = cyc
    return v


def gen_plain_main(out):
    for proto in range(6):
        valid(out, "plain_p%d" % proto, pickle.dumps(plain_value(proto),
                                                     protocol=proto))
    valid(out, "long_list_p4", pickle.dumps(list(range(3000)), protocol=4))


@dataclasses.dataclass
class MPoint:
    x: int
    y: str


class MSlotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a, self.b = 1, "two"


def special(out, name, files):
    d = os.path.join(out, "special", name)
    for n, data in files.items():
        write(os.path.join(d, n), data if isinstance(data, bytes) else data.encode())


def gen_special(out):
    """main's special cases: numpy p3/p4 (the raw data at the recorded
    offset), an OrderedDict, a dataclass and a __slots__ object named
    mod.Point / mod.Slotted."""
    import numpy as np
    arr = np.arange(1200, dtype=np.float32).reshape(30, 40)
    for p in (3, 4):
        special(out, "numpy_p%d" % p, {"input.pkl": pickle.dumps(arr, protocol=p),
                                       "data.bin": arr.tobytes(),
                                       "what.txt": "numpy\n"})
    special(out, "ordered_dict", {"input.pkl": pickle.dumps(
        collections.OrderedDict(a=1, b=2), protocol=2), "what.txt": "ordered_dict\n"})
    saved = {}
    for cls, name in ((MPoint, "Point"), (MSlotted, "Slotted")):
        saved[cls] = (cls.__module__, cls.__qualname__)
        cls.__module__, cls.__qualname__ = "mod", name
    sys.modules["mod"] = sys.modules[__name__]
    sys.modules[__name__].Point = MPoint
    sys.modules[__name__].Slotted = MSlotted
    try:
        special(out, "dataclass", {"input.pkl": pickle.dumps(MPoint(3, "q"), protocol=4),
                                   "what.txt": "dataclass\n"})
        special(out, "slots", {"input.pkl": pickle.dumps(MSlotted(), protocol=4),
                               "what.txt": "slots\n"})
    finally:
        for cls, (m, q) in saved.items():
            cls.__module__, cls.__qualname__ = m, q
        del sys.modules["mod"]


def gen_numpy(out):
    import numpy as np
    a = np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5
    b = (np.arange(300, dtype=np.int16) - 150).reshape(10, 30)
    for proto in (2, 4, 5):
        valid(out, "numpy_f32_p%d" % proto, pickle.dumps(a, protocol=proto),
              a.tobytes())
        valid(out, "numpy_i16_p%d" % proto, pickle.dumps(b, protocol=proto),
              b.tobytes())
    # As Python 2 pickled an array (protocol 0, its bytes a str): the data
    # an escaped STRING, S'\x00\x00\xc0?...' (issue 30: its value is not
    # the file's bytes at its offset, so it must never be served from there)
    class Py2Pickler(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_bytes(self, obj):
            self.write(pickle.STRING + repr(obj)[1:].encode("ascii") + b"\n")
            self.memoize(obj)
        dispatch[bytes] = save_bytes
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=0).dump(a)
    assert pickle.loads(buf.getvalue(), encoding="latin1").tobytes() == a.tobytes()
    valid(out, "numpy_f32_string_p0", buf.getvalue())
    # A Fortran-ordered array: numpy pickles its bytes in memory order.
    f = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    valid(out, "numpy_fortran_p4", pickle.dumps(f, protocol=4),
          f.tobytes(order="A"))


def gen_torch(out):
    import torch
    sd = collections.OrderedDict()
    sd["w"] = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    sd["b"] = torch.zeros(3, dtype=torch.bfloat16)
    sd["t"] = sd["w"].t()  # shares w's storage: same persistent id
    buf = io.BytesIO()
    torch.save(sd, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        valid(out, "torch_save_data_pkl", z.read(name))
    buf = io.BytesIO()
    torch.save(torch.tensor(3.5), buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        valid(out, "torch_scalar_data_pkl", z.read(name))
    # issue 30: float8 and uint16 tensors as torch 2.x pickles them
    # (_rebuild_tensor_v3 over an UntypedStorage; test/interop/torch_v3.py
    # emits that opcode stream with torch 1.13: no torch 2.x here)
    import torch_v3
    st = torch_v3.untyped(bytes(range(24)))
    v3 = collections.OrderedDict()
    v3["f8"] = torch_v3.V3(st, "float8_e4m3fn", (2, 3))
    v3["u16"] = torch_v3.V3(st, "uint16", (3, 2), stride=(1, 3), offset=1)
    v3["f32"] = sd["w"]
    buf = io.BytesIO()
    torch.save(v3, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        valid(out, "torch_v3_data_pkl", z.read(name))


def gen_dcp(out):
    import torch
    import torch113  # noqa: F401  (torch 1.13 on Python 3.11)
    import torch.distributed._shard.checkpoint as dcp
    sd = {"layer.weight": torch.arange(12, dtype=torch.float32).reshape(4, 3),
          "layer.bias": torch.zeros(3, dtype=torch.bfloat16),
          "step": torch.tensor(7, dtype=torch.int64),
          "extra": {"lr": 0.5}}
    tmp = tempfile.mkdtemp()
    try:
        dcp.save_state_dict(sd, dcp.FileSystemWriter(tmp), no_dist=True)
        with open(os.path.join(tmp, ".metadata"), "rb") as f:
            valid(out, "dcp_metadata_torch113", f.read())
    finally:
        shutil.rmtree(tmp)


def gen_invalid(out):
    E, R, B = "SF_EFORMAT", "SF_EREFUSED", "SF_ETOOBIG"
    invalid(out, "unknown_opcode", b"\x80\x02\xff.", E, "unknown opcode")
    invalid(out, "global_os_system",
            b"cos\nsystem\n(S'echo hi'\ntR.", R, "os.system")
    invalid(out, "stack_global_os_system",
            b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02hi\x85R.", R,
            "os.system")
    invalid(out, "memo_missing", b"\x80\x02K\x01h\x05.", E,
            "memo entry 5 is not defined")
    invalid(out, "memo_missing_text", b"I1\np0\ng1\n.", E,
            "memo entry 1 is not defined")
    invalid(out, "stop_empty", b".", E, "stack underflow")
    invalid(out, "stop_after_mark", b"\x80\x02K\x01(.", E, "stack underflow")
    invalid(out, "mark_left_open", b"\x80\x02(K\x01.", E, "marks left over")
    invalid(out, "tuple_without_mark", b"K\x01K\x02t.", E, "no MARK")
    invalid(out, "values_left_over", b"K\x01K\x02.", E, "left over")
    invalid(out, "deep_marks", b"(" * 5000, B, "max_depth")
    invalid(out, "deep_lists", b"\x80\x02" + b"]" * 5000, B, "max_depth")
    invalid(out, "binbytes_past_end", b"\x80\x03B\x00\x00\x00\x10abc.", E,
            "truncated")
    invalid(out, "binbytes8_huge",
            b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffabc.", E, "truncated")
    invalid(out, "long4_1gb", b"\x80\x02\x8b\x00\x00\x00\x40.", B,
            "does not fit int64")
    invalid(out, "long1_2p64", b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00"
            b"\x00\x01.", B, "does not fit int64")
    invalid(out, "long_text_big", b"L99999999999999999999L\n.", B,
            "does not fit int64")
    invalid(out, "binunicode_bad_utf8", b"\x80\x03X\x02\x00\x00\x00\xc3\x28.",
            E, "not valid UTF-8")
    invalid(out, "binunicode_surrogate",
            b"\x80\x03X\x03\x00\x00\x00\xed\xa0\x80.", E, "not valid UTF-8")
    invalid(out, "unicode_surrogate_escape", b"V\\ud800\n.", E, "surrogate")
    invalid(out, "inst", b"(iposix\nsystem\n.", E, "INST at offset 1")
    invalid(out, "obj_opcode", b"(o.", E, "OBJ at offset 1")
    invalid(out, "ext1", b"\x80\x02\x82\x01.", E, "EXT1 at offset 2")
    invalid(out, "next_buffer", b"\x80\x05\x97.", E, "NEXT_BUFFER")
    invalid(out, "readonly_buffer", b"\x80\x05C\x01a\x98.", E, "READONLY_BUFFER")
    invalid(out, "proto_6", b"\x80\x06N.", E, "unsupported protocol 6")
    invalid(out, "frame_past_end",
            b"\x80\x04\x95\x00\x01\x00\x00\x00\x00\x00\x00N.", E, "frame")
    invalid(out, "build_on_int", b"K\x01}b.", E, "not an object")
    invalid(out, "append_to_dict", b"}K\x01a.", E, "takes no elements")
    invalid(out, "setitem_on_list", b"]K\x01K\x02s.", E, "not a dict")
    invalid(out, "unhashable_key", b"}]K\x01s.", E, "unhashable")
    invalid(out, "reduce_args_not_tuple",
            b"\x80\x02c__builtin__\nobject\n]R.", E, "not a tuple")
    invalid(out, "odd_dict", b"(K\x01d.", E, "odd number")
    invalid(out, "stack_global_not_str", b"\x80\x04K\x01K\x02\x93.", E,
            "must be strings")
    invalid(out, "no_stop", b"\x80\x02K\x01", E, "ends before STOP")
    invalid(out, "int_garbage", b"I12a\n.", E, "malformed integer")
    invalid(out, "string_unquoted", b"Sabc\n.", E, "must be quoted")
    invalid(out, "append_to_frozenset", b"\x80\x04(K\x01\x91K\x02a.", E,
            "append to a set")
    invalid(out, "additems_on_list", b"\x80\x04](K\x01\x90.", E,
            "not a set")
    # main's first corpus: cases the ones above do not cover
    invalid(out, "appends_no_mark", b"]e.", E, "no MARK")
    invalid(out, "bad_utf8", b"\x80\x04X\x02\x00\x00\x00\xff\xfe.", E, "UTF-8")
    invalid(out, "bytes_past_end", b"\x80\x03B\xff\xff\x00\x00ab.", E,
            "truncated")
    invalid(out, "long4_huge",
            b"\x80\x02\x8b\x00\x00\x00\x40" + b"\x00" * 16 + b".", B,
            "does not fit int64")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    invalid(out, "os_system", pickle.dumps(Evil(), protocol=4), R,
            "posix.system")
    invalid(out, "truncated", pickle.dumps(plain_value(4), protocol=4)[:-9],
            E, "runs past the input")  # its FRAME says how long it was
    invalid(out, "build_twice",
            b"\x80\x02c__builtin__\nobject\n)\x81}b}b.", E, "has a state")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "..", "corpus", "pickle")
    for sub in ("valid", "invalid", "special"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    gen_plain(out)
    gen_plain_main(out)
    gen_special(out)
    gen_numpy(out)
    gen_torch(out)
    gen_dcp(out)
    gen_invalid(out)


if __name__ == "__main__":
    main()
