#!/usr/bin/python3
"""Unit test of the shardfs Python package without a mount (issue 14,
item 9): its safetensors reader and its dtype conversions.

- Files real frameworks wrote (test/fixtures/hf: transformers 5.24's BF16
  model.safetensors, transformers 4.46's F16 shards, torch 2.15's
  HuggingFaceStorageWriter with F32, BF16, F16 and I64): every tensor's
  dtype, shape, size and XXH3 equal the NAME.expected.json that holds what
  was handed to the framework (never read back from the files); mmap reads
  equal plain reads; boxes (t[...] with ints, negative indices, steps,
  Ellipsis) equal numpy's indexing of the whole array; bad boxes raise
  IndexError.
- BF16 as float32: equal to a conversion done here on the raw bytes (two
  zero bytes below each BF16 pair), and to torch's bfloat16 -> float32
  when torch is importable.
- F8: known values of the E4M3 (fn) and E5M2 encodings (1, the largest
  finite, the smallest subnormal and normal, infinities, NaNs).
- Hostile headers, each built from the real transformers file by editing
  its header: a length over 100 MB, a length past the end of the file,
  offsets outside the data, begin > end, an unknown dtype, bytes that do
  not match dtype and shape, overlapping entries, a hole, trailing bytes,
  duplicate keys, non-JSON, JSON nested 100000 deep, non-UTF-8,
  non-string metadata, a file shorter than 8 bytes: each raises SafetensorsError naming the rule; and 300
  random byte flips in the header either open to the right sizes or raise
  SafetensorsError, nothing else.

Run with /usr/bin/python3 (numpy, xxhash); PYTHONPATH=python or run from
the source tree. Exit 0 pass, 1 fail.
"""

import json
import math
import os
import random
import struct
import sys
import tempfile
import traceback

import numpy as np
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
try:
    import shardfs
except ImportError:
    sys.path.insert(0, os.path.join(TOP, "python"))
    import shardfs
from shardfs import dtypes as sfd  # noqa: E402

HF = os.path.join(TOP, "test", "fixtures", "hf")
FIXTURES = [  # (safetensors files, expected.json)
    (["transformers-5.24/llama-single/model.safetensors"],
     "transformers-5.24/llama-single.expected.json"),
    (["transformers-4.46/llama-st/model-0000%d-of-00004.safetensors" % i for i in range(1, 5)],
     "transformers-4.46/llama-st.expected.json"),
    (["torch-2.15/dcp-hf-one/model-00001-of-00002.safetensors",
      "torch-2.15/dcp-hf-one/model-00002-of-00002.safetensors"],
     "torch-2.15/dcp-hf-one.expected.json"),
]
BASE = os.path.join(HF, "transformers-5.24/llama-single/model.safetensors")

failures = []
passed = 0


def check(cond, msg):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(msg)
        print("FAIL:", msg)


def check_fixtures(rng):
    for files, exp_rel in FIXTURES:
        with open(os.path.join(HF, exp_rel)) as f:
            exp = json.load(f)["tensors"]
        seen = set()
        for rel in files:
            path = os.path.join(HF, rel)
            with shardfs.open(path) as st:
                check(isinstance(st, shardfs.SafetensorsFile), "%s opens as safetensors" % rel)
                for name in st.names():
                    seen.add(name)
                    t = st[name]
                    e = exp.get(name)
                    if not e:
                        check(False, "%s: %s is not in %s" % (rel, name, exp_rel))
                        continue
                    a = t.numpy()
                    check((t.dtype_name, list(t.shape), t.nbytes) ==
                          (e["dtype"], e["shape"], e["nbytes"]),
                          "%s: %s: dtype, shape, size %s vs %s" % (
                              rel, name, (t.dtype_name, t.shape, t.nbytes), e))
                    check(a.dtype_name == e["dtype"] and a.dtype == sfd.raw_dtype(e["dtype"])
                          and list(a.shape) == e["shape"],
                          "%s: %s: array dtype_name %s, dtype %s" % (rel, name, a.dtype_name,
                                                                    a.dtype))
                    check("%016x" % xxhash.xxh3_64_intdigest(a.tobytes()) == e["xxh3"],
                          "%s: %s: xxh3 of the bytes" % (rel, name))
                    check(t.numpy(mmap=True).tobytes() == a.tobytes(),
                          "%s: %s: mmap read" % (rel, name))
                    check_boxes(rng, t, a, "%s: %s" % (rel, name))
                    if e["dtype"] == "BF16":
                        check_bf16(t, a, "%s: %s" % (rel, name))
        check(seen == set(exp), "%s: the files hold exactly the expected tensors" % exp_rel)


def random_key(rng, shape):
    key = []
    for n in shape:
        k = rng.random()
        if k < 0.2:
            key.append(rng.randrange(-n, n))
        elif k < 0.3:
            key.append(Ellipsis if Ellipsis not in key else slice(None))
        else:
            a, b = rng.randrange(-n - 1, n + 2), rng.randrange(-n - 1, n + 2)
            key.append(slice(a if rng.random() < 0.8 else None, b if rng.random() < 0.8
                             else None, rng.choice([None, 1, 2, 3, -1, -2])))
    return tuple(key[:rng.randrange(len(key) + 1)])


def check_boxes(rng, t, a, label):
    if not t.shape or 0 in t.shape:
        return
    for _ in range(4):
        key = random_key(rng, t.shape)
        got = t[key]
        want = np.asarray(a[key])
        check(got.shape == want.shape and got.tobytes() == want.tobytes() and
              got.dtype_name == t.dtype_name, "%s[%r]: %s vs numpy's %s" % (
                  label, key, got.shape, want.shape))
    for bad in ((t.shape[0],), (-t.shape[0] - 1,), (0,) * (len(t.shape) + 1)):
        try:
            t[bad]
            check(False, "%s[%r] should raise IndexError" % (label, bad))
        except IndexError:
            check(True, "")
    try:
        t.read_box([(0, t.shape[0] + 1)] + [(0, n) for n in t.shape[1:]])
        check(False, "%s: a box past the end should raise IndexError" % label)
    except IndexError:
        check(True, "")


def check_bf16(t, a, label):
    raw = a.tobytes()
    by_bytes = np.frombuffer(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)),
                             dtype="<f4").reshape(a.shape)
    f = t.numpy(float32=True)
    check(f.dtype == np.float32 and f.dtype_name == "F32" and
          f.tobytes() == by_bytes.tobytes(), "%s: float32 from BF16 vs the bytes" % label)
    try:
        import torch
    except ImportError:
        return
    ref = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float().numpy()
    check(f.reshape(-1).tobytes() == ref.tobytes(), "%s: float32 from BF16 vs torch" % label)


def check_f8():
    e4 = sfd.f8_table("F8_E4M3")
    e5 = sfd.f8_table("F8_E5M2")
    known4 = {0x00: 0.0, 0x38: 1.0, 0xB8: -1.0, 0x7E: 448.0, 0xFE: -448.0,
              0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x40: 2.0}
    known5 = {0x00: 0.0, 0x3C: 1.0, 0xBC: -1.0, 0x7B: 57344.0, 0x01: 2.0 ** -16,
              0x04: 2.0 ** -14, 0x7C: math.inf, 0xFC: -math.inf, 0x40: 2.0}
    for b, v in known4.items():
        check(e4[b] == v, "F8_E4M3 0x%02x = %r, got %r" % (b, v, e4[b]))
    for b, v in known5.items():
        check(e5[b] == v, "F8_E5M2 0x%02x = %r, got %r" % (b, v, e5[b]))
    check(math.isnan(e4[0x7F]) and math.isnan(e4[0xFF]) and
          sum(math.isnan(x) for x in e4) == 2, "F8_E4M3: NaN only at S.1111.111")
    check(math.isnan(e5[0x7D]) and sum(math.isnan(x) for x in e5) == 6 and
          sum(math.isinf(x) for x in e5) == 2, "F8_E5M2: 6 NaNs, 2 infinities")
    raw = np.array([[0x38, 0x7E], [0x01, 0x80]], dtype=np.uint8)
    f = sfd.to_float32(raw, "F8_E4M3")
    check(f.dtype == np.float32 and f.tolist() == [[1.0, 448.0], [2.0 ** -9, -0.0]],
          "to_float32 of F8_E4M3 keeps the shape: %r" % f.tolist())


def split(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf)
    return json.loads(buf[8:8 + n]), buf[8 + n:]


def build(header, data, raw_header=None, length=None):
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def expect_refused(tmp, label, blob, phrase):
    path = os.path.join(tmp, "h.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    try:
        with shardfs.open(path):
            pass
        check(False, "%s: opened, want SafetensorsError" % label)
    except shardfs.SafetensorsError as e:
        check(phrase in str(e) and path in str(e),
              "%s: the error names the rule (%r) and the file: %s" % (label, phrase, e))
    except Exception as e:  # anything else is a bug of the reader
        check(False, "%s: raised %s: %s, want SafetensorsError" % (
            label, type(e).__name__, e))


def check_hostile(tmp):
    header, data = split(BASE)
    names = sorted((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][0])
    first, second = names[0], names[1]
    ok = build(header, data)
    with open(os.path.join(tmp, "ok.safetensors"), "wb") as f:
        f.write(ok)
    with shardfs.open(os.path.join(tmp, "ok.safetensors")) as st:
        check(len(st) == len(names), "the re-serialized header opens (%d tensors)" % len(st))

    def edited(fn):
        h = json.loads(json.dumps(header))
        fn(h)
        return build(h, data)

    expect_refused(tmp, "length over 100 MB",
                   build(header, data, length=shardfs.HEADER_MAX + 1), "over the")
    expect_refused(tmp, "length past the end", build(header, data, length=len(ok)),
                   "runs past the end")
    expect_refused(tmp, "shorter than 8 bytes", b"\x10\0\0", "shorter than the header length")
    expect_refused(tmp, "end past the data",
                   edited(lambda h: h[names[-1]]["data_offsets"].__setitem__(
                       1, len(data) + 1)), "outside the data")
    expect_refused(tmp, "begin past the data",
                   edited(lambda h: h[first].__setitem__(
                       "data_offsets", [len(data) + 10, len(data) + 10])), "outside the data")
    expect_refused(tmp, "begin > end",
                   edited(lambda h: h[first].__setitem__("data_offsets", [8, 4])),
                   "outside the data")
    expect_refused(tmp, "negative offset",
                   edited(lambda h: h[first].__setitem__("data_offsets", [-2, 0])),
                   "outside the data")
    expect_refused(tmp, "unknown dtype",
                   edited(lambda h: h[first].__setitem__("dtype", "BF17")), "unknown dtype")
    expect_refused(tmp, "size vs shape",
                   edited(lambda h: h[first].__setitem__("shape", [1, 2, 3])), "needs")
    expect_refused(tmp, "shape of strings",
                   edited(lambda h: h[first].__setitem__("shape", ["3"])), "shape")
    expect_refused(tmp, "overlap",
                   edited(lambda h: h[second].__setitem__(
                       "data_offsets", list(h[first]["data_offsets"])) or
                       h[second].__setitem__("shape", list(h[first]["shape"])) or
                       h[second].__setitem__("dtype", h[first]["dtype"])), "overlap")
    expect_refused(tmp, "hole", edited(lambda h: h.pop(first)), "hole")
    expect_refused(tmp, "trailing bytes", build(header, data + b"\0" * 8), "the file has")
    text = json.dumps(header).encode()
    dup = text[:-1] + b', "%s": %s}' % (first.encode(), json.dumps(header[first]).encode())
    expect_refused(tmp, "duplicate key", build(None, data, raw_header=dup), "duplicate key")
    expect_refused(tmp, "not JSON", build(None, data, raw_header=text[:-1]), "not JSON")
    expect_refused(tmp, "not UTF-8", build(None, data, raw_header=b'{"\xff": 1}'), "UTF-8")
    expect_refused(tmp, "not an object", build(None, data, raw_header=b"[1, 2]"),
                   "not a JSON object")
    expect_refused(tmp, "nested 100000 deep",
                   build(None, data, raw_header=b"[" * 100000 + b"]" * 100000), "not JSON")
    expect_refused(tmp, "metadata of numbers",
                   edited(lambda h: h.__setitem__("__metadata__", {"format": 1})),
                   "__metadata__")


def check_flips(tmp, rng):
    with open(BASE, "rb") as f:
        blob = bytearray(f.read())
    (n,) = struct.unpack_from("<Q", blob)
    path = os.path.join(tmp, "flip.safetensors")
    refused = opened = 0
    for _ in range(300):
        b = bytearray(blob)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(0, 8 + n)] = rng.randrange(256)
        with open(path, "wb") as f:
            f.write(b)
        try:
            with shardfs.open(path) as st:
                for name in st.names():
                    a = st[name].numpy()
                    if a.nbytes != st[name].nbytes:
                        raise AssertionError("%s: %d bytes read, %d want" % (
                            name, a.nbytes, st[name].nbytes))
            opened += 1
        except shardfs.SafetensorsError:
            refused += 1
        except Exception as e:
            check(False, "a flipped header raised %s: %s" % (type(e).__name__, e))
            traceback.print_exc()
    check(refused + opened == 300 and refused > 0,
          "300 flipped headers: %d refused, %d opened, nothing else" % (refused, opened))


def main():
    seed = int(os.environ.get("SF_TEST_SEED", random.randrange(1 << 30)))
    print("seed %d (SF_TEST_SEED replays it); shardfs from %s" % (seed, shardfs.__file__))
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="sfpy-") as tmp:
        for fn in (lambda: check_fixtures(rng), check_f8, lambda: check_hostile(tmp),
                   lambda: check_flips(tmp, rng)):
            try:
                fn()
            except Exception:
                traceback.print_exc()
                failures.append("exception: %s" % sys.exc_info()[1])
    if failures:
        print("\n%d check(s) FAILED, %d passed" % (len(failures), passed))
        return 1
    print("all %d checks passed" % passed)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
