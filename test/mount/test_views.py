#!/usr/bin/python3
"""Mount test (d), (e): the synthesized views.

npy/NAME.npy: numpy.load (plain and mmap_mode='r') gives the reference's
dtype, shape and bytes; tensors without a numpy-native dtype (BF16, F8) are
absent from npy/. model.safetensors: the header is parsed here by hand
(8-byte little-endian length, JSON with dtype/shape/data_offsets, names in
sorted order, offsets contiguous from 0 to the end of the file, data start
8-byte aligned) and every tensor's bytes match the reference; random preads
and an mmap of the file agree with one plain read."""

import json
import mmap
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def check_npy(ck, root, ref, label):
    want_listed = set()
    for name in sorted(ref.tensors):
        t = ref.tensors[name]
        descr = sm.DTYPES[t["dtype"]][1]
        p = sm.npy_path(root, name)
        if descr is None:
            ck.ok(not os.path.exists(p), "%s: npy/%s.npy absent (dtype %s)" % (
                label, name, t["dtype"]))
            continue
        want_listed.add(name + ".npy")
        want = ref.tensor_bytes(name)
        try:
            a = np.load(p)
        except (OSError, ValueError) as e:
            ck.ok(False, "%s: np.load npy/%s.npy: %s" % (label, name, e))
            continue
        ck.eq(a.dtype.str, np.dtype(descr).str, "%s: npy/%s.npy dtype" % (label, name))
        ck.eq(list(a.shape), t["shape"], "%s: npy/%s.npy shape" % (label, name))
        ck.bytes_eq(a.tobytes(), want, "%s: npy/%s.npy data" % (label, name))
        ck.eq(os.stat(p).st_size, len(sm.read_file(p)), "%s: npy/%s.npy st_size" % (label, name))
        if not want:
            continue   # numpy cannot memory-map a zero-byte payload portably
        try:
            am = np.load(p, mmap_mode="r")
            ck.ok(isinstance(am, np.memmap), "%s: npy/%s.npy mmap_mode gives a memmap" % (label, name))
            ck.eq(list(am.shape), t["shape"], "%s: npy/%s.npy (mmap) shape" % (label, name))
            ck.bytes_eq(np.ascontiguousarray(am).tobytes(), want,
                        "%s: npy/%s.npy (mmap) data" % (label, name))
            del am
        except (OSError, ValueError) as e:
            ck.ok(False, "%s: np.load(mmap_mode='r') npy/%s.npy: %s" % (label, name, e))
    listed = set()
    top = os.path.join(root, "npy")
    for dirpath, dirs, files in os.walk(top):
        for f in files:
            listed.add(os.path.relpath(os.path.join(dirpath, f), top))
    ck.eq(sorted(listed), sorted(want_listed), "%s: files listed under npy/" % label)


def check_safetensors(env, ck, root, ref, label):
    p = os.path.join(root, "model.safetensors")
    try:
        data = sm.read_file(p)
    except OSError as e:
        ck.ok(False, "%s: read model.safetensors: %s" % (label, e))
        return
    ck.eq(os.stat(p).st_size, len(data), "%s: model.safetensors st_size" % label)
    if not ck.ok(len(data) >= 8, "%s: model.safetensors has a header length" % label):
        return
    (hlen,) = struct.unpack("<Q", data[:8])
    if not ck.ok(hlen <= len(data) - 8, "%s: header length %d fits the file" % (label, hlen)):
        return
    ck.eq((8 + hlen) % 8, 0, "%s: data start 8-byte aligned" % label)
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        ck.ok(False, "%s: safetensors header is JSON: %s" % (label, e))
        return
    meta = header.pop("__metadata__", None)
    ck.ok(meta is None or (isinstance(meta, dict) and
                           all(isinstance(v, str) for v in meta.values())),
          "%s: __metadata__ is a str->str map" % label)
    ck.eq(sorted(header), sorted(ref.tensors), "%s: safetensors tensor names" % label)
    body = data[8 + hlen:]
    # offsets: contiguous in sorted name order, covering the whole body
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    order = [k for k, v in entries]
    ck.eq(order, sorted(header, key=lambda s: s.encode()),
          "%s: data in sorted name order" % label)
    pos = 0
    for name, e in sorted(header.items(), key=lambda kv: kv[0].encode()):
        b, end = e["data_offsets"]
        ck.eq(b, pos, "%s: %s data_offsets start contiguous" % (label, name))
        pos = end
        if name not in ref.tensors:
            continue
        t = ref.tensors[name]
        ck.eq(e["dtype"], t["dtype"], "%s: safetensors dtype of %s" % (label, name))
        ck.eq(e["shape"], t["shape"], "%s: safetensors shape of %s" % (label, name))
        ck.bytes_eq(body[b:end], ref.tensor_bytes(name), "%s: safetensors bytes of %s" % (label, name))
    ck.eq(pos, len(body), "%s: last data_offsets end at the end of file" % label)
    # random preads and mmap agree with the plain read
    rng = env.rng
    for _ in range(40):
        off = rng.randrange(0, len(data) + 100)
        ln = rng.choice([1, 8, 4095, 4096, 70000, len(data)])
        try:
            got = sm.pread_all(p, off, ln)
        except OSError as e:
            ck.ok(False, "%s: pread model.safetensors (%d, %d): %s" % (label, off, ln, e))
            continue
        ck.bytes_eq(got, data[off:off + ln], "%s: pread model.safetensors off %d len %d" % (label, off, ln))
    with open(p, "rb") as f:
        with mmap.mmap(f.fileno(), len(data), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mm:
            ck.bytes_eq(mm[:], data, "%s: mmap of model.safetensors" % label)


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "mixed": env.gen(os.path.join(store, "mixed"), layout="mixed", ranks=3,
                         size="3M", seed=41, block_size="64K"),
        "llama-bf16": env.gen(os.path.join(store, "llama-bf16"), layout="llama", ranks=2,
                              size="3M", dtype="BF16", seed=42, block_size="64K"),
        "fsdp-f16": env.gen(os.path.join(store, "fsdp-f16"), layout="fsdp", ranks=4,
                            size="2M", dtype="F16", seed=43, block_size="64K"),
        "repl-f32": env.gen(os.path.join(store, "repl-f32"), layout="replicated", ranks=3,
                            size="1M", dtype="F32", seed=44, block_size="64K"),
    }
    with sm.Mount(env, store, name="views") as m:
        for cname, ref in sorted(refs.items()):
            root = os.path.join(m.mnt, cname)
            check_npy(ck, root, ref, cname)
            check_safetensors(env, ck, root, ref, cname)
        ck.ok(m.alive(), "daemon alive after the view tests")


if __name__ == "__main__":
    sys.exit(sm.main(run))
