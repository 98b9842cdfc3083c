#!/usr/bin/python3
"""Mount test of batched declarations (issue 12, item 6): many tensors of a
checkpoint being written declared by one setxattr of user.shardfs.declare
on its tensors/ directory (or the checkpoint directory), a JSON object
{"NAME": {"dtype": D, "shape": [..]}, ...}. One daemon, empty store.

1. Two checkpoints get the same random tensors (nested names, a 0-d one,
   several dtypes, 1,200 small ones in one value of about 60 KB): "each"
   declared one by one as SPEC 4 says (create, dtype and shape xattrs),
   "batch" in batches (some on tensors/, some on the checkpoint). Before
   any write, both list the same names, sizes, dtype and shape xattrs; then
   the same box and flat writes, commit, and both read back equal to the
   numpy reference, with manifests naming the same tensors, dtypes and
   shapes.
2. Refusals, each EINVAL (E2BIG past 64 KiB) with nothing declared (the
   listing and every declared xattr unchanged) and a log line naming the
   checkpoint: not JSON, not an object, a duplicate name, a member with a
   key missing or one too many, an unknown dtype, a negative or non-integer
   size, 17 dimensions, a shape whose bytes overflow, names with '@', an
   empty or ".." component, a control character, a component of 256 bytes,
   a name declared differently before, a root file's name, a name below a
   tensor, a directory's name; on a tensor file and on tensors/a (not the
   checkpoint or tensors/).
3. Agreeing again is fine (idempotent); a batch whose members clash with
   each other ("d" and "d/e") declares the first and refuses the second,
   as one-by-one declarations would.
4. A committed checkpoint refuses with EROFS; an unprivileged user on an
   allow_other mount gets EACCES/EPERM and the store does not change.
"""

import errno
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sfmount as sm  # noqa: E402

XA = "user.shardfs.declare"
NOBODY = 65534
NP = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "U8": "u1", "F16": "<f2", "I32": "<i4"}


def setx(path, value):
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    if isinstance(value, str):
        value = value.encode()
    os.setxattr(path, XA, value)


def tensors(rng):
    """{name: (dtype, shape)}: a few of every kind, then 1,200 tiny ones."""
    out = {"emb": ("F32", [13, 7]), "layers/0/wq": ("F16", [8, 6]),
           "layers/0/b": ("I64", [5]), "layers/1/wq": ("F64", [4, 4, 3]),
           "step": ("I32", []), "mask": ("U8", [3, 0, 2])}
    for i in range(1200):
        out["small/t%04d" % i] = ("F32", [2, int(rng.integers(1, 4))])
    return out


def listing(root):
    """{relative path under tensors/: (size, dtype, shape)} of every file."""
    out = {}
    top = os.path.join(root, "tensors")
    for dp, _, fns in os.walk(top):
        for f in fns:
            p = os.path.join(dp, f)
            out[os.path.relpath(p, top)] = (
                os.stat(p).st_size, os.getxattr(p, "user.shardfs.dtype"),
                os.getxattr(p, "user.shardfs.shape"))
    return out


def declare_each(root, decls):
    for name, (dt, shape) in decls.items():
        p = os.path.join(root, "tensors", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        os.setxattr(p, "user.shardfs.dtype", dt.encode())
        os.setxattr(p, "user.shardfs.shape", json.dumps(shape).encode())


def declare_batch(ck, root, decls):
    names = list(decls)
    big = {n: {"dtype": decls[n][0], "shape": decls[n][1]} for n in names if n.startswith("small/")}
    rest = [n for n in names if not n.startswith("small/")]
    value = json.dumps(big).encode()
    ck.ok(50000 < len(value) <= 65536, "one value of %d bytes declares 1,200 tensors" % len(value))
    setx(os.path.join(root, "tensors"), value)
    setx(os.path.join(root, "tensors"), {n: {"dtype": decls[n][0], "shape": decls[n][1]}
                                         for n in rest[:3]})
    setx(root, {n: {"dtype": decls[n][0], "shape": decls[n][1]} for n in rest[3:]})


def write_all(root, decls, ref):
    """Boxes of 2 rows (tensors of 2+ dims), flat halves (the rest)."""
    for name, (dt, shape) in decls.items():
        a = ref[name]
        p = os.path.join(root, "tensors", name)
        if len(shape) >= 2 and shape[0] > 0:
            for r0 in range(0, shape[0], 2):
                r1 = min(shape[0], r0 + 2)
                spec = ",".join(["%d:%d" % (r0, r1)] + [":"] * (len(shape) - 1))
                with open(p + "@" + spec, "wb") as f:
                    f.write(a[r0:r1].tobytes())
        else:
            b = a.tobytes()
            if not b:
                continue
            h = len(b) // 2
            fd = os.open(p, os.O_WRONLY)
            try:
                os.pwrite(fd, b[h:], h)
                os.pwrite(fd, b[:h], 0)
            finally:
                os.close(fd)


def refusals(env, ck, m, root):
    t = os.path.join(root, "tensors")
    before = listing(root)
    cases = [
        ("not JSON", b'{"x": ', errno.EINVAL),
        ("not an object", b'[1, 2]', errno.EINVAL),
        ("duplicate name", b'{"x": {"dtype": "F32", "shape": [1]}, "x": {"dtype": "F32", "shape": [1]}}',
         errno.EINVAL),
        ("missing shape", {"x": {"dtype": "F32"}}, errno.EINVAL),
        ("extra key", {"x": {"dtype": "F32", "shape": [1], "offsets": [0]}}, errno.EINVAL),
        ("member not an object", {"x": ["F32", [1]]}, errno.EINVAL),
        ("unknown dtype", {"x": {"dtype": "F99", "shape": [1]}}, errno.EINVAL),
        ("negative size", {"x": {"dtype": "F32", "shape": [-1]}}, errno.EINVAL),
        ("non-integer size", {"x": {"dtype": "F32", "shape": [1.5]}}, errno.EINVAL),
        ("17 dimensions", {"x": {"dtype": "F32", "shape": [1] * 17}}, errno.EINVAL),
        ("bytes overflow", {"x": {"dtype": "F64", "shape": [1 << 62, 4]}}, errno.EINVAL),
        ("'@' in a name", {"x@0:1": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("empty component", {"a//b": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("'..' component", {"../x": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("control character", {"x\ny": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("256-byte component", {"d/" + "n" * 256: {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("declared differently", {"emb": {"dtype": "F32", "shape": [13, 8]}}, errno.EINVAL),
        ("a root file's name", {"config.json": {"dtype": "U8", "shape": [4]}}, errno.EINVAL),
        ("below a tensor", {"emb/x": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("a directory's name", {"layers/0": {"dtype": "F32", "shape": [1]}}, errno.EINVAL),
        ("value past 64 KiB", b"{" + b" " * 70000 + b"}", errno.E2BIG),
    ]
    for label, value, want in cases:
        # a good member first: nothing of a refused batch is declared
        if isinstance(value, dict):
            value = dict([("fresh/ok", {"dtype": "F32", "shape": [2]})] + list(value.items()))
        ck.raises([want], lambda v=value: setx(t, v), "refused: %s" % label)
    ck.raises([errno.EINVAL], lambda: setx(os.path.join(t, "emb"), {"q": {"dtype": "F32", "shape": [1]}}),
              "refused on a tensor file")
    ck.raises([errno.EINVAL], lambda: setx(os.path.join(t, "layers"), {"q": {"dtype": "F32", "shape": [1]}}),
              "refused on a directory below tensors/")
    ck.eq(listing(root), before, "refused batches declared nothing")
    ck.ok(not os.path.exists(os.path.join(t, "fresh")), "no node of a refused batch")
    # one line per refusal, each call site rate-limited (SF_LOG_BURST)
    log = m.log_text()
    ck.ok(log.count('checkpoint "batch": user.shardfs.declare') >= 10,
          "a log line per refusal (%d)" % log.count("user.shardfs.declare"))
    ck.ok('"x": unknown dtype' in log and "not a JSON object" in log,
          "log lines name the tensor and say why")
    # agreeing again is fine; members clashing with each other stop at the second
    setx(t, {"emb": {"dtype": "F32", "shape": [13, 7]}})
    ck.eq(listing(root), before, "an agreeing batch changes nothing")
    ck.raises([errno.EINVAL], lambda: setx(t, {"d": {"dtype": "F32", "shape": [1]},
                                               "d/e": {"dtype": "F32", "shape": [1]}}),
              "a batch with d and d/e is refused at d/e")
    ck.eq(os.getxattr(os.path.join(t, "d"), "user.shardfs.shape"), b"[1]",
          "d (before the clash) stays declared")
    ck.ok(not os.path.exists(os.path.join(t, "d", "e")), "d/e is not declared")
    with open(os.path.join(t, "d"), "wb") as f:
        f.write(b"\0" * 4)


def run(env, ck):
    rng = np.random.default_rng(env.seed)
    decls = tensors(rng)
    ref = {}
    for name, (dt, shape) in decls.items():
        ref[name] = (rng.integers(0, 255, size=int(np.prod(shape)) * np.dtype(NP[dt]).itemsize,
                                  dtype=np.uint8).view(NP[dt]).reshape(shape))
    store = env.path("store")
    os.makedirs(store)
    os.chmod(env.tmp, 0o755)
    with sm.Mount(env, store, ["-o", "allow_other"]) as m:
        roots = {k: os.path.join(m.mnt, k) for k in ("each", "batch")}
        for r in roots.values():
            os.makedirs(os.path.join(r, "tensors"), exist_ok=True)
        with open(os.path.join(roots["batch"], "config.json"), "wb") as f:
            f.write(b"{}")
        declare_each(roots["each"], decls)
        declare_batch(ck, roots["batch"], decls)
        ck.eq(listing(roots["batch"]), listing(roots["each"]),
              "declared in batches = declared one by one (names, sizes, xattrs)")
        refusals(env, ck, m, roots["batch"])
        # an unprivileged user changes nothing
        snap = sm.store_snapshot(store)
        r = subprocess.run(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
             "/usr/bin/python3", os.path.join(HERE, "userops.py")],
            input=json.dumps([["setxattr", os.path.join(roots["batch"], "tensors"), XA,
                               json.dumps({"z": {"dtype": "F32", "shape": [1]}})]]).encode(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        res = json.loads(r.stdout) if r.returncode == 0 else [{"errno": "?"}]
        ck.ok(res[0].get("errno") in ("EACCES", "EPERM"),
              "nobody on an allow_other mount: %s" % res[0])
        ck.eq(sm.store_snapshot(store), snap, "the store is unchanged after nobody's try")
        for r_ in roots.values():
            write_all(r_, decls, ref)
            os.setxattr(r_, "user.shardfs.commit", b"1")
        mans = {}
        for k, r_ in roots.items():
            ck.eq(os.getxattr(r_, "user.shardfs.state"), b"committed", "%s committed" % k)
            for name in decls:
                got = sm.read_file(os.path.join(r_, "tensors", name))
                ck.ok(got == ref[name].tobytes(), "%s: %s reads back" % (k, name))
            man = json.load(open(os.path.join(r_, "manifest.json")))
            mans[k] = {n: (t["dtype"], t["shape"]) for n, t in man["tensors"].items()}
        extra = {"d": ("F32", [1])}
        ck.eq(mans["batch"], dict({n: (d, s) for n, (d, s) in decls.items()}, **extra),
              "the batch manifest names every tensor with its dtype and shape")
        ck.eq({n: v for n, v in mans["batch"].items() if n != "d"}, mans["each"],
              "both manifests agree")
        ck.raises([errno.EROFS], lambda: setx(os.path.join(roots["each"], "tensors"),
                                              {"z": {"dtype": "F32", "shape": [1]}}),
                  "a committed checkpoint refuses (EROFS)")


if __name__ == "__main__":
    sys.exit(sm.main(run))
