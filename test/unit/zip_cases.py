#!/usr/bin/python3
"""zip_cases.py - write the zip corpus of test_zip.c (test/corpus/zip/).

Run with Debian's /usr/bin/python3 (it has torch 1.13):

    /usr/bin/python3 test/unit/zip_cases.py test/corpus/zip

valid/CASE/input.zip is an archive written by Python's zipfile or by
torch.save; valid/CASE/expected.txt is what the reader must find, computed
here from zipfile.ZipInfo and this script's own parse of each local header
(never from the C reader):

    region OFF LEN            optional: open the region [OFF, OFF+LEN) of
                              input.zip (the whole file must then fail)
    count N                   number of entries
    entry METHOD SIZE CSIZE HEADER_OFF DATA_OFF NAME
                              one per entry, in central directory order;
                              NAME is the rest of the line
    data FILE NAME            the stored bytes of entry NAME equal FILE
                              (a file in the case's directory)

invalid/CASE/input.zip is a broken archive (a valid one with bytes patched
where zipfile's ZipInfo says the field lies); invalid/CASE/error holds
"CODE SUBSTRING": the error code's name and a substring of the reason.
"""
import io
import os
import shutil
import struct
import sys
import warnings
import zipfile

import torch

DT = (2020, 1, 2, 3, 4, 6)


def local_data_off(data, zi):
    """Data offset of entry zi from its local header (our own parse)."""
    h = zi.header_offset
    sig, = struct.unpack_from('<I', data, h)
    assert sig == 0x04034b50, zi.filename
    nlen, xlen = struct.unpack_from('<HH', data, h + 26)
    assert data[h + 30:h + 30 + nlen] == zi.filename.encode('utf-8') or \
        data[h + 30:h + 30 + nlen] == zi.filename.encode('cp437')
    return h + 30 + nlen + xlen


def write_valid(root, case, data, region=None, bins=(), parse=None):
    """Write a valid case. data: the file; region: (off, len) of the
    archive inside it; bins: (file name, entry name, bytes) that must
    match, beside every stored entry's bytes zipfile reads; parse: what
    zipfile reads instead of data, where zipfile cannot read data itself
    (same entries, same offsets)."""
    d = os.path.join(root, 'valid', case)
    os.makedirs(d)
    with open(os.path.join(d, 'input.zip'), 'wb') as f:
        f.write(data)
    arch = data if region is None else data[region[0]:region[0] + region[1]]
    if parse is not None:
        assert len(parse) == len(arch)
        arch = parse
    z = zipfile.ZipFile(io.BytesIO(arch))
    lines = []
    if region is not None:
        lines.append('region %d %d' % region)
    infos = z.infolist()
    lines.append('count %d' % len(infos))
    for zi in infos:
        lines.append('entry %d %d %d %d %d %s' % (
            zi.compress_type, zi.file_size, zi.compress_size,
            zi.header_offset, local_data_off(arch, zi), zi.filename))
    for i, zi in enumerate(infos):
        if zi.compress_type != zipfile.ZIP_STORED:
            continue
        fn = 'entry%d.bin' % i
        with open(os.path.join(d, fn), 'wb') as f:
            f.write(z.read(zi))
        lines.append('data %s %s' % (fn, zi.filename))
    for fn, name, raw in bins:
        with open(os.path.join(d, fn), 'wb') as f:
            f.write(raw)
        lines.append('data %s %s' % (fn, name))
    with open(os.path.join(d, 'expected.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def write_invalid(root, case, data, code, reason):
    d = os.path.join(root, 'invalid', case)
    os.makedirs(d)
    with open(os.path.join(d, 'input.zip'), 'wb') as f:
        f.write(data)
    with open(os.path.join(d, 'error'), 'w') as f:
        f.write('%s %s\n' % (code, reason))


def make_zip(entries, compression=zipfile.ZIP_STORED, comment=b''):
    b = io.BytesIO()
    with zipfile.ZipFile(b, 'w', compression) as z:
        for name, content in entries:
            zi = zipfile.ZipInfo(name, date_time=DT)
            zi.compress_type = compression
            z.writestr(zi, content)
        z.comment = comment
    return b.getvalue()


def make_zip64(entries):
    """ZIP64 everywhere: local headers (force_zip64), central extra fields
    and end records (zipfile's limits lowered while writing)."""
    saved = (zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT)
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0
    try:
        b = io.BytesIO()
        with zipfile.ZipFile(b, 'w') as z:
            for name, content in entries:
                zi = zipfile.ZipInfo(name, date_time=DT)
                with z.open(zi, 'w', force_zip64=True) as f:
                    f.write(content)
        data = b.getvalue()
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved
    assert data.find(b'PK\x06\x06') > 0 and data.find(b'PK\x06\x07') > 0
    return data


def eocd_pos(data):
    p = data.rfind(b'PK\x05\x06')
    assert p >= 0
    return p


def torch_bytes(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def raw(t):
    return t.contiguous().numpy().tobytes()


ENTRIES = [('hello.txt', b'hello, zip\n'),
           ('dir/empty', b''),
           ('dir/data.bin', bytes(range(256)) * 3),
           ('name with spaces', b'x' * 100)]


def valid_cases(root):
    write_valid(root, 'zipfile_stored', make_zip(ENTRIES))
    write_valid(root, 'zipfile_deflated',
                make_zip(ENTRIES, zipfile.ZIP_DEFLATED))
    write_valid(root, 'zipfile_comment',
                make_zip(ENTRIES[:2], comment=b'an archive comment'))
    # a comment that holds an end record's signature: the scan must skip
    # it (zipfile itself fails here: it takes the last signature), so
    # zipfile reads the same archive with one byte of the comment changed
    good = make_zip(ENTRIES[:2], comment=b'a comment PK\x05\x07 inside')
    write_valid(root, 'comment_with_signature',
                good.replace(b'PK\x05\x07', b'PK\x05\x06'), parse=good)
    write_valid(root, 'zipfile_zip64', make_zip64(ENTRIES))
    # the same with every field of the end record maxed (APPNOTE 4.4.1.4:
    # the values are then in the ZIP64 end record); zipfile reads it
    d = bytearray(make_zip64(ENTRIES))
    p = eocd_pos(d)
    struct.pack_into('<HHII', d, p + 8, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    write_valid(root, 'zipfile_zip64_maxed', bytes(d))
    write_valid(root, 'zipfile_empty', make_zip([]))

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    write_valid(root, 'torch_tensor', torch_bytes(t),
                bins=[('tensor.bin', 'archive/data/0', raw(t))])
    sd = {'w': torch.linspace(-1, 1, 10), 'b': torch.arange(7, dtype=torch.int64),
          'm': torch.tensor([[True, False], [False, True]])}
    data = torch_bytes(sd)
    z = zipfile.ZipFile(io.BytesIO(data))
    # which storage key holds which tensor: the order torch pickled them
    keys = sorted(n for n in z.namelist() if '/data/' in n)
    bins = []
    for n in keys:
        blob = z.read(n)
        match = [k for k, v in sd.items() if raw(v) == blob]
        assert len(match) == 1, n
        bins.append(('tensor_%s.bin' % match[0], n, raw(sd[match[0]])))
    write_valid(root, 'torch_dict', data, bins=bins)
    s = torch.tensor(3.5, dtype=torch.float64)
    write_valid(root, 'torch_scalar', torch_bytes(s),
                bins=[('tensor.bin', 'archive/data/0', raw(s))])

    # two archives back to back after junk, as in a .distcp: the second
    # is opened as a region
    a = torch_bytes(torch.zeros(5))
    t2 = torch.arange(100, 116, dtype=torch.int32)
    b = torch_bytes(t2)
    junk = b'junk PK\x03\x04 PK\x05\x06 junk' + bytes(41)
    data = junk + a + b
    write_valid(root, 'torch_concat', data,
                region=(len(junk) + len(a), len(b)),
                bins=[('tensor.bin', 'archive/data/0', raw(t2))])


def central_offsets(data):
    """Offsets of the central headers, in order (our own walk)."""
    p = eocd_pos(data)
    count, size, off = struct.unpack_from('<HII', data, p + 10)
    out = []
    for _ in range(count):
        assert struct.unpack_from('<I', data, off)[0] == 0x02014b50
        out.append(off)
        nl, xl, cl = struct.unpack_from('<HHH', data, off + 28)
        off += 46 + nl + xl + cl
    return out


def invalid_cases(root):
    base = make_zip(ENTRIES)
    infos = zipfile.ZipFile(io.BytesIO(base)).infolist()
    cen = central_offsets(base)
    p = eocd_pos(base)

    d = bytearray(base)
    struct.pack_into('<I', d, p + 16, len(base) + 10)
    write_invalid(root, 'eocd_past_end', bytes(d), 'SF_EFORMAT',
                  'does not end at the end record')

    d = bytearray(base)
    struct.pack_into('<HH', d, p + 8, len(ENTRIES) + 1, len(ENTRIES) + 1)
    write_invalid(root, 'count_too_high', bytes(d), 'SF_EFORMAT',
                  'central directory holds 4 entries, not the 5')

    d = bytearray(base)
    struct.pack_into('<HH', d, p + 8, len(ENTRIES) - 1, len(ENTRIES) - 1)
    write_invalid(root, 'count_too_low', bytes(d), 'SF_EFORMAT',
                  'bytes of the central directory follow')

    d = bytearray(base)
    struct.pack_into('<HH', d, p + 8, 60000, 60000)
    write_invalid(root, 'count_huge', bytes(d), 'SF_EFORMAT',
                  'cannot fit in a central directory')

    d = bytearray(base)
    d[infos[2].header_offset + 30] ^= 0x20  # 'dir/data.bin' -> 'Dir/...'
    write_invalid(root, 'local_name_mismatch', bytes(d), 'SF_EFORMAT',
                  'the local header names another entry')

    d = bytearray(base)
    d[infos[1].header_offset + 1] = ord('X')
    write_invalid(root, 'local_bad_signature', bytes(d), 'SF_EFORMAT',
                  'no local header signature')

    # entry 0's data grows into entry 1's local header (sizes agree)
    d = bytearray(base)
    struct.pack_into('<II', d, cen[0] + 20, 40, 40)
    write_invalid(root, 'overlap_data', bytes(d), 'SF_EFORMAT', 'overlap')

    # two entries of the same name share one local header
    dup = make_zip([('same', b'abc'), ('same', b'def')])
    dcen = central_offsets(dup)
    d = bytearray(dup)
    struct.pack_into('<I', d, dcen[1] + 42, 0)
    write_invalid(root, 'overlap_same_header', bytes(d), 'SF_EFORMAT',
                  'entries "same" and "same" overlap')

    d = bytearray(base)
    struct.pack_into('<H', d, cen[0] + 8, 0x0001)
    write_invalid(root, 'encrypted', bytes(d), 'SF_EFORMAT', 'encrypted')

    nul = make_zip([('a\x01b', b'abc')])
    d = bytearray(nul)
    d = bytearray(bytes(d).replace(b'a\x01b', b'a\x00b'))
    write_invalid(root, 'nul_in_name', bytes(d), 'SF_EFORMAT', 'NUL')

    d = bytearray(base)
    struct.pack_into('<H', d, p + 4, 1)
    write_invalid(root, 'multi_disk', bytes(d), 'SF_EFORMAT', 'multi-disk')

    d = bytearray(base)
    struct.pack_into('<I', d, cen[3] + 20, 0xFFFFFFFF)
    write_invalid(root, 'zip64_extra_missing', bytes(d), 'SF_EFORMAT',
                  'no ZIP64 extra field')

    z64 = make_zip64(ENTRIES)
    loc = z64.rfind(b'PK\x06\x07')
    d = bytearray(z64)
    struct.pack_into('<Q', d, loc + 8, 1 << 40)
    write_invalid(root, 'zip64_locator_outside', bytes(d), 'SF_EFORMAT',
                  'ZIP64 locator points outside')

    d = bytearray(z64)
    struct.pack_into('<Q', d, loc + 8, 0)
    write_invalid(root, 'zip64_locator_wrong', bytes(d), 'SF_EFORMAT',
                  'no ZIP64 end record where the locator points')

    d = bytearray(z64)
    rec = z64.rfind(b'PK\x06\x06')
    struct.pack_into('<Q', d, rec + 32, len(ENTRIES) + 7)
    write_invalid(root, 'zip64_disagrees', bytes(d), 'SF_EFORMAT',
                  'disagree')

    d = bytearray(base)
    pe = eocd_pos(d)
    struct.pack_into('<HHII', d, pe + 8, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    write_invalid(root, 'maxed_without_zip64', bytes(d), 'SF_EFORMAT',
                  'has no ZIP64 locator')

    write_invalid(root, 'not_a_zip', b'this is not a zip archive at all, ' * 3,
                  'SF_EFORMAT', 'no end of central directory record')
    write_invalid(root, 'too_short', b'PK\x05\x06', 'SF_EFORMAT',
                  'too short for an end record')

    # one name twice (issue 30): Python's zipfile reads the last entry of
    # a repeated name, torch's miniz whichever its search meets, ignoring
    # ASCII case; the reader refuses the archive
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # zipfile: "Duplicate name"
        write_invalid(root, 'duplicate_name',
                      make_zip([('a', b'1'), ('same', b'first'), ('same', b'second')]),
                      'SF_EFORMAT', 'entry "same" is in the archive twice (entries 1 and 2)')
        write_invalid(root, 'duplicate_case',
                      make_zip([('dir/Data.bin', b'upper'), ('dir/data.bin', b'lower')]),
                      'SF_EFORMAT', 'entries "dir/Data.bin" and "dir/data.bin" differ only in case')
        # a real torch.save archive with a second storage entry and a
        # second data.pkl appended (zipfile's append mode rewrites the
        # central directory after them)
        t = torch.arange(6, dtype=torch.float32)
        for case, name, blob in (
                ('torch_duplicate_storage', 'archive/data/0', raw(t + 1)),
                ('torch_duplicate_data_pkl', 'archive/data.pkl',
                 zipfile.ZipFile(io.BytesIO(torch_bytes(t + 1))).read('archive/data.pkl'))):
            b = io.BytesIO(torch_bytes(t))
            with zipfile.ZipFile(b, 'a') as z:
                z.writestr(zipfile.ZipInfo(name, date_time=DT), blob)
            write_invalid(root, case, b.getvalue(), 'SF_EFORMAT',
                          'entry "%s" is in the archive twice' % name)

    # the torch concatenation opened whole: offsets are the second
    # archive's own, so its central directory points at the first
    a = torch_bytes(torch.zeros(5))
    b = torch_bytes(torch.ones(3))
    write_invalid(root, 'torch_concat_whole', a + b, 'SF_EFORMAT',
                  'does not end at its locator')


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else 'test/corpus/zip'
    for sub in ('valid', 'invalid'):
        shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
    valid_cases(root)
    invalid_cases(root)


if __name__ == '__main__':
    main()
