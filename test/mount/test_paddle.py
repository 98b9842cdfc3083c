"""test_paddle - PaddlePaddle distributed checkpoints mounted as they lie
(issue 13, SPEC 7).

The store holds, next to a shardfs/1 checkpoint:
- the checkpoints paddle 3.3.1 wrote (test/fixtures/paddle/paddle-*, made
  by test/interop/make_paddle_fixtures.py; committed): one process with
  every dtype, two generations in one directory, safetensors data files,
  2 ranks sharded and replicated (with and without save_replicas), 4 ranks
  of flattened ranges;
- paddle_hostile.py's variants of the 2-rank checkpoint.

Checked through one mount: every tensor's bytes against the xxh3 of the
array handed to paddle (test/interop/check_dcp_tree.py), model.safetensors
and npy/ against tensors/, random slices against numpy, the synthesized
manifest.json, the format and verified xattrs, a root file; every change
fails with EROFS and `shardctl rm` refuses; hostile inputs (a global
outside the allowlist in the metadata or in a .distcp, storage paths that
lead out, a symlink out, a short .distcp, an array whose shape or dtype
disagrees with the metadata, torn metadata, an array pickled as an
escaped protocol-0 STRING) leave out that checkpoint or
those tensors with a log line and never serve a byte from outside; a save
still running (no metadata, or paddle's .lock) is not shown; a Fortran-order
array is served right; a tensor stored one element per data file (26
files) is served right. The store is byte-for-byte unchanged at the end.
"""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys

import sfmount as sm
from test_dcp import check_readonly, check_views

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "paddle")
PY = "/usr/bin/python3"


def run(argv, timeout=300):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def collect(store, cases):
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "paddle-*"))):
        ver = os.path.basename(vdir)
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            name = "%s-%s" % (ver, os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            cases.append((name, exp))


def check_tree(ck, root, exp, label):
    rc, out, err = run([PY, os.path.join(INTEROP, "check_dcp_tree.py"), root, exp])
    ck.eq(rc, 0, "%s: check_dcp_tree: %s%s" % (label, out[-3000:], err[-2000:]))


def check_manifest(ck, root, label, exp):
    man = sm.manifest_of(root)
    ck.eq(man.get("format"), "paddle-dcp", "%s: manifest.json names the format" % label)
    ck.eq(sorted(man.get("tensors", {})), sorted(exp["tensors"]),
          "%s: manifest.json lists every tensor" % label)
    ck.ok('"xxh3"' not in json.dumps(man), "%s: no checksums in the manifest" % label)
    for n, t in man.get("tensors", {}).items():
        for s in t.get("shards", []):
            ck.ok(s.get("file", "").endswith((".distcp", ".safetensors")),
                  "%s: %s shard points into paddle's data file: %r"
                  % (label, n, s.get("file")))


def expected_bytes(exp, name, raw):
    return (len(raw) == exp["tensors"][name]["nbytes"] and
            "%016x" % sm_xxh3(raw) == exp["tensors"][name]["xxh3"])


def sm_xxh3(b):
    import xxhash
    return xxhash.xxh3_64_intdigest(b)


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    outside = env.path("outside")
    cases = []
    collect(store, cases)
    ck.ok(len(cases) >= 5, "paddle fixtures found in %s" % FIXTURES)
    shard2 = [exp for name, exp in cases if name.endswith("-shard2")][0]
    hostile = env.path("hostile")
    os.makedirs(hostile)
    rc, out, err = run([PY, os.path.join(HERE, "paddle_hostile.py"),
                        shard2[:-len(".expected.json")], hostile, outside])
    ck.eq(rc, 0, "paddle_hostile.py ran: %s" % err[-2000:])
    hinfo = json.loads(out) if rc == 0 else {"victim": "rows", "in_file0": ["rows"]}
    for d in sorted(os.listdir(hostile)):
        shutil.move(os.path.join(hostile, d), os.path.join(store, "h-" + d))
    with open(shard2) as f:
        exp2 = json.load(f)
    # a root file beside paddle's own files, and a subdirectory
    first = cases[0][0]
    with open(os.path.join(store, first, "config.json"), "w") as f:
        f.write('{"hidden_size": 8}\n')
    os.makedirs(os.path.join(store, first, "sub"))
    env.gen(os.path.join(store, "native"), layout="mixed", ranks=2, size="128K",
            ref=False)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, exp in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            with open(exp) as f:
                expected = json.load(f)
            check_tree(ck, root, exp, name)
            ck.eq(os.getxattr(root, "user.shardfs.format").decode(), "paddle-dcp",
                  "%s: format xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
                  "%s: verified xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.state").decode(), "committed",
                  "%s: state" % name)
            check_views(env, ck, root, name)
            check_manifest(ck, root, name, expected)
        root = os.path.join(mnt, first)
        ck.eq(sm.read_file(os.path.join(root, "config.json")),
              b'{"hidden_size": 8}\n', "%s: root file config.json" % first)
        ck.ok(not os.path.exists(os.path.join(root, "sub")),
              "%s: a subdirectory is not shown" % first)
        ck.ok(not any(n.endswith((".distcp", ".metadata")) for n in os.listdir(root)),
              "%s: paddle's own files are not root files" % first)
        check_readonly(env, ck, mnt, first)
        gens = [n for n, _ in cases if n.endswith("-gens")]
        for n in gens:
            ck.ok(not any(n2 == "b" for n2 in os.listdir(os.path.join(mnt, n, "tensors"))),
                  "%s: the older save's tensor b is not shown" % n)

        log = m.log_text().splitlines()
        ck.ok(any('gens": paddle save 1 shown' in l for l in log),
              "the log says which generation is shown")
        # hostile variants
        victim, in_file0 = hinfo["victim"], set(hinfo["in_file0"])
        gone = {"escape": {victim}, "abs": {victim}, "shape": {victim},
                "dtype": {victim}, "symlink": in_file0, "short": in_file0,
                "evil-distcp": in_file0, "good": set(), "fortran": set(),
                "old": set(), "escaped": {victim}, "wide": set()}
        for bad, left_out in sorted(gone.items()):
            root = os.path.join(mnt, "h-" + bad)
            if not ck.ok(os.path.isdir(root), "h-%s is mounted" % bad):
                continue
            shown = set(os.listdir(os.path.join(root, "tensors")))
            ck.eq(shown, set(exp2["tensors"]) - left_out,
                  "h-%s: the tensors shown" % bad)
            for n in sorted(left_out):
                ck.ok(any('checkpoint "h-%s": "%s" left out' % (bad, n) in l for l in log),
                      "h-%s: a log line says why %s is left out" % (bad, n))
            for n in sorted(shown):
                raw = sm.read_file(sm.tensor_path(root, n))
                ck.ok(expected_bytes(exp2, n, raw), "h-%s: %s served right" % (bad, n))
        # issue 30: an array whose data is an escaped protocol-0 STRING is
        # never served from the escaped text: left out with one line
        ck.eq(len([l for l in log if 'checkpoint "h-escaped": "%s" left out' % victim in l
                   and "escaped protocol-0 string" in l]), 1,
              "h-escaped: one log line says the escaped STRING is not served")
        ck.ok(any("h-evil-distcp" in l and "posix.system" in l for l in log),
              "the log names the global refused in a .distcp")
        for bad in ("evil-global", "torn"):
            ck.ok("h-" + bad not in os.listdir(mnt), "h-%s is left out" % bad)
            ck.eq(len([l for l in log if '"h-%s" left out' % bad in l]), 1,
                  "one log line says h-%s was left out" % bad)
        ck.ok(any("h-evil-global" in l and "posix.system" in l for l in log),
              "the log names the refused global")
        for bad in ("partial", "locked"):
            ck.ok("h-" + bad not in os.listdir(mnt), "h-%s is not shown" % bad)
            ck.ok(any('"h-%s" skipped' % bad in l and "still being written" in l
                      for l in log), "h-%s's skip is logged" % bad)
        ck.ok(any('checkpoint "h-old": "%s": metadata without dtype and global shape' % victim
                  in l for l in log), "h-old: the log says dtype and shape were derived")
        root = os.path.join(mnt, "h-old")
        for n, e in exp2["tensors"].items():
            if os.path.exists(sm.tensor_path(root, n)):
                ck.eq((os.getxattr(sm.tensor_path(root, n), "user.shardfs.dtype").decode(),
                       json.loads(os.getxattr(sm.tensor_path(root, n), "user.shardfs.shape"))),
                      (e["dtype"], e["shape"]), "h-old: %s dtype and shape derived" % n)
        man = sm.manifest_of(os.path.join(mnt, "h-fortran"))
        ck.ok(any(s.get("strides") for s in man["tensors"][victim]["shards"]),
              "h-fortran: the Fortran-order chunk is read through strides")
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.format").decode(),
              "shardfs/1", "native: format xattr")
        ck.raises(errno.EROFS, lambda: os.unlink(os.path.join(mnt, "h-good", "tensors", "plain")),
                  "h-good: unlink a tensor")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount and every attempt to change it")


if __name__ == "__main__":
    sys.exit(sm.main(test))
