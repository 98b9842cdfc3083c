"""test_dcp - PyTorch DCP checkpoints mounted as they lie (issue 11, SPEC 7).

The store holds, next to a shardfs/1 checkpoint:
- the DCP checkpoints torch 2.x wrote (test/fixtures/dcp/torch-2.*, made by
  test/interop/make_dcp_fixtures.py with PyPI's torch; committed),
- the same script's checkpoints written here, now, by Debian's torch 1.13,
- dcp_hostile.py's real 1.13 checkpoint and its hostile variants.

Checked through one mount: every tensor's bytes against the xxh3 of the
original tensor (test/interop/check_dcp_tree.py), objects/ loaded back by
torch.load, model.safetensors and npy/ against tensors/, random slices
against numpy, the synthesized manifest.json, the format and verified
xattrs, root files; every change fails with EROFS and `shardctl rm`
refuses with its reason; hostile metadata (a global outside the allowlist,
chunk paths that lead out, symlinks, short and junk chunks, torn metadata)
leaves out that checkpoint or that tensor with a log line and never
serves a byte from outside; a DCP save still running (no .metadata) is
not shown. The store is byte-for-byte unchanged at the end.
"""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "dcp")
PY = "/usr/bin/python3"


def run(argv, timeout=600):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")


def collect(root, prefix, store, cases):
    """Copy every checkpoint under root/torch-*/NAME (with NAME.expected.json)
    into store as PREFIX-VERSION-NAME; append (name, expected, version)."""
    for vdir in sorted(glob.glob(os.path.join(root, "torch-*"))):
        ver = os.path.basename(vdir)
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            if not os.path.isdir(src):
                continue
            name = "%s%s-%s" % (prefix, ver, os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            cases.append((name, exp, ver))


def parse_st(buf):
    header, start = sm.parse_safetensors(buf)
    return header, start


def check_views(env, ck, root, label):
    """model.safetensors, npy/ and random slices against tensors/."""
    names = []
    for dp, _, fns in os.walk(os.path.join(root, "tensors")):
        for f in fns:
            names.append(os.path.relpath(os.path.join(dp, f),
                                         os.path.join(root, "tensors")))
    st = sm.read_file(os.path.join(root, "model.safetensors"))
    header, start = parse_st(st)
    ck.eq(sorted(header), sorted(names), "%s: model.safetensors lists tensors/" % label)
    for n in sorted(names):
        raw = sm.read_file(sm.tensor_path(root, n))
        h = header.get(n)
        if h is None:
            continue
        a, b = h["data_offsets"]
        ck.bytes_eq(st[start + a:start + b], raw,
                    "%s: model.safetensors %s" % (label, n))
        dt = os.getxattr(sm.tensor_path(root, n), "user.shardfs.dtype").decode()
        shape = json.loads(os.getxattr(sm.tensor_path(root, n),
                                       "user.shardfs.shape"))
        ck.eq((h["dtype"], h["shape"]), (dt, shape),
              "%s: %s dtype and shape in safetensors and xattrs" % (label, n))
        npy = sm.npy_path(root, n)
        if sm.DTYPES[dt][1] is not None:
            arr = np.load(npy)
            ck.bytes_eq(np.ascontiguousarray(arr).tobytes(), raw,
                        "%s: npy/%s.npy" % (label, n))
        if len(shape) >= 1 and all(shape):
            isz = sm.DTYPES[dt][0]
            whole = np.frombuffer(raw, dtype=sm.UINT_OF_SIZE[isz]).reshape(shape)
            dims = [sm.random_dim(env.rng, d) for d in shape]
            spec = ",".join(t for t, _ in dims)
            want = whole[tuple(s for _, s in dims)]
            got = sm.read_file(sm.tensor_path(root, n, spec))
            ck.bytes_eq(got, np.ascontiguousarray(want).tobytes(),
                        "%s: slice %s@%s" % (label, n, spec))


def check_manifest(ck, root, label, exp):
    man = sm.manifest_of(root)
    ck.ok(str(man.get("format", "")).startswith("torch-dcp"),
          "%s: manifest.json names the format: %r" % (label, man.get("format")))
    ck.eq(sorted(man.get("tensors", {})), sorted(exp["tensors"]),
          "%s: manifest.json lists every tensor" % label)
    text = json.dumps(man)
    ck.ok('"xxh3"' not in text, "%s: no checksums in a DCP manifest" % label)
    for n, t in man.get("tensors", {}).items():
        for s in t.get("shards", []):
            ck.ok(s.get("file", "").endswith(".distcp"),
                  "%s: %s shard points into a .distcp file: %r" % (label, n, s.get("file")))
            break


def check_readonly(env, ck, mnt, name):
    root = os.path.join(mnt, name)
    tdir = os.path.join(root, "tensors")
    some = sorted(os.listdir(tdir))[0]
    ck.raises(errno.EROFS, lambda: open(os.path.join(root, "new.txt"), "w"),
              "%s: create a root file" % name)
    ck.raises(errno.EROFS, lambda: open(os.path.join(tdir, "new"), "w"),
              "%s: create a tensor" % name)
    ck.raises(errno.EROFS, lambda: os.mkdir(os.path.join(tdir, "d")),
              "%s: mkdir in tensors/" % name)
    ck.raises(errno.EROFS, lambda: open(os.path.join(tdir, some), "r+b"),
              "%s: open a tensor for writing" % name)
    ck.raises(errno.EROFS, lambda: os.unlink(os.path.join(tdir, some)),
              "%s: unlink a tensor" % name)
    ck.raises(errno.EROFS, lambda: os.rename(os.path.join(tdir, some),
                                              os.path.join(tdir, some + "x")),
              "%s: rename a tensor" % name)
    ck.raises(errno.EROFS, lambda: os.setxattr(root, "user.shardfs.commit", b"1"),
              "%s: commit" % name)
    ck.raises((errno.EROFS,), lambda: os.setxattr(mnt, "user.shardfs.delete",
                                                  name.encode()),
              "%s: delete by xattr" % name)
    r = env.shardctl_run("rm", root, check=False)
    ck.ok(r.returncode != 0 and b"only reads" in r.stderr,
          "%s: shardctl rm refuses and says why: %r" % (name, r.stderr))
    ck.ok(os.path.isdir(root), "%s: still mounted after the attempts" % name)


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    outside = env.path("outside")
    cases = []
    # torch 2.x: committed fixtures
    collect(FIXTURES, "", store, cases)
    ck.ok(any(not v.startswith("torch-1.") for _, _, v in cases),
          "torch 2.x fixtures found in %s" % FIXTURES)
    # torch 1.13: written now by Debian's torch
    gen = env.path("gen113")
    # torch 1.13's gloo sometimes aborts a rank while the process group is
    # torn down ("terminate called without an active exception", SIGABRT,
    # seen once in ~30 CI runs here): that is torch's teardown, not the
    # files; write them again, up to 3 times, each from scratch.
    for attempt in range(3):
        shutil.rmtree(gen, ignore_errors=True)
        rc, out, err = run([PY, os.path.join(INTEROP, "make_dcp_fixtures.py"), gen])
        if rc == 0 or "terminate called without an active exception" not in err:
            break
        print("torch 1.13's writer aborted in gloo teardown (attempt %d); again"
              % (attempt + 1))
    ck.eq(rc, 0, "torch 1.13 wrote its fixtures: %s" % err[-2000:])
    n0 = len(cases)
    collect(gen, "", store, cases)
    ck.ok(len(cases) > n0, "torch 1.13 fixtures collected")
    # hostile variants of a real 1.13 checkpoint
    hostile = env.path("hostile")
    os.makedirs(hostile)
    rc, out, err = run([PY, os.path.join(HERE, "dcp_hostile.py"), hostile, outside])
    ck.eq(rc, 0, "dcp_hostile.py ran: %s" % err[-2000:])
    hinfo = json.loads(out) if rc == 0 else {"tensors": {}, "objects": [], "victim": "w"}
    for d in sorted(os.listdir(hostile)):
        shutil.move(os.path.join(hostile, d), os.path.join(store, "h-" + d))
    # a root file beside a DCP checkpoint's own files, and a subdirectory
    first = cases[0][0] if cases else None
    if first:
        with open(os.path.join(store, first, "config.json"), "w") as f:
            f.write('{"hidden_size": 8}\n')
        os.makedirs(os.path.join(store, first, "sub"))
    # and a shardfs/1 checkpoint next to them
    env.gen(os.path.join(store, "native"), layout="mixed", ranks=2, size="128K",
            ref=False)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, exp, ver in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            with open(exp) as f:
                expected = json.load(f)
            argv = [PY, os.path.join(INTEROP, "check_dcp_tree.py"), root, exp,
                    "--torch-load"]
            rc, out, err = run(argv)
            ck.eq(rc, 0, "%s: check_dcp_tree: %s%s" % (name, out[-3000:], err[-2000:]))
            fmt = os.getxattr(root, "user.shardfs.format").decode()
            ck.ok(fmt.startswith("torch-dcp"), "%s: format xattr %r" % (name, fmt))
            if ver.startswith("torch-1."):
                ck.ok("1.13" in fmt, "%s: format says torch 1.13: %r" % (name, fmt))
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
                  "%s: verified xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.state").decode(), "committed",
                  "%s: state" % name)
            check_views(env, ck, root, name)
            check_manifest(ck, root, name, expected)
        if first:
            root = os.path.join(mnt, first)
            ck.eq(sm.read_file(os.path.join(root, "config.json")),
                  b'{"hidden_size": 8}\n', "%s: root file config.json" % first)
            ck.ok(not os.path.exists(os.path.join(root, "sub")),
                  "%s: a subdirectory is not shown" % first)
            ck.ok(not any(n.endswith(".distcp") or n == ".metadata"
                          for n in os.listdir(root)),
                  "%s: DCP's own files are not root files" % first)
            check_readonly(env, ck, mnt, first)

        # hostile variants
        log = m.log_text()
        good = os.path.join(mnt, "h-good")
        if ck.ok(os.path.isdir(good), "h-good is mounted"):
            for n, (dt, shape, hx) in hinfo["tensors"].items():
                ck.bytes_eq(sm.read_file(sm.tensor_path(good, n)), bytes.fromhex(hx),
                            "h-good: %s" % n)
        for bad in ("evil-global", "torn"):
            ck.ok("h-" + bad not in os.listdir(mnt), "h-%s is left out" % bad)
            ck.eq(len([l for l in log.splitlines()
                       if '"h-%s" left out' % bad in l]), 1,
                  "one log line says h-%s was left out" % bad)
        ck.ok(any("h-evil-global" in l and "posix" in l for l in log.splitlines()),
              "the log names the refused global")
        ck.ok("h-partial" not in os.listdir(mnt), "h-partial (no .metadata) is not shown")
        ck.ok(any('"h-partial" skipped' in l and "still being written" in l
                  for l in log.splitlines()), "h-partial's skip is logged")
        victim = hinfo["victim"]
        for bad in ("escape", "abs", "symlink", "short", "junkchunk"):
            root = os.path.join(mnt, "h-" + bad)
            if not ck.ok(os.path.isdir(root), "h-%s is mounted without its bad chunk" % bad):
                continue
            ck.ok(not os.path.exists(sm.tensor_path(root, victim)),
                  "h-%s: %s is left out" % (bad, victim))
            ck.ok(any("h-%s" % bad in l and '"%s" left out' % victim in l
                      for l in log.splitlines()),
                  "h-%s: a log line says why %s is left out" % (bad, victim))
            for n, (dt, shape, hx) in hinfo["tensors"].items():
                if n != victim:
                    ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)),
                                bytes.fromhex(hx), "h-%s: %s still served" % (bad, n))
        # issue 30: a chunk archive holding two data.pkl leaves its tensor
        # out, with one line saying so
        ck.eq(len([l for l in log.splitlines() if "h-twopkl" in l and
                   '"%s" left out' % victim in l and "more than one data.pkl" in l]), 1,
              "h-twopkl: one log line says why %s is left out" % victim)
        root = os.path.join(mnt, "h-twopkl")
        if ck.ok(os.path.isdir(root), "h-twopkl is mounted without its bad chunk"):
            ck.ok(not os.path.exists(sm.tensor_path(root, victim)),
                  "h-twopkl: %s is left out" % victim)
            for n, (dt, shape, hx) in hinfo["tensors"].items():
                if n != victim:
                    ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)),
                                bytes.fromhex(hx), "h-twopkl: %s still served" % n)
        # the native checkpoint is unaffected
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.format").decode(),
              "shardfs/1", "native: format xattr")
        ck.eq(os.getxattr(os.path.join(mnt, "native"), "user.shardfs.verified").decode(),
              "yes", "native: verified xattr")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount and every attempt to change it")


if __name__ == "__main__":
    sys.exit(sm.main(test))
