"""zip_cases - the zip reader's corpus, from archives Python and torch wrote.

    /usr/bin/python3 test/unit/zip_cases.py test/corpus/zip

valid/CASE/input.zip + expected.txt: one line per entry,
"NAME METHOD SIZE CSIZE DATA_OFF", computed here from zipfile's ZipInfo
and this script's own parse of each local header (so the expected values
come from Python, not from the C reader). invalid/CASE/input.zip + error:
"CODE substring" of what the reader must say, for archives broken on
purpose by editing one field of a real archive.
"""
import io
import os
import shutil
import struct
import sys
import zipfile

import torch

out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)


def expected(data):
    z = zipfile.ZipFile(io.BytesIO(data))
    lines = []
    for i in z.infolist():
        h = i.header_offset
        assert data[h:h + 4] == b"PK\x03\x04"
        nlen, xlen = struct.unpack_from("<HH", data, h + 26)
        lines.append("%s %d %d %d %d" % (i.filename, i.compress_type, i.file_size,
                                        i.compress_size, h + 30 + nlen + xlen))
    return "\n".join(lines) + ("\n" if lines else "")


def valid(name, data):
    d = os.path.join(out, "valid", name)
    os.makedirs(d)
    open(os.path.join(d, "input.zip"), "wb").write(data)
    open(os.path.join(d, "expected.txt"), "w").write(expected(data))


def invalid(name, data, err):
    d = os.path.join(out, "invalid", name)
    os.makedirs(d)
    open(os.path.join(d, "input.zip"), "wb").write(data)
    open(os.path.join(d, "error"), "w").write(err + "\n")


def pyzip(method, comment=b"", force64=False, files=(("a.txt", b"hello"), ("dir/b.bin", bytes(range(256)) * 20))):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", method) as z:
        for n, v in files:
            with z.open(zipfile.ZipInfo(n), "w", force_zip64=force64) as f:
                f.write(v)
        z.comment = comment
    return b.getvalue()


def tsave(v):
    b = io.BytesIO()
    torch.save(v, b)
    return b.getvalue()


stored = pyzip(zipfile.ZIP_STORED)
valid("stored", stored)
valid("deflated", pyzip(zipfile.ZIP_DEFLATED))
valid("comment", pyzip(zipfile.ZIP_STORED, comment=b"a comment"))
valid("zip64", pyzip(zipfile.ZIP_STORED, force64=True))
valid("empty", pyzip(zipfile.ZIP_STORED, files=()))
valid("torch_tensor", tsave(torch.arange(10, dtype=torch.float32)))
valid("torch_dict", tsave({"a": torch.ones(3), "b": torch.zeros(2, 2, dtype=torch.int64)}))
valid("torch_scalar", tsave(torch.tensor(1.5)))

# two torch.save archives after junk: the test opens the second as a region
t = torch.arange(12, dtype=torch.int32)
first, second = tsave(torch.ones(5)), tsave(t)
d = os.path.join(out, "region")
os.makedirs(d)
blob = b"junk" * 7 + first + second
open(os.path.join(d, "input.bin"), "wb").write(blob)
open(os.path.join(d, "region.txt"), "w").write("%d %d\n" % (28 + len(first), len(second)))
open(os.path.join(d, "tensor.bin"), "wb").write(t.numpy().tobytes())
open(os.path.join(d, "expected.txt"), "w").write(expected(second))

# broken on purpose
eocd = stored.rindex(b"PK\x05\x06")
cdoff = struct.unpack_from("<I", stored, eocd + 16)[0]
b = bytearray(stored); struct.pack_into("<I", b, eocd + 16, len(stored) + 100)
invalid("cd_past_end", bytes(b), "SF_EFORMAT outside the archive")
b = bytearray(stored); struct.pack_into("<HH", b, eocd + 8, 40, 40)
invalid("count_lies", bytes(b), "SF_EFORMAT cannot fit")
b = bytearray(stored); b[30] ^= 0x01  # first local name byte
invalid("name_mismatch", bytes(b), "SF_EFORMAT names differ")
b = bytearray(stored); struct.pack_into("<H", b, cdoff + 8, 1)
invalid("encrypted", bytes(b), "SF_EFORMAT encrypted")
b = bytearray(stored); b[cdoff + 46] = 0; b[30] = 0
invalid("nul_name", bytes(b), "SF_EFORMAT NUL")
# second central record points at the first entry's header: overlap
cd2 = stored.index(b"PK\x01\x02", cdoff + 4)
b = bytearray(stored)
n1 = struct.unpack_from("<H", stored, cd2 + 28)[0]
b[cd2 + 46:cd2 + 46 + n1] = b"a.txt".ljust(n1, b"x")[:n1]
struct.pack_into("<I", b, cd2 + 42, 0)
invalid("overlap", bytes(b), "SF_EFORMAT ")
z64 = pyzip(zipfile.ZIP_STORED, force64=True)
t64 = tsave(torch.ones(2))
loc = t64.rindex(b"PK\x06\x07")
b = bytearray(t64); struct.pack_into("<Q", b, loc + 8, len(t64) * 4)
invalid("zip64_locator_outside", bytes(b), "SF_EFORMAT ZIP64")
invalid("not_a_zip", b"just some bytes, not an archive at all", "SF_EFORMAT no end of central directory")
