"""shardfs.dtypes - the safetensors dtype names shardfs knows, and their
numpy counterparts.

Every dtype has a "raw" numpy type of its itemsize that holds its bits
exactly: the native type where numpy has one, uint16 for BF16 and uint8
for the F8 types (numpy has neither). to_float32() turns the raw bits of a
floating dtype into float32 values: BF16 by shifting its 16 bits into the
high half of a float32, F8 through a 256-entry table built from the
format's definition (E4M3 as torch's float8_e4m3fn: bias 7, no infinity,
S.1111.111 is NaN; E5M2: bias 15, IEEE-style infinities and NaNs).

numpy is imported on first use only, so `import shardfs` stays cheap.
"""

import math

# safetensors dtype name -> (itemsize, raw numpy dtype string, native?)
DTYPES = {
    "F64": (8, "<f8", True), "F32": (4, "<f4", True), "F16": (2, "<f2", True),
    "BF16": (2, "<u2", False),
    "F8_E4M3": (1, "|u1", False), "F8_E5M2": (1, "|u1", False),
    "I64": (8, "<i8", True), "I32": (4, "<i4", True), "I16": (2, "<i2", True),
    "I8": (1, "|i1", True),
    "U64": (8, "<u8", True), "U32": (4, "<u4", True), "U16": (2, "<u2", True),
    "U8": (1, "|u1", True), "BOOL": (1, "|b1", True),
}
ITEMSIZE = {name: v[0] for name, v in DTYPES.items()}
FLOATING = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")

# numpy dtype .str (little-endian or byte-sized) -> safetensors name, for
# the native types
NP_TO_ST = {raw: name for name, (_, raw, native) in DTYPES.items() if native}

_np = None
_f8_tables = {}


def np():
    """The numpy module, imported on first use."""
    global _np
    if _np is None:
        import numpy
        _np = numpy
    return _np


def raw_dtype(name):
    """The numpy dtype holding name's bits (KeyError for an unknown name)."""
    return np().dtype(DTYPES[name][1])


def _f8_value(b, exp_bits, bias, ieee):
    sign = -1.0 if b & 0x80 else 1.0
    man_bits = 7 - exp_bits
    e = (b >> man_bits) & ((1 << exp_bits) - 1)
    m = b & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if ieee and e == top:                       # E5M2: inf and NaN
        return sign * math.inf if m == 0 else math.nan
    if not ieee and e == top and m == (1 << man_bits) - 1:
        return math.nan                         # E4M3fn: only S.1111.111
    if e == 0:                                  # subnormal
        return sign * m * 2.0 ** (1 - bias - man_bits)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


def f8_table(name):
    """float32 value of each of the 256 bit patterns of an F8 dtype."""
    t = _f8_tables.get(name)
    if t is None:
        exp_bits, bias, ieee = {"F8_E4M3": (4, 7, False),
                                "F8_E5M2": (5, 15, True)}[name]
        t = np().array([_f8_value(b, exp_bits, bias, ieee) for b in range(256)],
                       dtype=np().float32)
        _f8_tables[name] = t
    return t


def to_float32(raw, name):
    """float32 values of raw (an array of name's raw dtype). Floating dtypes
    only; ValueError for integer and bool dtypes."""
    n = np()
    if name == "BF16":
        return (raw.astype(n.uint32) << 16).view(n.float32)
    if name in ("F8_E4M3", "F8_E5M2"):
        return f8_table(name)[raw]
    if name in ("F16", "F32", "F64"):
        return raw.astype(n.float32)
    raise ValueError("%s is not a floating dtype: no float32 view" % name)
