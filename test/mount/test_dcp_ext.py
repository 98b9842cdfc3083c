"""test_dcp_ext - torch 2.x DCP's optional layouts (issue 11, SPEC 7):
per-rank metadata (use_collectives=False) and zstd-compressed chunks.

The store holds the committed checkpoints torch 2.15 wrote in these
layouts (test/fixtures/dcp/torch-2.15-ext: perrank4, zstd, perrank2_zstd)
and hostile variants made from them by changing bytes of the real files:

- perrank4 without rank 2's __2.metadata: still being written, not shown,
  and the skip is logged;
- perrank4 without rank 3's metadata and chunk file: nothing says a rank 3
  ever existed, so the merged tensors have a gap and the checkpoint is
  left out with one log line;
- perrank4 whose rank 1 says float16 where rank 0 says float32: the ranks
  disagree, the checkpoint is left out with one log line naming the key;
- zstd with one chunk's block header made invalid: the tensor is listed,
  its reads (and model.safetensors' bytes of it) fail with EIO, one line
  at open and one per failed read say why, every other tensor and object
  is served byte for byte;
- zstd whose transform descriptors of one tensor and one object name an
  unknown extension: the tensor is listed and its reads fail with EIO,
  the object is left out, one log line each names the transform, the
  rest is served byte for byte.

Checked through one mount: the good checkpoints against their
expected.json (check_dcp_tree.py, torch.load of the objects), the merged
manifest (a replicated tensor served from rank 0's file, each rank's
chunk from its own), codec fields in manifest.json, reads after the
decoded cache is cold (a second mount with a small cache), and the store
byte-for-byte unchanged.
"""

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys

import xxhash

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
EXT = os.path.join(TOP, "test", "fixtures", "dcp", "torch-2.15-ext")
PY = "/usr/bin/python3"
GOOD = ("perrank4", "zstd", "perrank2_zstd")


def run(argv, timeout=300):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def expected(name):
    with open(os.path.join(EXT, name + ".expected.json")) as f:
        return json.load(f)


def patch(path, old, new, count=1):
    """Replace the first `count` occurrences of old by new (same length)."""
    assert len(old) == len(new)
    with open(path, "rb") as f:
        b = f.read()
    assert b.count(old) >= count, (path, old)
    b = b.replace(old, new, count)
    with open(path, "wb") as f:
        f.write(b)


def zstd_block_header(buf):
    """Offset of the first block header of the zstd frame at buf[0]."""
    assert buf[:4] == b"\x28\xb5\x2f\xfd", buf[:4]
    fhd = buf[4]
    single = (fhd >> 5) & 1
    did = {0: 0, 1: 1, 2: 2, 3: 4}[fhd & 3]
    fcs = {0: 1 if single else 0, 1: 2, 2: 4, 3: 8}[fhd >> 6]
    return 4 + 1 + (0 if single else 1) + did + fcs


class _Stub:
    """Stands for any class a committed fixture's .metadata names: the
    pickle is read for its fields only, nothing is imported."""
    def __init__(self, *args, **kw):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return type(name, (_Stub,), {})


def fixture_metadata(name):
    with open(os.path.join(EXT, name, ".metadata"), "rb") as f:
        return _StubUnpickler(f).load()


def storage_of(name, key):
    """(relative_path, offset, length) of key in fixture name's .metadata."""
    for idx, info in fixture_metadata(name).storage_data.items():
        if idx.fqn == key:
            return info.relative_path, info.offset, info.length
    raise KeyError(key)


def patch_items(path, name, old, new, keys):
    """Replace old by new (same length) in the transform descriptors of the
    storage_data entries of keys: torch pickles one descriptor string per
    entry, in storage_data's order."""
    order = [idx.fqn for idx in fixture_metadata(name).storage_data]
    with open(path, "rb") as f:
        b = f.read()
    pos, at = [], 0
    while True:
        at = b.find(old, at)
        if at < 0:
            break
        pos.append(at)
        at += len(old)
    assert len(pos) == len(order), (len(pos), order)
    for k in keys:
        i = pos[order.index(k)]
        b = b[:i] + new + b[i + len(new):]
    with open(path, "wb") as f:
        f.write(b)


def make_hostile(store):
    """The hostile copies; returns {name: what the test expects}."""
    # perrank4 without rank 2's metadata: being written
    d = os.path.join(store, "h-rank-missing")
    shutil.copytree(os.path.join(EXT, "perrank4"), d)
    os.unlink(os.path.join(d, "__2.metadata"))
    # perrank4 without any trace of rank 3: a gap
    d = os.path.join(store, "h-last-rank-gone")
    shutil.copytree(os.path.join(EXT, "perrank4"), d)
    os.unlink(os.path.join(d, "__3.metadata"))
    os.unlink(os.path.join(d, "__3_0.distcp"))
    # rank 1 says float16 for what rank 0 says is float32
    d = os.path.join(store, "h-dtype-disagree")
    shutil.copytree(os.path.join(EXT, "perrank4"), d)
    patch(os.path.join(d, "__1.metadata"), b"float32", b"float16")
    # one zstd chunk with a reserved block type: corrupt
    d = os.path.join(store, "h-zstd-corrupt")
    shutil.copytree(os.path.join(EXT, "zstd"), d)
    rel, off, length = storage_of("zstd", "f32")
    with open(os.path.join(d, rel), "r+b") as f:
        f.seek(off)
        frame = f.read(length)
        hdr = zstd_block_header(frame)
        f.seek(off + hdr)
        f.write(bytes([frame[hdr] | 0x06]))  # block type 3: reserved
    # a transform nobody knows
    d = os.path.join(store, "h-zstd-unknown")
    shutil.copytree(os.path.join(EXT, "zstd"), d)
    patch_items(os.path.join(d, ".metadata"), "zstd", b"stream.zstd/1",
                b"stream.lzma/1", ("step", "f16"))


def xxh(b):
    return "%016x" % xxhash.xxh3_64_intdigest(b)


def check_good(ck, mnt, name):
    root = os.path.join(mnt, name)
    exp_path = os.path.join(EXT, name + ".expected.json")
    rc, out, err = run([PY, os.path.join(INTEROP, "check_dcp_tree.py"), root,
                        exp_path, "--torch-load"])
    ck.eq(rc, 0, "%s: check_dcp_tree: %s%s" % (name, out[-3000:], err[-2000:]))
    fmt = os.getxattr(root, "user.shardfs.format").decode()
    ck.eq(fmt, "torch-dcp 1.0.0", "%s: format xattr" % name)
    ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
          "%s: verified xattr" % name)
    ck.ok(not any(n.endswith(".metadata") or n.endswith(".distcp")
                  for n in os.listdir(root)),
          "%s: DCP's own files (per-rank metadata too) are not root files: %s"
          % (name, os.listdir(root)))
    man = sm.manifest_of(root)
    exp = expected(name)
    ck.eq(sorted(man["tensors"]), sorted(exp["tensors"]),
          "%s: manifest lists every tensor" % name)
    zstd = "transforms" in exp
    for n, t in list(man["tensors"].items()) + list(man.get("objects", {}).items()):
        for s in t["shards"]:
            ck.eq(s.get("codec"), "zstd" if zstd else None,
                  "%s: %s shard codec" % (name, n))
            if zstd:
                ck.ok(s.get("stored_nbytes", 0) > 0 and "decoded_offset" in s,
                      "%s: %s shard says where its stream is: %r" % (name, n, s))
    if name.startswith("perrank"):
        world = exp["ranks"]
        rows = man["tensors"]["rows"]["shards"]
        ck.eq(sorted(s["file"] for s in rows),
              ["__%d_0.distcp" % r for r in range(world)],
              "%s: rows has one chunk from each rank's file" % name)
        rep = man["tensors"]["replicated"]["shards"]
        ck.eq([s["file"] for s in rep], ["__0_0.distcp"],
              "%s: the replicated tensor every rank wrote is served once, "
              "from rank 0's file" % name)


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    for n in GOOD:
        shutil.copytree(os.path.join(EXT, n), os.path.join(store, n))
    make_hostile(store)
    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for n in GOOD:
            if ck.ok(n in listed, "%s is mounted" % n):
                check_good(ck, mnt, n)
        # reading model.safetensors whole works on the zstd ones
        for n in ("zstd", "perrank2_zstd"):
            if n in listed:
                st = sm.read_file(os.path.join(mnt, n, "model.safetensors"))
                header, start = sm.parse_safetensors(st)
                for k, e in expected(n)["tensors"].items():
                    a, b = header[k]["data_offsets"]
                    ck.eq(xxh(st[start + a:start + b]), e["xxh3"],
                          "%s: model.safetensors bytes of %s" % (n, k))
        log_lines = m.log_text().splitlines()

        def lines(*words):
            return [l for l in log_lines if all(w in l for w in words)]

        # a rank's metadata missing: being written
        ck.ok("h-rank-missing" not in listed, "h-rank-missing is not shown")
        ck.eq(len(lines("h-rank-missing", "still being written")), 1,
              "one log line says h-rank-missing is still being written")
        # the last rank gone without a trace: the merged tensor has a gap
        ck.ok("h-last-rank-gone" not in listed, "h-last-rank-gone is left out")
        ck.eq(len(lines("h-last-rank-gone", "left out")), 1,
              "one log line says h-last-rank-gone was left out: %s"
              % lines("h-last-rank-gone"))
        ck.ok(any("rows" in l for l in lines("h-last-rank-gone", "left out")),
              "the log names the tensor with the gap")
        # dtypes that disagree
        ck.ok("h-dtype-disagree" not in listed, "h-dtype-disagree is left out")
        bad = lines("h-dtype-disagree", "left out")
        ck.eq(len(bad), 1, "one log line says h-dtype-disagree was left out")
        ck.ok(any("disagree" in l and "ranks 0 and 1" in l for l in bad),
              "the log says ranks 0 and 1 disagree: %s" % bad)
        # a corrupt zstd chunk: EIO for that tensor only
        root = os.path.join(mnt, "h-zstd-corrupt")
        exp = expected("zstd")
        if ck.ok(os.path.isdir(root), "h-zstd-corrupt is mounted"):
            ck.ok(os.path.exists(sm.tensor_path(root, "f32")),
                  "h-zstd-corrupt: f32 is listed")
            ck.eq(os.stat(sm.tensor_path(root, "f32")).st_size,
                  exp["tensors"]["f32"]["nbytes"], "h-zstd-corrupt: f32 size")
            ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, "f32")),
                      "h-zstd-corrupt: reading f32")
            ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, "f32", "0:2,0:5")),
                      "h-zstd-corrupt: reading a slice of f32")
            for k, e in exp["tensors"].items():
                if k != "f32":
                    ck.eq(xxh(sm.read_file(sm.tensor_path(root, k))), e["xxh3"],
                          "h-zstd-corrupt: %s still served" % k)
            for k in exp["objects"]:
                ck.ok(len(sm.read_file(os.path.join(root, "objects", k))) > 0,
                      "h-zstd-corrupt: object %s still served" % k)
            log_lines = m.log_text().splitlines()
            ck.eq(len(lines("h-zstd-corrupt", "f32", "does not decode", "EIO")), 1,
                  "one log line at open says f32's chunk does not decode")
            ck.ok(len(lines("h-zstd-corrupt", 'tensor "f32": shard 0', "block 0",
                            "Input/output error")) >= 1,
                  "h-zstd-corrupt: the failed reads are logged")
        # an unknown transform on one tensor and one object: that tensor's
        # reads fail, the object is left out, the log names the transform
        root = os.path.join(mnt, "h-zstd-unknown")
        if ck.ok(os.path.isdir(root), "h-zstd-unknown is mounted"):
            ck.ok(os.path.exists(sm.tensor_path(root, "f16")),
                  "h-zstd-unknown: f16 is listed")
            ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, "f16")),
                      "h-zstd-unknown: reading f16")
            for k, e in exp["tensors"].items():
                if k != "f16":
                    ck.eq(xxh(sm.read_file(sm.tensor_path(root, k))), e["xxh3"],
                          "h-zstd-unknown: %s still served" % k)
            ck.eq(sorted(os.listdir(os.path.join(root, "objects"))),
                  sorted(k for k in exp["objects"] if k != "step"),
                  "h-zstd-unknown: object step is left out, the others shown")
            log_lines = m.log_text().splitlines()
            ck.eq(len(lines("h-zstd-unknown", "f16", '"stream.lzma/1"', "EIO")), 1,
                  "h-zstd-unknown: one log line names f16's transform")
            ck.eq(len(lines("h-zstd-unknown", '"step" left out', '"stream.lzma/1"')), 1,
                  "h-zstd-unknown: one log line says step is left out and why")
    # a second mount with a tiny cache: every zstd block decoded again
    with sm.Mount(env, store, ["--cache-mb", "1"]) as m:
        for n in ("zstd", "perrank2_zstd"):
            root = os.path.join(m.mnt, n)
            for k, e in expected(n)["tensors"].items():
                ck.eq(xxh(sm.read_file(sm.tensor_path(root, k))), e["xxh3"],
                      "%s (second mount): %s" % (n, k))
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")


if __name__ == "__main__":
    sys.exit(sm.main(test))
