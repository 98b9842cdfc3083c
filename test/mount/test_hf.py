"""test_hf - Hugging Face style weights mounted as they lie (issues 11, 13; SPEC 7).

The store holds, next to a shardfs/1 checkpoint, the weights the real
frameworks wrote (test/fixtures/hf/*, made by
test/interop/make_hf_fixtures.py; committed): transformers 5.24 and 4.46
save_pretrained, sharded and unsharded, safetensors and .bin (tied
embeddings and a fused buffer: storages shared, a storage offset), and
torch 2.15 DCP's HuggingFaceStorageWriter (one process with an index; 2
ranks writing one file each; 2 ranks consolidated). Hostile variants are
made here from copies of those files: weight_map paths with "..", an
absolute path, a symlink out, a file that is missing, a tensor the index
names that is not in its file and the reverse, a missing shard, a
truncated shard, a header that lies about offsets, DCP chunks that
disagree on dtype, overlap or leave a gap, a truncated .bin, a .bin
whose data.pkl would run a command, .bin archives that name an entry
twice or hold a second data.pkl (issue 30), and a .bin that also holds
float8 and uint16/32/64 tensors as torch 2.x pickles them
(_rebuild_tensor_v3; bin_v3.py).

Checked through one mount: every tensor's bytes against the xxh3 of the
state dict handed to the framework (check_dcp_tree.py), model.safetensors,
npy/ and random slices against tensors/, the synthesized manifest.json,
the format and verified xattrs, root files (config.json as it is; the
index and weight files not shown); every change fails with EROFS and
`shardctl rm` refuses; where /work/venvs/torch2 exists, safetensors'
load_file and transformers' from_pretrained read the mount
(test/interop/check_hf_load.py); each hostile variant leaves out what it must with
a log line and nothing else; nothing is executed; the store is
byte-for-byte unchanged at the end.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys

import sfmount as sm
import test_dcp as td

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "hf")
PY = "/usr/bin/python3"
# safetensors and transformers themselves read the mount where this venv
# exists (not in CI: there the views are parsed by hand only)
PY_HF = "/work/venvs/torch2/bin/python"


def collect(store, cases):
    """Every FIXTURES/VER/NAME (with NAME.expected.json) into store as
    VER-NAME; append (name, expected path, source dir)."""
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "*"))):
        ver = os.path.basename(vdir)
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            name = "%s-%s" % (ver, os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            cases.append((name, exp, src))


def want_format(src):
    names = os.listdir(src)
    if any(n.endswith(".bin") for n in names):
        return "hf-bin"
    dcp = any(b"DCP_VERSION" in st_header(os.path.join(src, n))[2]
              for n in names if n.endswith(".safetensors"))
    return "hf-safetensors dcp-1.0" if dcp else "hf-safetensors"


def st_header(path):
    """(header dict, data bytes, raw header bytes) of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:], b[8:8 + n]


def st_write(path, header, data):
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def check_manifest(ck, root, label, exp, fmt, src):
    man = sm.manifest_of(root)
    ck.eq(man.get("format"), fmt, "%s: manifest.json names the format" % label)
    ck.eq(sorted(man.get("tensors", {})), sorted(exp["tensors"]),
          "%s: manifest.json lists every tensor" % label)
    ck.ok('"xxh3"' not in json.dumps(man), "%s: no checksums" % label)
    ext = ".bin" if fmt == "hf-bin" else ".safetensors"
    files = set()
    for n, t in man.get("tensors", {}).items():
        for s in t.get("shards", []):
            files.add(s.get("file", ""))
    ck.ok(files and all(f.endswith(ext) and os.path.isfile(os.path.join(src, f))
                        for f in files),
          "%s: shards point into the %s files: %r" % (label, ext, sorted(files)))
    hf = man.get("hf", {})
    index = [n for n in os.listdir(src) if n.endswith(".index.json")]
    if index:
        with open(os.path.join(src, index[0])) as f:
            want = json.load(f)["metadata"]
        ck.eq(hf.get("index_metadata"), want, "%s: the index's metadata in the manifest" % label)
    if fmt == "hf-safetensors":
        ck.ok(all(v.get("format") == "pt"
                  for v in hf.get("safetensors_metadata", {}).values()),
              "%s: __metadata__ of the files in the manifest" % label)
    if "dcp" in fmt:
        ck.ok(all("DCP_SHARDING_INFO" in v
                  for v in hf.get("safetensors_metadata", {}).values())
              and hf.get("safetensors_metadata"),
              "%s: DCP's __metadata__ in the manifest" % label)


def check_root_files(ck, root, label, src):
    shown = set(os.listdir(root)) - {"tensors", "npy", "manifest.json",
                                     "model.safetensors"}
    want = set(n for n in os.listdir(src)
               if os.path.isfile(os.path.join(src, n))
               and not n.endswith((".safetensors", ".bin", ".index.json")))
    ck.eq(shown, want, "%s: the root files are the framework's other files" % label)
    for n in want:
        with open(os.path.join(src, n), "rb") as f:
            ck.bytes_eq(sm.read_file(os.path.join(root, n)), f.read(),
                        "%s: root file %s as it is" % (label, n))


# ------------------------------------------------------------ hostile variants

def make_hostile(store, outside):
    """Variants of real fixtures in store as h-NAME. Returns {name: (kind,
    victims, base case)}: kind "shown" (victims left out, the rest served),
    "partial" (not shown: a save still running) or "refused" (left out)."""
    st_base = os.path.join(FIXTURES, "transformers-5.24", "llama-st")
    bin_base = os.path.join(FIXTURES, "transformers-4.46", "llama-bin")
    dist_base = os.path.join(FIXTURES, "torch-2.15", "dcp-hf-dist2")
    with open(os.path.join(st_base, "model.safetensors.index.json")) as f:
        st_index = json.load(f)
    with open(os.path.join(bin_base, "pytorch_model.bin.index.json")) as f:
        bin_index = json.load(f)
    f2 = "model-00002-of-00004.safetensors"
    in_f2 = sorted(k for k, v in st_index["weight_map"].items() if v == f2)
    victim = in_f2[0]
    os.makedirs(outside, exist_ok=True)
    shutil.copy(os.path.join(st_base, f2), os.path.join(outside, f2))
    out = {}

    def variant(name, base, kind, victims, fn):
        d = os.path.join(store, "h-" + name)
        shutil.copytree(base, d)
        for n in os.listdir(d):
            os.chmod(os.path.join(d, n), 0o644)
        fn(d)
        out[name] = (kind, victims, base)

    def set_index(d, fn, index=st_index, fname="model.safetensors.index.json"):
        ix = json.loads(json.dumps(index))
        fn(ix["weight_map"])
        with open(os.path.join(d, fname), "w") as f:
            json.dump(ix, f, indent=2)

    def retarget(path):
        return lambda d: set_index(d, lambda wm: wm.__setitem__(victim, path))

    variant("dotdot", st_base, "shown", [victim],
            retarget("../../outside/" + f2))
    variant("abs", st_base, "shown", [victim], retarget(os.path.join(outside, f2)))

    def symlink(d):
        os.symlink(os.path.join(outside, f2), os.path.join(d, "link.safetensors"))
        set_index(d, lambda wm: wm.__setitem__(victim, "link.safetensors"))
    variant("symlink", st_base, "shown", [victim], symlink)
    variant("gone", st_base, "shown", [victim], retarget("gone.safetensors"))
    variant("unindexed", st_base, "shown", [victim],
            lambda d: set_index(d, lambda wm: wm.pop(victim)))
    variant("ghost", st_base, "shown", ["ghost.weight"],
            lambda d: set_index(d, lambda wm: wm.__setitem__("ghost.weight", f2)))
    variant("noshard", st_base, "partial", [],
            lambda d: os.unlink(os.path.join(d, "model-00003-of-00004.safetensors")))

    def truncate(d):
        p = os.path.join(d, f2)
        os.truncate(p, os.path.getsize(p) - 10)
    variant("truncated", st_base, "shown", in_f2, truncate)

    def lying(d):
        # a tensor of f2 claims the bytes of another of the same size
        p = os.path.join(d, f2)
        h, data, _ = st_header(p)
        ents = sorted((v["data_offsets"][1] - v["data_offsets"][0], k)
                      for k, v in h.items() if k != "__metadata__")
        a, b = [k for (n, k) in ents if n == ents[-1][0]][:2]
        h[b]["data_offsets"] = h[a]["data_offsets"]
        st_write(p, h, data)
    variant("lying", st_base, "shown", in_f2, lying)

    # DCP's per-rank files: chunks that disagree, overlap, leave a gap
    r2 = "shard-00002-model-00001-of-00001.safetensors"

    def dist_edit(fn):
        def edit(d):
            p = os.path.join(d, r2)
            h, data, _ = st_header(p)
            info = json.loads(h["__metadata__"]["DCP_SHARDING_INFO"])
            fn(h, info)
            h["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)
            st_write(p, h, data)
        return edit
    variant("dist-dtype", dist_base, "shown", ["layer.b"],
            dist_edit(lambda h, i: h["layer.b"].__setitem__("dtype", "BF16")))
    variant("dist-overlap", dist_base, "shown", ["emb.weight"],
            dist_edit(lambda h, i: i["emb.weight"].__setitem__("saved_offsets", [18, 0])))
    variant("dist-gap", dist_base, "shown", ["emb.weight"],
            dist_edit(lambda h, i: i["emb.weight"].__setitem__("saved_offsets", [20, 0])))
    variant("dist-nooffsets", dist_base, "shown", ["proj.weight"],
            dist_edit(lambda h, i: i.pop("proj.weight")))

    # .bin: truncated, and one whose data.pkl runs a command when unpickled
    b1 = "pytorch_model-00001-of-00004.bin"
    in_b1 = sorted(k for k, v in bin_index["weight_map"].items() if v == b1)
    variant("bin-truncated", bin_base, "shown", in_b1,
            lambda d: os.truncate(os.path.join(d, b1), os.path.getsize(os.path.join(d, b1)) - 30))
    marker = os.path.join(outside, "PWNED")

    def evil(d):
        import zipfile
        p = os.path.join(d, b1)
        with zipfile.ZipFile(os.path.join(bin_base, b1)) as z:
            entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
        # what pickle.load would run: os.system("touch MARKER")
        evil_pkl = (b"\x80\x02cposix\nsystem\nq\x00X" +
                    struct.pack("<I", len("touch " + marker)) +
                    ("touch " + marker).encode() + b"\x85R.")
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
            for n, b in entries:
                z.writestr(n, evil_pkl if n.endswith("/data.pkl") else b)
    variant("bin-evil", bin_base, "refused", [], evil)

    # issue 30: a .bin naming one zip entry twice (torch's reader and
    # Python's zipfile disagree on which one), or holding a second
    # data.pkl in another folder, is left out whole
    def append_entry(name_of, blob_of):
        def edit(d):
            import zipfile
            p = os.path.join(d, b1)
            with zipfile.ZipFile(p) as z:
                names = z.namelist()
                pkl = [n for n in names if n.endswith("/data.pkl")][0]
                store_n = sorted(n for n in names if "/data/" in n)[0]
                blob = z.read(store_n)
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
                with zipfile.ZipFile(p, "a") as z:
                    z.writestr(name_of(pkl, store_n), blob_of(blob))
        return edit
    variant("bin-dup-storage", bin_base, "shown", in_b1,
            append_entry(lambda pkl, st: st, lambda b: bytes(len(b))))
    variant("bin-dup-pkl", bin_base, "shown", in_b1,
            append_entry(lambda pkl, st: pkl, lambda b: evil_pkl_of(marker)))
    variant("bin-two-pkl", bin_base, "shown", in_b1,
            append_entry(lambda pkl, st: "other/data.pkl", lambda b: evil_pkl_of(marker)))
    return out, marker


def evil_pkl_of(marker):
    """A data.pkl that would run os.system("touch MARKER") if unpickled."""
    cmd = ("touch " + marker).encode()
    return (b"\x80\x02cposix\nsystem\nq\x00X" + struct.pack("<I", len(cmd)) +
            cmd + b"\x85R.")


def check_hostile(ck, tmp, mnt, log, hostile, marker):
    listed = set(os.listdir(mnt))
    lines = log.splitlines()
    for name, (kind, victims, base) in sorted(hostile.items()):
        h = "h-" + name
        with open(base + ".expected.json") as f:
            exp = json.load(f)["tensors"]
        if kind == "partial":
            ck.ok(h not in listed, "%s is not shown" % h)
            ck.ok(any('"%s" skipped' % h in l and "still being written" in l for l in lines),
                  "%s: its skip is logged" % h)
            continue
        if kind == "refused":
            ck.ok(h not in listed, "%s is left out" % h)
            ck.eq(len([l for l in lines if '"%s" left out' % h in l]), 1,
                  "%s: one log line says it was left out" % h)
            continue
        root = os.path.join(mnt, h)
        if not ck.ok(h in listed, "%s is mounted without what is bad" % h):
            continue
        got = set(os.listdir(os.path.join(root, "tensors")))
        for v in victims:
            ck.ok(v not in got, "%s: %s is left out" % (h, v))
        ck.ok(any(h in l and ("left out" in l) for l in lines),
              "%s: a log line says what was left out" % h)
        # everything else is served, byte-exact
        keep = {k: e for k, e in exp.items() if k not in victims}
        ck.eq(sorted(got), sorted(keep), "%s: every other tensor is shown" % h)
        part = os.path.join(tmp, "exp-" + h + ".json")
        with open(part, "w") as f:
            json.dump({"tensors": keep, "objects": {}}, f)
        rc, out, err = td.run([PY, os.path.join(INTEROP, "check_dcp_tree.py"), root, part])
        ck.eq(rc, 0, "%s: the other tensors are byte-exact: %s%s" % (h, out[-2000:], err[-1000:]))
    for name, why in (("dotdot", "not a plain file name"), ("abs", "not a plain file name"),
                      ("symlink", "leads out"), ("gone", "missing"),
                      ("unindexed", "not in the index"), ("ghost", "does not hold it"),
                      ("truncated", "header"), ("lying", "overlap"),
                      ("dist-dtype", "disagree"), ("dist-overlap", "overlap"),
                      ("dist-gap", "not covered"), ("dist-nooffsets", "saved_offsets"),
                      ("bin-truncated", "weight file"),
                      ("bin-dup-storage", "is in the archive twice"),
                      ("bin-dup-pkl", "is in the archive twice"),
                      ("bin-two-pkl", "more than one data.pkl")):
        ck.ok(any("h-" + name in l and why in l for l in lines),
              "h-%s: the log line says %r" % (name, why))
    ck.ok(any("h-bin-evil" in l and "posix" in l for l in lines),
          "h-bin-evil: the log names the refused global")
    ck.ok(not os.path.exists(marker), "h-bin-evil: nothing was executed")


def test(env, ck):
    store = env.path("store")
    outside = env.path("outside")
    os.makedirs(store)
    cases = []
    collect(store, cases)
    ck.ok(len(cases) >= 8, "fixtures found in %s: %d" % (FIXTURES, len(cases)))
    hostile, marker = make_hostile(store, outside)
    # issue 30: tensors as torch 2.x saves float8 and uint16/32/64
    # (_rebuild_tensor_v3, an UntypedStorage) in a .bin beside torch's own
    v3_exp = env.path("bin-v3.expected.json")
    rc, out, err = td.run([PY, os.path.join(HERE, "bin_v3.py"),
                           os.path.join(FIXTURES, "transformers-4.46", "llama-bin"),
                           "pytorch_model-00001-of-00004.bin",
                           os.path.join(store, "h-bin-v3"), v3_exp])
    ck.eq(rc, 0, "bin_v3.py wrote h-bin-v3: %s" % err[-2000:])
    env.gen(os.path.join(store, "native"), layout="mixed", ranks=2, size="128K",
            ref=False)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, exp, src in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            with open(exp) as f:
                expected = json.load(f)
            rc, out, err = td.run([PY, os.path.join(INTEROP, "check_dcp_tree.py"),
                                   root, exp])
            ck.eq(rc, 0, "%s: check_dcp_tree: %s%s" % (name, out[-3000:], err[-2000:]))
            fmt = want_format(src)
            ck.eq(os.getxattr(root, "user.shardfs.format").decode(), fmt,
                  "%s: format xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
                  "%s: verified xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.state").decode(), "committed",
                  "%s: state" % name)
            td.check_views(env, ck, root, name)
            check_manifest(ck, root, name, expected, fmt, src)
            check_root_files(ck, root, name, src)
            ck.ok(not os.path.exists(os.path.join(root, "objects")),
                  "%s: no objects/" % name)
            if os.access(PY_HF, os.X_OK):
                argv = [PY_HF, os.path.join(INTEROP, "check_hf_load.py"), root, exp]
                if os.path.exists(os.path.join(root, "config.json")):
                    argv.append("--from-pretrained")
                rc, out, err = td.run(argv)
                ck.eq(rc, 0, "%s: safetensors%s read the mount: %s%s" % (
                    name, " and transformers" if len(argv) > 4 else "",
                    out[-2000:], err[-2000:]))
            else:
                print("%s: %s absent: safetensors and transformers not tried" % (name, PY_HF))
        cons = [n for n, _, _ in cases if n.endswith("dcp-hf-cons2")]
        if cons:
            ck.ok(not os.path.exists(os.path.join(mnt, cons[0], "sharded")),
                  "%s: the sharded/ subdirectory is not shown" % cons[0])
        first = [n for n, _, _ in cases if "llama-st" in n]
        if first:
            td.check_readonly(env, ck, mnt, first[0])
        check_hostile(ck, env.tmp, mnt, m.log_text(), hostile, marker)
        root = os.path.join(mnt, "h-bin-v3")
        if ck.ok(os.path.isdir(root), "h-bin-v3 is mounted"):
            # every tensor, the v3 ones among them, byte-exact with dtype
            # and shape xattrs; nothing else in tensors/
            rc, out, err = td.run([PY, os.path.join(INTEROP, "check_dcp_tree.py"),
                                   root, v3_exp])
            ck.eq(rc, 0, "h-bin-v3: check_dcp_tree: %s%s" % (out[-3000:], err[-2000:]))
            man = sm.manifest_of(root)
            ck.ok(any(s.get("strides") for s in man["tensors"].get("v3.u16_t", {}).get("shards", [])),
                  "h-bin-v3: the transposed U16 view is read through strides")
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.format").decode(),
              "shardfs/1", "native: format xattr")
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.verified").decode(),
              "yes", "native: verified xattr")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount and every attempt to change it")


if __name__ == "__main__":
    sys.exit(sm.main(test))
