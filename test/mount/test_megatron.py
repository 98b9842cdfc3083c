"""test_megatron - Megatron-Core torch_dist checkpoints mounted as they lie
(issue 13, SPEC 7).

The store holds, next to a shardfs/1 checkpoint:
- the checkpoints real megatron-core wrote (test/fixtures/megatron/
  mcore-VERSION/NAME, made by test/interop/make_megatron_fixtures.py;
  committed): `gpt_tp2` (0.16.1 and 0.15.3: TP 2, stacked layers, F32,
  BF16, F16, a ShardedObject per rank) and `distopt` (0.15.3: the
  distributed optimizer's state as flattened ranges, TP 2 x DP 2);
- `zarr_tp2`, a zarr-backend checkpoint megatron-core 0.15.3 wrote;
- hostile variants: distopt with the committed .metadata variants of
  test/interop/make_megatron_hostile.py (mcore_data that lies), gpt_tp2
  with a metadata.json that is huge, not JSON, of wrong types, another
  backend, a symlink out, and gpt_tp2 without its .metadata (a save still
  running).

Checked through one mount: every tensor's bytes against the xxh3 of the
global tensor handed to megatron (test/interop/check_dcp_tree.py; the
flattened-range tensors in their real shape), objects/ (ShardedObjects
under objects/KEY/shard_I_N) loaded back by torch.load, model.safetensors,
npy/ and random slices against tensors/, the synthesized manifest.json,
the format (naming sharded_backend_version) and verified xattrs,
metadata.json and common.pt at the root byte for byte (common.pt loads to
the state megatron was given), nothing else at the root; every change
fails with EROFS and `shardctl rm` refuses. The zarr checkpoint is not
shown and one log line says the backend is not read; each hostile variant
leaves out exactly the tensor (or checkpoint) it breaks with one log line
and serves the rest byte-exact; a metadata.json that is not Megatron's
leaves the DCP checkpoint shown as plain DCP. The store is byte-for-byte
unchanged at the end.
"""

import glob
import json
import os
import shutil
import sys
import tempfile

import sfmount as sm
import test_dcp as td

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "megatron")
PY = "/usr/bin/python3"
MCORE = "megatron-torch_dist"


def collect(store, cases, skipped):
    """Copy every committed checkpoint into store as VERSION-NAME; shown
    ones to cases (name, expected path, expected), others to skipped."""
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "mcore-*"))):
        ver = os.path.basename(vdir)
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            name = "%s-%s" % (ver, os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            with open(exp) as f:
                e = json.load(f)
            (cases if e["format"] else skipped).append((name, exp, e))


def variant(store, src, name, metadata=None, config=None, drop=()):
    """A copy of checkpoint src as name, with its .metadata taken from the
    file metadata, metadata.json replaced by config (bytes), files dropped."""
    d = os.path.join(store, name)
    shutil.copytree(src, d, symlinks=True)
    if metadata:
        shutil.copyfile(metadata, os.path.join(d, ".metadata"))
    if config is not None:
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(config)
    for f in drop:
        os.unlink(os.path.join(d, f))
    return d


def check_tree(ck, root, exp_path, label, drop=()):
    """check_dcp_tree.py against exp_path, less the tensors in drop."""
    with open(exp_path) as f:
        exp = json.load(f)
    for k in drop:
        exp["tensors"].pop(k)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(exp, f)
        path = f.name
    try:
        rc, out, err = td.run([PY, os.path.join(INTEROP, "check_dcp_tree.py"),
                               root, path, "--torch-load"])
    finally:
        os.unlink(path)
    ck.eq(rc, 0, "%s: check_dcp_tree: %s%s" % (label, out[-3000:], err[-2000:]))


def check_root(ck, root, src, exp, label):
    """metadata.json and common.pt byte for byte; nothing else at the root."""
    want = {"manifest.json", "model.safetensors", "npy", "tensors",
            "metadata.json", "common.pt"}
    if exp["objects"]:
        want.add("objects")
    ck.eq(sorted(os.listdir(root)), sorted(want), "%s: the root's entries" % label)
    for f in ("metadata.json", "common.pt"):
        ck.bytes_eq(sm.read_file(os.path.join(root, f)),
                    sm.read_file(os.path.join(src, f)), "%s: %s as stored" % (label, f))
    code = ("import sys; sys.path.insert(0, %r); import check_dcp_tree as c; "
            "print(repr(c.torch_load(sys.argv[1])))" % INTEROP)
    rc, out, err = td.run([PY, "-c", code, os.path.join(root, "common.pt")])
    ck.eq((rc, out.strip()), (0, exp["common"]),
          "%s: common.pt loads to the state megatron was given: %s" % (label, err[-500:]))


def log_lines(log, *words):
    return [l for l in log.splitlines() if all(w in l for w in words)]


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases, skipped = [], []
    collect(store, cases, skipped)
    ck.ok(any(e.get("megatron_core") == "0.16.1" for _, _, e in cases),
          "megatron-core 0.16.1 fixtures found in %s" % FIXTURES)
    ck.ok(any("distopt" in n for n, _, _ in cases), "the flattened-range fixture found")
    ck.ok(any("zarr" in n for n, _, _ in skipped), "the zarr fixture found")
    distopt = os.path.join(FIXTURES, "mcore-0.15.3", "distopt")
    gpt = os.path.join(FIXTURES, "mcore-0.16.1", "gpt_tp2")
    # hostile .metadata variants of distopt (committed)
    hdir = os.path.join(FIXTURES, "hostile")
    with open(os.path.join(hdir, "variants.json")) as f:
        hostile = json.load(f)
    for n in hostile:
        variant(store, distopt, "h-" + n, metadata=os.path.join(hdir, n + ".metadata"))
    # metadata.json variants of gpt_tp2
    outside = env.path("outside")
    os.makedirs(outside)
    real = sm.read_file(os.path.join(gpt, "metadata.json"))
    with open(os.path.join(outside, "metadata.json"), "wb") as f:
        f.write(real)
    foreign = {  # not Megatron's config: shown as plain DCP
        "j-huge": real[:-1] + b" " * (70 << 10) + b"}",
        "j-notjson": b"\x00garbage\xff",
        "j-other": b'{"step": 500, "note": "a user\'s own file"}',
    }
    broken = {  # Megatron's, malformed or another backend: left out
        "j-types": (b'{"sharded_backend": 5}', "sharded_backend"),
        "j-version": (b'{"sharded_backend": "torch_dist", "sharded_backend_version": "1"}',
                      "sharded_backend_version"),
        "j-backend": (b'{"sharded_backend": "tensorstore", "sharded_backend_version": 1}',
                      "tensorstore"),
    }
    for n, text in foreign.items():
        variant(store, gpt, n, config=text)
    for n, (text, _) in broken.items():
        variant(store, gpt, n, config=text)
    d = variant(store, gpt, "j-symlink")
    os.unlink(os.path.join(d, "metadata.json"))
    os.symlink(os.path.join(outside, "metadata.json"), os.path.join(d, "metadata.json"))
    variant(store, gpt, "partial", drop=(".metadata",))
    env.gen(os.path.join(store, "native"), layout="mixed", ranks=2, size="128K",
            ref=False)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, exp_path, exp in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            check_tree(ck, root, exp_path, name)
            ck.eq(os.getxattr(root, "user.shardfs.format").decode(), exp["format"],
                  "%s: format xattr names the backend version" % name)
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
                  "%s: verified xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.state").decode(), "committed",
                  "%s: state" % name)
            td.check_views(env, ck, root, name)
            man = sm.manifest_of(root)
            ck.eq(man.get("format"), exp["format"], "%s: manifest.json's format" % name)
            ck.eq(sorted(man.get("tensors", {})), sorted(exp["tensors"]),
                  "%s: manifest.json lists every tensor" % name)
            check_root(ck, root, os.path.join(store, name), exp, name)
            if exp["objects"]:
                ck.ok(os.path.isdir(os.path.join(root, "objects", "rng_state")),
                      "%s: objects/rng_state/ is a directory of shards" % name)
        if cases:
            td.check_readonly(env, ck, mnt, cases[0][0])
        log = m.log_text()

        for name, _, exp in skipped:
            ck.ok(name not in listed, "%s (zarr) is not shown" % name)
            ck.eq(len(log_lines(log, name, "left out", "zarr")), 1,
                  "one log line says %s is a zarr checkpoint shardfs does not read" % name)
        # hostile mcore_data
        dexp = os.path.join(FIXTURES, "mcore-0.15.3", "distopt.expected.json")
        for n, h in sorted(hostile.items()):
            name = "h-" + n
            if h["left_out"] is None:
                ck.ok(name not in listed, "%s (%s) is left out" % (name, h["what"]))
                ck.eq(len(log_lines(log, name, "left out")), 1,
                      "one log line says %s was left out" % name)
                continue
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted without the tensor it breaks" % name):
                continue
            for k in h["left_out"]:
                ck.ok(not os.path.exists(sm.tensor_path(root, k)),
                      "%s: %s is left out" % (name, k))
                ck.eq(len(log_lines(log, name, k, "left out")), 1,
                      "%s: one log line says why %s is left out" % (name, k))
            check_tree(ck, root, dexp, name, drop=h["left_out"])
        ck.ok(log_lines(log, "h-evil-global", "posix"), "the log names the refused global")
        # metadata.json that is not Megatron's: plain DCP
        gexp = os.path.join(FIXTURES, "mcore-0.16.1", "gpt_tp2.expected.json")
        for n in sorted(foreign) + ["j-symlink"]:
            root = os.path.join(mnt, n)
            if not ck.ok(n in listed, "%s is shown as plain DCP" % n):
                continue
            ck.ok(os.getxattr(root, "user.shardfs.format").decode().startswith("torch-dcp"),
                  "%s: format is DCP's" % n)
            ck.eq(len(log_lines(log, n, "not Megatron-Core's")), 1,
                  "%s: one log line says metadata.json is not Megatron's" % n)
            check_tree(ck, root, gexp, n)
        ck.ok(not os.path.exists(os.path.join(mnt, "j-symlink", "metadata.json")),
              "j-symlink: the symlink out is not served")
        for n, (_, word) in sorted(broken.items()):
            ck.ok(n not in listed, "%s is left out" % n)
            ck.eq(len(log_lines(log, n, "left out", word)), 1,
                  "one log line says why %s is left out" % n)
        ck.ok("partial" not in listed, "a save still running (no .metadata) is not shown")
        ck.ok(log_lines(log, '"partial" skipped', "still being written"),
              "the running save's skip is logged")
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.format").decode(),
              "shardfs/1", "native: format xattr")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount and every attempt to change it")


if __name__ == "__main__":
    sys.exit(sm.main(test))
