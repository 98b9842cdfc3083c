#!/usr/bin/python3
"""Mount test: shardctl info --json, info PATH TENSOR, info --ranks, diff,
and the progress lines of the long commands (issue 14, item 7).

Every expected value comes from somewhere else than shardctl: the
manifest.json shardctl gen wrote (parsed here), the unsharded references
of `gen --ref`, the expected.json torch's fixtures carry, and bytes
flipped here in copies. Checkpoints are read on disk and through a mount,
shardfs/1 and PyTorch DCP alike; the DCP checkpoint is also copied through
the mount into a shardfs/1 one (tools/shardfs_save.py), and the two diff
as equal tensor for tensor; a zstd-coded DCP chunk is described alike on
disk and in a mount. Progress lines are looked for on a
pseudo-terminal and must be absent when stderr is a pipe.
"""

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time

import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DCP = os.path.join(HERE, "..", "fixtures", "dcp", "torch-2.15")
DCP_EXT = os.path.join(HERE, "..", "fixtures", "dcp", "torch-2.15-ext")

# The documented keys of each document (README, "shardctl info --json"),
# in their order: a key added, removed or renamed must change the README too.
CKPT_KEYS = ["schema_version", "kind", "path", "dir", "in_mount", "checkpoint",
             "format", "world_size", "block_size"]
KEYS = {
    "checkpoint": CKPT_KEYS + ["verified", "tensors", "files", "objects", "totals"],
    "tensor": CKPT_KEYS + ["entry", "name", "dtype", "shape", "nbytes",
                           "checksummed", "shards"],
    "ranks": CKPT_KEYS + ["ranks", "totals"],
    "store": ["schema_version", "kind", "path", "in_mount", "checkpoints", "totals"],
}
SHARD_KEYS = ["index", "rank", "box", "flat", "strides", "file", "file_offset",
              "nbytes", "codec", "stored_nbytes", "checksummed", "blocks"]
DIFF_LINE = re.compile(r"^([-+~!]) (tensor|file|object) (\S+)(?:: | \()(.*)$")


def nbytes_of(dtype, shape):
    n = sm.DTYPES[dtype][0]
    for d in shape:
        n *= d
    return n


def info_json(env, *args):
    r = env.shardctl_run("info", "--json", *args)
    return json.loads(r.stdout.decode())


def run_diff(env, *args):
    """(exit status, {name: (sign, kind, rest)}, stdout text, stderr text)"""
    r = env.shardctl_run("diff", *args, check=False)
    out = r.stdout.decode(errors="replace")
    lines = {}
    for ln in out.splitlines():
        m = DIFF_LINE.match(ln)
        if m:
            lines[m.group(3)] = (m.group(1), m.group(2), m.group(4))
        else:
            lines["?" + ln] = ("?", "?", ln)
    return r.returncode, lines, out, r.stderr.decode(errors="replace")


def run_stat(env, *args):
    r = env.shardctl_run("diff", "--stat", *args, check=False)
    stat = {}
    for ln in r.stdout.decode().splitlines():
        k, _, v = ln.partition(": ")
        stat[k] = v
    return r.returncode, stat


def first_int(s):
    m = re.match(r"\s*(\d+)", s or "")
    return int(m.group(1)) if m else None


def flip_byte(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x5A]))


def copy_ckpt(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def pick(man, want):
    """The first tensor (sorted by name) for which want(name, t) holds."""
    for name in sorted(man["tensors"]):
        if want(name, man["tensors"][name]):
            return name
    raise RuntimeError("no tensor fits")


def flat_sharded(name, t):
    """Two or more flat shards, disjoint, of a 2-d tensor."""
    sh = t["shards"]
    return (len(sh) >= 2 and len(t["shape"]) == 2 and all("flat" in s for s in sh)
            and sum(s["nbytes"] for s in sh) == nbytes_of(t["dtype"], t["shape"])
            and sh[1]["nbytes"] > 8)


# ---------------------------------------------------------------- info

def check_info_ckpt(env, ck, a, label):
    man = sm.manifest_of(a)
    doc = info_json(env, a)
    ck.eq(list(doc), KEYS["checkpoint"], "%s: checkpoint document keys" % label)
    ck.eq((doc["schema_version"], doc["kind"], doc["checkpoint"], doc["format"],
           doc["world_size"], doc["block_size"], doc["verified"], doc["in_mount"]),
          (1, "checkpoint", man["name"], "shardfs/1", man["world_size"],
           man["block_size"], True, False), "%s: checkpoint keys" % label)
    want = [(n, t["dtype"], t["shape"], nbytes_of(t["dtype"], t["shape"]),
             len(t["shards"]), True) for n, t in sorted(man["tensors"].items())]
    got = [(t["name"], t["dtype"], t["shape"], t["nbytes"], t["shards"],
            t["checksummed"]) for t in doc["tensors"]]
    ck.eq(got, want, "%s: every tensor's name, dtype, shape, bytes, shard count" % label)
    wantf = [(n, t["shape"][0], len(t["shards"]))
             for n, t in sorted(man.get("files", {}).items())]
    ck.eq([(f["name"], f["nbytes"], f["shards"]) for f in doc["files"]], wantf,
          "%s: root files" % label)
    ck.eq(doc["objects"], [], "%s: no objects" % label)
    shards = [s for sec in ("tensors", "files") for t in man.get(sec, {}).values()
              for s in t["shards"]]
    ck.eq(doc["totals"], {
        "tensors": len(man["tensors"]), "files": len(man.get("files", {})),
        "objects": 0, "shards": len(shards),
        "tensor_bytes": sum(w[3] for w in want),
        "file_bytes": sum(f[1] for f in wantf), "object_bytes": 0,
        "payload_bytes": sum(s["nbytes"] for s in shards)}, "%s: totals" % label)
    return doc


def check_info_tensor(env, ck, a, name, label):
    man = sm.manifest_of(a)
    t = man["tensors"][name]
    doc = info_json(env, a, name)
    ck.eq(list(doc), KEYS["tensor"], "%s: tensor document keys" % label)
    ck.eq((doc["kind"], doc["entry"], doc["name"], doc["dtype"], doc["shape"],
           doc["nbytes"], doc["checksummed"]),
          ("tensor", "tensor", name, t["dtype"], t["shape"],
           nbytes_of(t["dtype"], t["shape"]), True), "%s: %s" % (label, name))
    got = []
    for s in doc["shards"]:
        ck.eq(list(s), SHARD_KEYS, "%s: shard keys" % label)
        got.append((s["index"], s["rank"],
                    s["box"] and (s["box"]["offsets"], s["box"]["lengths"]),
                    s["flat"] and [s["flat"]["offset"], s["flat"]["length"]],
                    s["file"], s["file_offset"], s["nbytes"], s["codec"],
                    s["checksummed"], s["blocks"]))
    want = [(i, s["rank"],
             ("offsets" in s) and (s["offsets"], s["lengths"]) or None,
             s.get("flat"), s["file"], s["file_offset"], s["nbytes"], "none", True,
             len(s["xxh3"])) for i, s in enumerate(t["shards"])]
    ck.eq(got, want, "%s: %s: every shard as the manifest has it" % (label, name))
    text = env.shardctl_run("info", a, name).stdout.decode().splitlines()
    rows = [ln for ln in text[3:] if ln.strip()]
    ck.eq(len(rows), len(t["shards"]), "%s: text: one row per shard" % label)
    for ln, s in zip(rows, t["shards"]):
        region = ("flat %d+%d" % tuple(s["flat"]) if "flat" in s else
                  ",".join("%d:%d" % (o, o + n) for o, n in zip(s["offsets"], s["lengths"])))
        ck.ok(s["file"] in ln and region in ln and ln.rstrip().endswith("yes"),
              "%s: text row names %s and %s: %r" % (label, region, s["file"], ln))


def check_info_ranks(env, ck, a, label):
    man = sm.manifest_of(a)
    doc = info_json(env, "--ranks", a)
    ck.eq(list(doc), KEYS["ranks"], "%s: ranks document keys" % label)
    per = {r: [0, 0] for r in range(man["world_size"])}
    for sec in ("tensors", "files"):
        for t in man.get(sec, {}).values():
            for s in t["shards"]:
                per[s["rank"]][0] += 1
                per[s["rank"]][1] += s["nbytes"]
    ck.eq([(r["rank"], r["shards"], r["bytes"]) for r in doc["ranks"]],
          [(r, v[0], v[1]) for r, v in sorted(per.items())],
          "%s: shards and bytes per rank" % label)
    ck.eq(doc["totals"], {"shards": sum(v[0] for v in per.values()),
                          "bytes": sum(v[1] for v in per.values())},
          "%s: rank totals" % label)
    ck.eq(doc["totals"]["bytes"], info_json(env, a)["totals"]["payload_bytes"],
          "%s: ranks add up to the checkpoint's payload bytes" % label)
    text = env.shardctl_run("info", "--ranks", a).stdout.decode()
    ck.ok("total: %d shards, %d payload bytes" % (doc["totals"]["shards"],
                                                  doc["totals"]["bytes"]) in text,
          "%s: text total line: %r" % (label, text[-200:]))


def check_info_dcp(env, ck, store):
    """A DCP checkpoint on disk: tensors and objects as torch's expected.json
    says; strides and checksums per shard; after shardctl index, checksummed."""
    exp = json.load(open(os.path.join(DCP, "single.expected.json")))
    single = os.path.join(store, "single")
    doc = info_json(env, single)
    ck.ok(doc["format"].startswith("torch-dcp"), "dcp: format %r" % doc["format"])
    ck.eq(doc["verified"], False, "dcp: not verified before indexing")
    ck.eq({t["name"]: (t["dtype"], t["shape"], t["nbytes"]) for t in doc["tensors"]},
          {n: (t["dtype"], t["shape"], t["nbytes"]) for n, t in exp["tensors"].items()},
          "dcp: every tensor as torch's expected.json says")
    ck.eq(sorted(o["name"] for o in doc["objects"]), sorted(exp["objects"]),
          "dcp: objects")
    tr = info_json(env, single, "transposed")
    ck.eq((tr["shards"][0]["strides"], tr["shards"][0]["checksummed"], tr["checksummed"]),
          ([1, 5], False, False), "dcp: the transposed view's strides, no checksums")
    ob = info_json(env, single, "step")
    ck.eq((ob["entry"], ob["dtype"]), ("object", "U8"), "dcp: info names an object")
    ix = copy_ckpt(single, os.path.join(store, "single-ix"))
    env.shardctl_run("index", ix)
    em = info_json(env, ix, "model.embed.weight")
    ck.eq((em["checksummed"], em["shards"][0]["checksummed"], em["shards"][0]["blocks"]),
          (True, True, 1), "dcp: checksummed after shardctl index")
    rows4 = os.path.join(store, "rows4")
    r = info_json(env, "--ranks", rows4)
    ck.eq(r["totals"]["bytes"], info_json(env, rows4)["totals"]["payload_bytes"],
          "dcp rows4: ranks add up")
    r = env.shardctl_run("info", single, "no.such.tensor", check=False)
    ck.ok(r.returncode == 1 and b"no.such.tensor" in r.stderr,
          "an unknown tensor: exit 1 and says so: %r" % r.stderr)
    r = env.shardctl_run("info", "--ranks", store, check=False)
    ck.ok(r.returncode == 1 and b"not a checkpoint" in r.stderr,
          "--ranks of a store: exit 1: %r" % r.stderr)


def check_info_store(env, ck, store, names, mnt=None):
    doc = info_json(env, mnt or store)
    label = "mount" if mnt else "store"
    ck.eq(list(doc), KEYS["store"], "%s: store document keys" % label)
    ck.eq((doc["kind"], doc["in_mount"]), ("store", bool(mnt)), "%s: kind" % label)
    got = [c["name"] for c in doc["checkpoints"]]
    ck.eq(got, names, "%s: every checkpoint, step-2 before step-10" % label)
    ck.ok(all(c["state"] == "committed" and c["error"] is None for c in doc["checkpoints"]),
          "%s: all committed (foreign ones too): %s" % (
              label, [(c["name"], c["state"], c["error"]) for c in doc["checkpoints"]]))
    fmt = {c["name"]: c["format"] for c in doc["checkpoints"]}
    ck.ok(fmt.get("single", "").startswith("torch-dcp") and fmt.get("a") == "shardfs/1",
          "%s: formats: %s" % (label, fmt))
    ck.eq(doc["totals"], {"checkpoints": len(names), "committed": len(names),
                          "uncommitted": 0, "invalid": 0}, "%s: totals" % label)
    return doc


# ---------------------------------------------------------------- diff

def check_diff_shardfs(env, ck, store, a, ref_a):
    man = sm.manifest_of(a)
    ntot = len(man["tensors"]) + len(man.get("files", {}))
    a2 = copy_ckpt(a, os.path.join(store, "a-copy"))
    rc, lines, out, err = run_diff(env, a, a2)
    ck.ok(rc == 0 and out == "", "identical checkpoints: exit 0, no output (%d %r %r)"
          % (rc, out[:200], err[:200]))
    rc, st = run_stat(env, a, a2)
    total = sum(nbytes_of(t["dtype"], t["shape"]) for t in man["tensors"].values()) + \
        sum(t["shape"][0] for t in man.get("files", {}).values())
    ck.eq((rc, first_int(st.get("same")), first_int(st.get("changed")),
           st.get("compared")), (0, ntot, 0, "%d bytes by checksum, 0 by content" % total),
          "identical --stat: all same, decided by checksum")

    # another seed: exactly the entries whose reference bytes differ
    s2 = os.path.join(store, "s2")
    ref_s2 = env.gen(s2, layout="mixed", ranks=3, size="256K", seed=2, block_size="16K")
    want = {n for n in ref_a.tensors if ref_a.tensor_bytes(n) != ref_s2.tensor_bytes(n)}
    want |= {n for n in ref_a.files if ref_a.file_bytes(n) != ref_s2.file_bytes(n)}
    rc, lines, out, _ = run_diff(env, a, s2)
    ck.eq(rc, 1, "another seed: exit 1")
    ck.eq(sorted(lines), sorted(want), "another seed: the entries whose bytes differ")
    ck.ok(want and all(v[0] == "~" and v[2].startswith("bytes differ") for v in lines.values()),
          "another seed: each a change of bytes: %s" % list(lines.values())[:3])
    rc, st = run_stat(env, a, s2)
    ck.eq((rc, first_int(st.get("changed")), first_int(st.get("same"))),
          (1, len(want), ntot - len(want)), "another seed: --stat counts")
    ck.ok(st.get("changed", "").endswith("bytes %d)" % len(want)),
          "another seed: --stat: all bytes changes: %r" % st.get("changed"))

    # removed, dtype, shape: a copy with its manifest edited
    mod = copy_ckpt(a, os.path.join(store, "a-mod"))
    mm = sm.manifest_of(mod)
    gone = pick(mm, lambda n, t: len(t["shards"]) >= 2 and "offsets" in t["shards"][0])
    retype = pick(mm, lambda n, t: t["dtype"] == "BF16" and n != gone)
    reshape = pick(mm, lambda n, t: flat_sharded(n, t) and n not in (gone, retype))
    gone_bytes = nbytes_of(mm["tensors"][gone]["dtype"], mm["tensors"][gone]["shape"])
    del mm["tensors"][gone]
    mm["tensors"][retype]["dtype"] = "F16"
    old_shape = mm["tensors"][reshape]["shape"]
    mm["tensors"][reshape]["shape"] = [old_shape[0] * old_shape[1]]
    with open(os.path.join(mod, "manifest.json"), "w") as f:
        json.dump(mm, f)
    rc, lines, out, _ = run_diff(env, a, mod)
    ck.eq(rc, 1, "edited manifest: exit 1")
    ck.eq(lines, {
        gone: ("-", "tensor", "%s [%s])" % (man["tensors"][gone]["dtype"], ",".join(
            str(d) for d in man["tensors"][gone]["shape"]))),
        retype: ("~", "tensor", "dtype BF16 -> F16"),
        reshape: ("~", "tensor", "shape [%d,%d] -> [%d]" % (
            old_shape[0], old_shape[1], old_shape[0] * old_shape[1]))},
        "edited manifest: removed, dtype and shape named")
    rc, lines, out, _ = run_diff(env, mod, a)
    ck.eq([(n, v[0]) for n, v in lines.items() if v[0] == "+"], [(gone, "+")],
          "reversed: the tensor is added")
    rc, st = run_stat(env, a, mod)
    ck.eq((first_int(st.get("removed")), st.get("removed", "").split("(")[-1],
           st.get("changed"), first_int(st.get("added"))),
          (1, "%d bytes)" % gone_bytes, "2 (dtype 1, shape 1, bytes 0)", 0),
          "edited manifest: --stat")

    # one flipped byte with its block's checksum redone: a real change
    flip = copy_ckpt(a, os.path.join(store, "a-flip"))
    fm = sm.manifest_of(flip)
    fname = pick(fm, lambda n, t: flat_sharded(n, t) and n not in (gone, retype, reshape))
    sh = fm["tensors"][fname]["shards"][1]
    path = os.path.join(flip, sh["file"])
    flip_byte(path, sh["file_offset"] + 5)
    with open(path, "rb") as f:
        f.seek(sh["file_offset"])
        blk = f.read(min(fm["block_size"], sh["nbytes"]))
    sh["xxh3"][0] = xxhash.xxh3_64_hexdigest(blk)
    with open(os.path.join(flip, "manifest.json"), "w") as f:
        json.dump(fm, f)
    rc, lines, out, _ = run_diff(env, a, flip)
    ck.eq((rc, lines), (1, {fname: ("~", "tensor", "bytes differ (checksums: shard 1 block 0)")}),
          "flipped byte (checksum redone): that tensor, by checksum")
    rc, lines, out, _ = run_diff(env, "--content", a, flip)
    ck.eq((rc, lines), (1, {fname: ("~", "tensor", "bytes differ (content: first at byte %d)"
                                    % (sh["flat"][0] + 5))}),
          "flipped byte, --content: that tensor, at that byte")

    # damaged: the payload no longer matches its own checksums
    bad = copy_ckpt(a, os.path.join(store, "a-bad"))
    bm = sm.manifest_of(bad)
    bsh = bm["tensors"][fname]["shards"][1]
    flip_byte(os.path.join(bad, bsh["file"]), bsh["file_offset"] + 5)
    rc, lines, out, err = run_diff(env, a, bad)
    ck.eq(rc, 0, "damaged payload: the manifests agree, diff by checksum says same")
    rc, lines, out, err = run_diff(env, "--content", a, bad)
    ck.ok(rc == 2 and lines.get(fname, ("",))[0] == "!" and "B:" in lines[fname][2] and
          "checksum" in (out + err).lower(),
          "damaged payload, --content: exit 2, names the tensor and the checksum: %d %r %r"
          % (rc, out[-300:], err[-300:]))

    # trouble: exit 2
    for args, why in (([a, os.path.join(store, "nope")], "a missing checkpoint"),
                      ([a, store], "a store"), ([a], "one argument")):
        r = env.shardctl_run("diff", *args, check=False)
        ck.ok(r.returncode == 2 and r.stderr, "diff of %s: exit 2 and says why: %d %r"
              % (why, r.returncode, r.stderr[-200:]))
    return fname, flip


def copy_through_mount(mnt, src_name, dst_name):
    """Write every tensor of MNT/src_name into a new shardfs/1 checkpoint
    MNT/dst_name through the mount (shardfs_save.py), whole and flat."""
    src = os.path.join(mnt, src_name)
    top = os.path.join(src, "tensors")
    shards = []
    for dp, dns, fns in os.walk(top):
        for f in fns:
            p = os.path.join(dp, f)
            dt = os.getxattr(p, "user.shardfs.dtype").decode()
            shape = json.loads(os.getxattr(p, "user.shardfs.shape"))
            with open(p, "rb") as fh:
                raw = fh.read()
            shards.append(sm.sfs.Shard(os.path.relpath(p, top), raw, shape=shape,
                                       flat=0, dtype=dt))
    sm.sfs.save(mnt, dst_name, shards)
    return len(shards)


def check_diff_dcp(env, ck, store, m):
    exp = json.load(open(os.path.join(DCP, "single.expected.json")))
    single = os.path.join(store, "single")
    n = copy_through_mount(m.mnt, "single", "single-sf")
    ck.eq(n, len(exp["tensors"]), "every DCP tensor written through the mount")
    sf = os.path.join(store, "single-sf")
    ck.eq(sm.manifest_of(sf)["format"], "shardfs/1", "the copy is shardfs/1")
    rc, lines, out, err = run_diff(env, "--tensors", single, sf)
    ck.ok(rc == 0 and out == "", "DCP vs its shardfs/1 copy, tensors: the same (%d %r %r)"
          % (rc, out[:300], err[-300:]))
    rc, st = run_stat(env, "--tensors", single, sf)
    ck.eq((first_int(st.get("same")), st.get("compared")),
          (len(exp["tensors"]), "0 bytes by checksum, %d by content"
           % sum(t["nbytes"] for t in exp["tensors"].values())),
          "DCP vs shardfs/1: every tensor compared by content")
    rc, lines, out, err = run_diff(env, single, sf)
    ck.eq((rc, sorted(lines), {v[:2] for v in lines.values()}),
          (1, sorted(exp["objects"]), {("-", "object")}),
          "DCP vs shardfs/1 with objects: only the objects differ")
    rc, lines, out, err = run_diff(env, "--tensors", os.path.join(m.mnt, "single"),
                                   os.path.join(m.mnt, "single-sf"))
    ck.ok(rc == 0 and out == "", "the same in the mount (%d %r %r)" % (rc, out, err[-300:]))

    # export reads a mounted foreign checkpoint's manifest.json the same way
    st_mnt = sm.read_file(os.path.join(m.mnt, "single", "model.safetensors"))
    for src, label in ((os.path.join(m.mnt, "single"), "mount"), (single, "disk")):
        out_st = env.path("single-%s.safetensors" % label)
        env.shardctl_run("export", "--safetensors", out_st, src)
        ck.bytes_eq(sm.read_file(out_st), st_mnt,
                    "export of the DCP checkpoint (%s) = the mount's model.safetensors" % label)

    # a flipped byte in a DCP tensor's payload
    sflip = copy_ckpt(single, os.path.join(store, "single-flip"))
    em = info_json(env, sflip, "model.embed.weight")["shards"][0]
    flip_byte(os.path.join(sflip, em["file"]), em["file_offset"] + 5)
    want = {"model.embed.weight": ("~", "tensor", "bytes differ (content: first at byte 5)")}
    rc, lines, out, err = run_diff(env, single, sflip)
    ck.eq((rc, lines), (1, want), "DCP with a flipped byte: that tensor, by content")
    rc, lines, out, err = run_diff(env, os.path.join(m.mnt, "single-sf"), sflip)
    ck.eq((rc, {k: v for k, v in lines.items() if v[1] == "tensor"}), (1, want),
          "mounted shardfs/1 copy vs flipped DCP: that tensor")
    # both indexed: decided by checksum
    ix_a = os.path.join(store, "single-ix")       # indexed by check_info_dcp
    ix_b = copy_ckpt(sflip, os.path.join(store, "single-flip-ix"))
    env.shardctl_run("index", ix_b)
    rc, lines, out, err = run_diff(env, ix_a, ix_b)
    ck.eq((rc, lines), (1, {"model.embed.weight": ("~", "tensor",
                                                   "bytes differ (checksums: shard 0 block 0)")}),
          "indexed DCP checkpoints: decided by their checksums")
    rc, st = run_stat(env, ix_a, ix_b)
    ck.ok(first_int(st.get("compared")) and first_int(st.get("compared")) > 0,
          "indexed: bytes compared by checksum: %r" % st.get("compared"))
    # two different DCP checkpoints torch wrote
    e4 = json.load(open(os.path.join(DCP, "rows4.expected.json")))
    rc, lines, out, err = run_diff(env, "--tensors", single, os.path.join(store, "rows4"))
    ck.eq((rc, sorted(n for n, v in lines.items() if v[0] == "-"),
           sorted(n for n, v in lines.items() if v[0] == "+")),
          (1, sorted(set(exp["tensors"]) - set(e4["tensors"])),
           sorted(set(e4["tensors"]) - set(exp["tensors"]))),
          "DCP single vs rows4: removed and added tensors")


# ---------------------------------------------------------------- progress

def run_on_pty(argv, timeout=60):
    """Run argv with stderr on a pseudo-terminal; (rc, stdout, tty bytes)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL)
    os.close(slave)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:       # EIO: every holder of the slave is gone
                break
            if not chunk:
                break
            got += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    out = p.stdout.read()
    p.stdout.close()
    return p.wait(timeout=10), out, got


def check_progress(env, ck, store, a, a2):
    gen_dir = os.path.join(env.path("progress"), "g")
    out_st = env.path("exported.safetensors")
    cases = [
        ("gen", ["gen", "--size", "2M", "--ranks", "2", gen_dir], ["--force"]),
        ("export", ["export", "--safetensors", out_st, a], []),
        ("verify", ["verify", a], []),
        ("index", ["index", os.path.join(store, "single-ix")], []),
        ("diff", ["diff", "--content", a, a2], []),
    ]
    for what, argv, again in cases:
        rc, out, tty = run_on_pty([env.shardctl] + argv)
        ck.ok(rc == 0 and ("\r%s: " % what).encode() in tty and b"100%" in tty
              and tty.endswith(b"\r\x1b[K"),
              "%s: progress on a terminal, erased at the end: %d %r" % (what, rc, tty[-200:]))
        r = subprocess.run([env.shardctl] + argv[:1] + again + argv[1:],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        ck.ok(r.returncode == 0 and r.stderr == b"",
              "%s: nothing on stderr when it is a pipe: %d %r" % (what, r.returncode,
                                                                   r.stderr[-200:]))


# ---------------------------------------------------------------- main

def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    a = os.path.join(store, "a")
    ref_a = env.gen(a, layout="mixed", ranks=3, size="256K", seed=1, block_size="16K")
    for n in ("single", "rows4"):
        copy_ckpt(os.path.join(DCP, n), os.path.join(store, n))
    copy_ckpt(os.path.join(DCP_EXT, "zstd"), os.path.join(store, "zstd"))
    for n in ("step-10", "step-2"):
        env.gen(os.path.join(store, n), size="64K", ranks=1, ref=False)

    man = sm.manifest_of(a)
    on_disk = check_info_ckpt(env, ck, a, "disk")
    check_info_tensor(env, ck, a, pick(man, lambda n, t: "offsets" in t["shards"][0]
                                       and len(t["shards"]) >= 2), "disk box")
    check_info_tensor(env, ck, a, pick(man, flat_sharded), "disk flat")
    check_info_ranks(env, ck, a, "disk")
    check_info_dcp(env, ck, store)
    names = ["a", "rows4", "single", "single-ix", "step-2", "step-10", "zstd"]
    check_info_store(env, ck, store, names)

    fname, flip = check_diff_shardfs(env, ck, store, a, ref_a)

    with sm.Mount(env, store) as m:
        ma = os.path.join(m.mnt, "a")
        in_mount = info_json(env, ma)
        strip = lambda d: {k: v for k, v in d.items() if k not in ("path", "dir", "in_mount")}  # noqa: E731
        ck.eq(strip(in_mount), strip(on_disk), "info --json: the same in the mount")
        ck.eq(in_mount["in_mount"], True, "in_mount in a mount")
        check_info_ranks(env, ck, ma, "mount")
        tr = info_json(env, os.path.join(m.mnt, "single"), "transposed")
        ck.eq((tr["format"][:9], tr["shards"][0]["strides"]), ("torch-dcp", [1, 5]),
              "a mounted DCP checkpoint's tensor, as the mount shows it")
        # a zstd-coded DCP chunk: the same shard on disk and in the mount
        zd = info_json(env, os.path.join(store, "zstd"), "ramp")
        zm = info_json(env, os.path.join(m.mnt, "zstd"), "ramp")
        ck.eq(strip(zm), strip(zd), "a coded shard: info the same on disk and in the mount")
        ck.ok(zd["shards"][0]["codec"] == "zstd" and
              0 < zd["shards"][0]["stored_nbytes"] < zd["nbytes"],
              "a coded shard: codec and stored bytes: %s" % zd["shards"])
        rc, lines, out, err = run_diff(env, os.path.join(store, "zstd"),
                                       os.path.join(m.mnt, "zstd"))
        ck.ok(rc == 0 and out == "", "zstd DCP, disk vs mount: the same (%d %r %r)"
              % (rc, out, err[-300:]))
        doc = info_json(env, m.mnt)
        ck.ok({"a", "single", "rows4"} <= {c["name"] for c in doc["checkpoints"]} and
              doc["totals"]["invalid"] == 0, "info of the mount's root: foreign ones valid")
        rc, lines, out, err = run_diff(env, ma, os.path.join(store, "a-copy"))
        ck.ok(rc == 0 and out == "", "mount vs disk copy: the same (%d %r)" % (rc, out))
        rc, lines, out, err = run_diff(env, "--content", ma, flip)
        ck.eq((rc, sorted(lines)), (1, [fname]),
              "mount vs flipped copy, --content: that tensor")
        check_diff_dcp(env, ck, store, m)
    check_progress(env, ck, store, a, os.path.join(store, "a-copy"))


if __name__ == "__main__":
    sys.exit(sm.main(test))
