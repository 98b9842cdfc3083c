"""test_dtensor - per-rank torch.save pickles of DTensor state dicts (verl's
model_world_size_W_rank_R.pt, FSDP2 + tensor parallel) mounted whole
(issue 27 (2), SPEC 7).

The store holds the checkpoints torch 2.15 wrote
(test/fixtures/dtensor/torch-*, made by
test/interop/make_dtensor_fixtures.py; committed): a 1-D mesh of 2 ranks
(Shard(0) uneven and with an empty chunk, Shard(1) bf16, Replicate, plain
tensors, non-tensor values) and a 2x2 mesh (FSDP2 over a tensor-parallel
MLP: _StridedShard(0, sf=2) + Shard(0) uneven; Shard/Shard, Replicate/
Shard, distribute_tensor's _StridedShard), and FSDP1's SHARDED_STATE_DICT
and LOCAL_STATE_DICT (ShardedTensors) of a two-layer MLP. Checked through one mount:
every tensor byte for byte against the writer's full_tensor() reference
(NAME.safetensors) through tensors/, model.safetensors and npy/, the
format xattr, the plain tensor that differs per rank left out with a line.

Hostile variants, made at test time from the real files: a pickle naming
another global (posix.system): the checkpoint is left out with a line
naming it; rank 1's mesh coordinate changed to rank 0's (left out: the
coordinate is not its rank's place); rank 1's _rank changed (left out);
rank 3 of the 2x2 mesh claiming coordinate (0, 0) with a rank map that
agrees (the evenly split tensors leave a gap: left out; uneven ones, whose
local shapes then disagree, left out; the others served); a global shape
that lies (7 rows claimed as 9 on every rank: left out) and a wrapper
size that disagrees with tensor_meta (left out); Replicate changed to
Partial (left out); in the FSDP1 one, rank 1's shards placed on rank 0
(left out) and rank 1's 0.weight shard moved up a row (overlap and gap:
that tensor left out). Nothing wrong is served: every tensor still shown
equals the reference. The store is byte-for-byte unchanged at the end.
On copies, shardctl index + verify: every replica equals the copy served.
"""

import glob
import json
import os
import pickletools
import shutil
import struct
import sys
import zipfile

import numpy as np

import sfmount as sm
from test_dcp import check_readonly, check_views

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "dtensor")


def st_read(path):
    """{name: (header entry, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack_from("<Q", b, 0)
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v, b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def pkl_span(path):
    """(offset of data.pkl's bytes in the file, its bytes): the entry is
    stored, so the bytes lie in the file as they are (found through the
    local header: a patched entry's CRC no longer matches)."""
    with zipfile.ZipFile(path) as z:
        info = [i for i in z.infolist() if i.filename.endswith("/data.pkl")][0]
    assert info.compress_type == zipfile.ZIP_STORED
    with open(path, "rb") as f:
        b = f.read()
    h = info.header_offset
    n, e = struct.unpack_from("<HH", b, h + 26)
    off = h + 30 + n + e
    return off, b[off:off + info.file_size]


def patch_ints_after(path, key, new, first_only=False):
    """Every int tuple that follows key (a str, or a BINGET of its memo)
    in the pickle (or the first one) gets the ints new (same count, one
    byte each: BININT1), in place."""
    off, data = pkl_span(path)
    ops = list(pickletools.genops(data))
    memo, hits = {}, 0
    b = bytearray(open(path, "rb").read())
    for i, (op, arg, pos) in enumerate(ops):
        if op.name == "BINPUT" and i and ops[i - 1][0].name == "BINUNICODE":
            memo[arg] = ops[i - 1][1]
        is_key = ((op.name == "BINUNICODE" and arg == key) or
                  (op.name == "BINGET" and memo.get(arg) == key))
        if not is_key:
            continue
        j, ints = i + 1, []
        while j < len(ops) and ops[j][0].name in ("BINPUT", "MARK", "BININT1", "EMPTY_LIST"):
            if ops[j][0].name == "BININT1":
                ints.append(ops[j][2])
            j += 1
        assert len(ints) == len(new), (key, len(ints))
        for p, v in zip(ints, new):
            b[off + p + 1] = v
        hits += 1
        if first_only:
            break
    assert hits, key
    with open(path, "wb") as f:
        f.write(b)


def replace_bytes(path, old, new, count=-1):
    """old -> new (same length) in the file's data.pkl, in place."""
    assert len(old) == len(new)
    off, data = pkl_span(path)
    assert old in data
    data = data.replace(old, new, count)
    b = bytearray(open(path, "rb").read())
    b[off:off + len(data)] = data
    with open(path, "wb") as f:
        f.write(b)


def rank_file(d, r):
    return glob.glob(os.path.join(d, "model_world_size_*_rank_%d.pt" % r))[0]


def make_hostile(store, w2, w4, fs):
    out = {}

    def copy(name, src):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        out[name] = d
        return d

    d = copy("h-global", w2)
    sm.rewrite_pickle(rank_file(d, 1), b"ctorch\nSize\n", b"cposix\nsystem\n")
    d = copy("h-coord", w2)
    patch_ints_after(rank_file(d, 1), "_coordinate_on_dim", [0])
    d = copy("h-rank", w2)
    patch_ints_after(rank_file(d, 1), "_rank", [0])
    d = copy("h-gap", w4)
    patch_ints_after(rank_file(d, 3), "_coordinate_on_dim", [0, 0])
    patch_ints_after(rank_file(d, 3), "_flatten_rank_map", [3, 1, 2, 0])
    d = copy("h-shape", w2)
    for r in (0, 1):  # rows7: 7 rows claimed as 9 everywhere
        replace_bytes(rank_file(d, r), b"K\x07K\x03\x86", b"K\x09K\x03\x86")
    d = copy("h-size", w2)  # rank 1: the wrapper's size of rows7 only
    replace_bytes(rank_file(d, 1), b"K\x07K\x03\x86", b"K\x08K\x03\x86", 1)
    d = copy("h-partial", w2)
    for r in (0, 1):
        sm.rewrite_pickle(rank_file(d, r), b"placement_types\nReplicate\n",
                       b"placement_types\nPartial\n")
    if fs:  # FSDP1 ShardedTensors
        d = copy("h-st-rank", fs)  # rank 1's shards placed on rank 0
        patch_ints_after(rank_file(d, 1), "_rank", [0])
        d = copy("h-st-overlap", fs)  # rank 1's 0.weight from row 3, not 4
        patch_ints_after(rank_file(d, 1), "shard_offsets", [3, 0], first_only=True)
    return out


def check_case(env, ck, root, name, ref, left_out=(), fmt="torch-dtensor"):
    """Every reference tensor but left_out through tensors/, npy/ and
    model.safetensors; left_out ones absent; nothing else shown."""
    ck.eq(os.getxattr(root, "user.shardfs.format").decode(), fmt,
          "%s: format xattr" % name)
    ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
          "%s: verified xattr" % name)
    buf = sm.read_file(os.path.join(root, "model.safetensors"))
    hdr, base = sm.parse_safetensors(buf)
    want = {k: v for k, v in ref.items() if k not in left_out}
    ck.eq(sorted(hdr), sorted(want), "%s: the tensors shown" % name)
    for k, (h, data) in sorted(want.items()):
        p = sm.tensor_path(root, k)
        ck.eq(sm.read_file(p) if os.path.exists(p) else None, data,
              "%s: tensors/%s is full_tensor()'s" % (name, k))
        ck.eq((os.getxattr(p, "user.shardfs.dtype").decode(),
               json.loads(os.getxattr(p, "user.shardfs.shape")))
              if os.path.exists(p) else None, (h["dtype"], h["shape"]),
              "%s: %s dtype and shape" % (name, k))
        e = hdr.get(k)
        ck.eq(buf[base + e["data_offsets"][0]:base + e["data_offsets"][1]]
              if e else None, data, "%s: model.safetensors %s" % (name, k))
        npy = sm.npy_path(root, k)
        if sm.DTYPES[h["dtype"]][1] is not None:  # numpy has no bf16
            ck.eq(np.ascontiguousarray(np.load(npy)).tobytes()
                  if os.path.exists(npy) else None, data,
                  "%s: npy/%s.npy" % (name, k))
    for k in left_out:
        ck.ok(not os.path.exists(sm.tensor_path(root, k)),
              "%s: %s left out" % (name, k))


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases = []
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "torch-*"))):
        for meta in sorted(glob.glob(os.path.join(vdir, "*.json"))):
            src = meta[:-len(".json")]
            with open(meta) as f:
                info = json.load(f)
            name = "%s-%s" % (os.path.basename(vdir), os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name))
            cases.append((name, src, info))
    ck.ok(len(cases) >= 2, "dtensor fixtures found in %s" % FIXTURES)
    w2 = [c[1] for c in cases if c[1].endswith("/w2")]
    w4 = [c[1] for c in cases if c[1].endswith("/w4")]
    first = cases[0][0]
    with open(os.path.join(store, first, "config.json"), "w") as f:
        f.write('{"hidden_size": 7}\n')
    fs = [c[1] for c in cases if c[1].endswith("/fsdp1-sharded")]
    hostile = make_hostile(store, w2[-1], w4[-1], fs[-1] if fs else None) \
        if w2 and w4 else {}
    reffs = st_read(fs[-1] + ".safetensors") if fs else {}
    ref2 = st_read(w2[-1] + ".safetensors") if w2 else {}
    ref4 = st_read(w4[-1] + ".safetensors") if w4 else {}

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, src, info in cases:
            root = os.path.join(mnt, name)
            if ck.ok(name in listed, "%s is mounted" % name):
                check_case(env, ck, root, name, st_read(src + ".safetensors"),
                           info["differs"])
                check_views(env, ck, root, name)
        log = m.log_text()
        for name, src, info in cases:
            for k in info["differs"]:
                ck.ok('"%s": "%s" left out: a plain tensor that differs between ranks'
                      % (name, k) in log, "%s: the log says %s differs" % (name, k))
        ck.ok("2 non-tensor entries" in log, "w2: one line counts the non-tensor entries")
        ck.eq(sm.read_file(os.path.join(mnt, first, "config.json")),
              b'{"hidden_size": 7}\n', "a root file beside the rank files")
        check_readonly(env, ck, mnt, first)
        if not hostile:
            return
        # the checkpoint left out, one line each
        ck.ok("h-global" not in listed, "a pickle naming posix.system: left out")
        ck.ok("posix.system" in log and "not allowed" in log,
              "the log names the refused global")
        ck.ok("h-coord" not in listed, "a coordinate not its rank's: left out")
        ck.ok("model_world_size_2_rank_1.pt: its mesh coordinate is not rank 1's place in the mesh"
              in log, "h-coord: the log says why")
        ck.ok("h-rank" not in listed, "a mesh naming another rank than the file: left out")
        ck.ok("model_world_size_2_rank_1.pt: its mesh says rank 0" in log,
              "h-rank: the log says why")
        # single tensors left out, the others served right
        gap_out = ["strided", "mlp.2.weight", "mlp.0.weight", "mlp.0.bias",
                   "ss.bf16", "rep_s0"]
        if ck.ok("h-gap" in listed, "h-gap: shown"):
            check_case(env, ck, os.path.join(mnt, "h-gap"), "h-gap", ref4, gap_out)
            ck.ok('"h-gap": "strided" left out' in log and "not covered" in log,
                  "h-gap: the gap is logged")
            ck.ok('"h-gap": "mlp.0.weight" left out: rank 3: its local tensor has'
                  in log, "h-gap: a local shape that disagrees is logged")
        if ck.ok("h-shape" in listed, "h-shape: shown"):
            check_case(env, ck, os.path.join(mnt, "h-shape"), "h-shape", ref2,
                       ["rows7", "plain.rank"])
            ck.ok('"h-shape": "rows7" left out: rank 0: its local tensor has 4 elements along dimension 0, its placements give 5'
                  in log, "h-shape: the log says why")
        if ck.ok("h-size" in listed, "h-size: shown"):
            check_case(env, ck, os.path.join(mnt, "h-size"), "h-size", ref2,
                       ["rows7", "plain.rank"])
            ck.ok('"h-size": "rows7" left out: its size and its tensor_meta\'s shape differ'
                  in log, "h-size: the log says why")
        if ck.ok("h-partial" in listed, "h-partial: shown"):
            check_case(env, ck, os.path.join(mnt, "h-partial"), "h-partial", ref2,
                       ["rep", "plain.rank"])
            ck.ok('"h-partial": "rep" left out: a Partial placement' in log,
                  "h-partial: the log says why")
        if fs:
            ck.ok("h-st-rank" not in listed, "a local shard placed on another rank: left out")
            ck.ok('model_world_size_2_rank_1.pt: "0.weight": a local shard placed on rank 0'
                  in log, "h-st-rank: the log says why")
            if ck.ok("h-st-overlap" in listed, "h-st-overlap: shown"):
                check_case(env, ck, os.path.join(mnt, "h-st-overlap"), "h-st-overlap",
                           reffs, ["0.weight"])
                ck.ok('"h-st-overlap": "0.weight" left out' in log,
                      "h-st-overlap: the log says so")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")

    # shardctl index + verify: every replica (Replicate, and a box two
    # ranks hold) equals the copy served; an empty chunk is no replica
    vstore = env.path("vstore")
    os.makedirs(vstore)
    for name, src, info in cases:
        d = os.path.join(vstore, name)
        shutil.copytree(src, d)
        rc, outv = sm.index_then_verify(env, ck, d, name)
        ck.eq(rc, 0, "%s: verify passes: %s" % (name, outv))
        ck.ok("REPLICA DIFFERS" not in outv, "%s: no replica differs: %s" % (name, outv))
        if not name.startswith("torch-2.15-fsdp1"):  # Replicate: replicas
            ck.ok("replicas equal" in outv and " 0 replicas" not in outv,
                  "%s: verify compared its replicas: %s" % (name, outv))


if __name__ == "__main__":
    sys.exit(sm.main(test))
