"""pickle_cases - the pickle reader's corpus, from pickles Python wrote.

    /usr/bin/python3 test/unit/pickle_cases.py test/corpus/pickle

valid/CASE/input.pkl + expected.txt: the canonical dump (below) of the
value, computed here from the Python value itself, which the C test's
dumper must reproduce from the decoded graph. Protocols 0 to 5 of plain
data: None, bools, ints (to 2**63-1), floats, strings, bytes, tuples,
lists, dicts, sets, shared and self-referencing containers.
special/CASE/input.pkl + what.txt: pickles torch and numpy wrote, checked
by property (see test_pickle.c). invalid/CASE/input.pkl + error: "CODE
substring".

Dump: N, T/F, I<decimal>, D<16 hex of the big-endian double>, S<hex of
UTF-8>, B<hex>, (a,b) tuple, [a,b] list and set, {k:v,...} dict; "^"
beyond depth 12 (cycles).
"""
import collections
import dataclasses
import io
import os
import pickle
import shutil
import struct
import sys

import numpy as np

out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)


def dump(v, depth=0):
    if depth > 12:
        return "^"
    if v is None:
        return "N"
    if v is True:
        return "T"
    if v is False:
        return "F"
    if isinstance(v, int):
        return "I%d" % v
    if isinstance(v, float):
        return "D" + struct.pack(">d", v).hex()
    if isinstance(v, str):
        return "S" + v.encode().hex()
    if isinstance(v, (bytes, bytearray)):
        return "B" + bytes(v).hex()
    if isinstance(v, tuple):
        return "(" + ",".join(dump(x, depth + 1) for x in v) + ")"
    if isinstance(v, (list, set, frozenset)):
        return "[" + ",".join(dump(x, depth + 1) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(dump(k, depth + 1) + ":" + dump(x, depth + 1)
                              for k, x in v.items()) + "}"
    raise TypeError(type(v))


def value(proto):
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


def write(kind, name, files):
    d = os.path.join(out, kind, name)
    os.makedirs(d)
    for n, data in files.items():
        with open(os.path.join(d, n), "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)


for p in range(0, 6):
    v = value(p)
    write("valid", "proto%d" % p, {"input.pkl": pickle.dumps(v, protocol=p),
                                   "expected.txt": dump(v) + "\n"})
big = list(range(3000))
write("valid", "long_list", {"input.pkl": pickle.dumps(big, protocol=4),
                             "expected.txt": dump(big) + "\n"})


@dataclasses.dataclass
class Point:
    x: int
    y: str


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a, self.b = 1, "two"


arr = np.arange(1200, dtype=np.float32).reshape(30, 40)
for p in (3, 4):
    write("special", "numpy_p%d" % p, {"input.pkl": pickle.dumps(arr, protocol=p),
                                       "data.bin": arr.tobytes(),
                                       "what.txt": "numpy\n"})
write("special", "ordered_dict", {"input.pkl": pickle.dumps(
    collections.OrderedDict(a=1, b=2), protocol=2), "what.txt": "ordered_dict\n"})
Point.__module__ = "mod"
Point.__qualname__ = "Point"
sys.modules["mod"] = sys.modules[__name__]
write("special", "dataclass", {"input.pkl": pickle.dumps(Point(3, "q"), protocol=4),
                               "what.txt": "dataclass\n"})
Slotted.__module__ = "mod"
write("special", "slots", {"input.pkl": pickle.dumps(Slotted(), protocol=4),
                           "what.txt": "slots\n"})


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


write("invalid", "os_system", {"input.pkl": pickle.dumps(Evil(), protocol=4),
                               "error": "SF_EREFUSED posix.system"})
write("invalid", "unknown_opcode", {"input.pkl": b"\x80\x04\xff.", "error": "SF_EFORMAT opcode 0xff"})
write("invalid", "memo_missing", {"input.pkl": b"\x80\x02h\x05.", "error": "SF_EFORMAT memo entry 5"})
write("invalid", "stop_empty", {"input.pkl": b".", "error": "SF_EFORMAT underflow"})
write("invalid", "appends_no_mark", {"input.pkl": b"]e.", "error": "SF_EFORMAT MARK"})
write("invalid", "deep_marks", {"input.pkl": b"(" * 5000 + b".", "error": "SF_ETOOBIG deeper"})
write("invalid", "bytes_past_end", {"input.pkl": b"\x80\x03B\xff\xff\x00\x00ab.", "error": "SF_EFORMAT past the end"})
write("invalid", "long4_huge", {"input.pkl": b"\x80\x02\x8b\x00\x00\x00\x40" + b"\x00" * 16 + b".",
                                "error": "SF_EFORMAT more than 64 bits"})
write("invalid", "bad_utf8", {"input.pkl": b"\x80\x04X\x02\x00\x00\x00\xff\xfe.", "error": "SF_EFORMAT UTF-8"})
write("invalid", "inst", {"input.pkl": b"(imod\nC\n.", "error": "SF_EFORMAT INST"})
write("invalid", "truncated", {"input.pkl": pickle.dumps(value(4), protocol=4)[:-9],
                               "error": "SF_EFORMAT past the end"})
