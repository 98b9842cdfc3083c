"""check_dcp_tree - a mounted DCP checkpoint against what torch was given.

    /usr/bin/python3 check_dcp_tree.py MOUNTED_CKPT EXPECTED_JSON [--torch-load] [--no-xattrs]
    /usr/bin/python3 check_dcp_tree.py --selftest
    PYTHON check_dcp_tree.py --materialize DCP_CKPT OUT_TREE

EXPECTED_JSON is what make_dcp_fixtures.py wrote beside the checkpoint.
Checks that MOUNTED_CKPT/tensors/KEY exists for every expected tensor with
its size and the xxh3 of the original tensor's bytes, and (unless
--no-xattrs) the user.shardfs.dtype and user.shardfs.shape xattrs; that
tensors/ holds nothing else; that objects/KEY exists (and is not empty)
for every expected object and nothing else is there, and (--torch-load)
that torch.load of it gives a value whose repr is the original's. One line
per mismatch, a summary; exit 1 on any mismatch, 2 on bad usage or an
unreadable EXPECTED_JSON.

--selftest builds trees in a temporary directory from the in-memory
tensors of make_dcp_fixtures.py (the interpreter's torch, 1.13 for
/usr/bin/python3), checks that a right tree passes and that damaged ones
(a flipped byte, a short file, storage-order bytes of the transposed view,
a missing or extra tensor, wrong xattrs, a missing, extra or changed
object) each fail; exit 0 only if all of that holds.

--materialize writes the tree shardfs should show for a DCP checkpoint
without shardfs: tensors/KEY read back whole with torch's own loader (with
dtype and shape xattrs), objects/KEY the bytes stored for each non-tensor
item, cut out of its .distcp where .metadata says. PYTHON's torch must
read that checkpoint (the venv's torch 2.x for torch-2.* fixtures).
Checking the result shows the files and their expected.json agree.

Needs xxhash (python3-xxhash); torch only for --torch-load, --selftest and
--materialize.
"""

import inspect
import json
import os
import shutil
import sys
import tempfile

import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 1 << 20


def listing(top):
    """Relative '/'-separated paths of the files under top."""
    out = set()
    for dp, _, fns in os.walk(top):
        for f in fns:
            out.add(os.path.relpath(os.path.join(dp, f), top).replace(os.sep, "/"))
    return out


def xxh3_file(path):
    h = xxhash.xxh3_64()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
            n += len(b)
    return n, "%016x" % h.intdigest()


def torch_load(path):
    import torch
    kw = {"map_location": "cpu"}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kw["weights_only"] = False  # objects are arbitrary pickled values
    return torch.load(path, **kw)


def check_tree(root, exp, with_torch_load=False, xattrs=True):
    """(number of checks passed, list of mismatch lines)."""
    bad, good = [], 0
    tdir = os.path.join(root, "tensors")
    odir = os.path.join(root, "objects")
    got = listing(tdir) if os.path.isdir(tdir) else set()
    for k, e in sorted(exp["tensors"].items()):
        p = os.path.join(tdir, k)
        if k not in got:
            bad.append("tensor %s: missing" % k)
            continue
        try:
            size = os.stat(p).st_size
            n, h = xxh3_file(p)
        except OSError as ex:
            bad.append("tensor %s: read failed: %s" % (k, ex))
            continue
        checks = [("size", size, e["nbytes"]), ("bytes read", n, e["nbytes"]),
                  ("xxh3", h, e["xxh3"])]
        if xattrs:
            try:
                dt = os.getxattr(p, "user.shardfs.dtype").decode()
                shape = json.loads(os.getxattr(p, "user.shardfs.shape"))
            except (OSError, ValueError) as ex:
                bad.append("tensor %s: xattrs: %s" % (k, ex))
            else:
                checks += [("dtype", dt, e["dtype"]), ("shape", shape, e["shape"])]
        for what, g, w in checks:
            if g != w:
                bad.append("tensor %s: %s %r, want %r" % (k, what, g, w))
            else:
                good += 1
    for k in sorted(got - set(exp["tensors"])):
        bad.append("tensor %s: not expected" % k)
    gobj = listing(odir) if os.path.isdir(odir) else set()
    for k in sorted(set(exp["objects"]) - gobj):
        bad.append("object %s: missing" % k)
    for k in sorted(gobj - set(exp["objects"])):
        bad.append("object %s: not expected" % k)
    for k in sorted(gobj & set(exp["objects"])):
        p = os.path.join(odir, k)
        if os.stat(p).st_size == 0:
            bad.append("object %s: empty" % k)
            continue
        good += 1
        if not with_torch_load:
            continue
        try:
            r = repr(torch_load(p))
        except Exception as ex:  # whatever torch.load raises: report, go on
            bad.append("object %s: torch.load failed: %s: %s"
                       % (k, type(ex).__name__, str(ex).splitlines()[:1]))
            continue
        if r != exp["objects"][k]["repr"]:
            bad.append("object %s: %s, want %s" % (k, r, exp["objects"][k]["repr"]))
        else:
            good += 1
    return good, bad


def run_check(root, exp_path, with_torch_load, xattrs):
    try:
        with open(exp_path) as f:
            exp = json.load(f)
        exp["tensors"], exp["objects"]  # noqa: B018 (both must be there)
    except (OSError, ValueError, KeyError) as ex:
        print("check_dcp_tree: %s: %r" % (exp_path, ex))
        return 2
    good, bad = check_tree(root, exp, with_torch_load, xattrs)
    for b in bad:
        print("MISMATCH", b)
    print("%s: %d tensors, %d objects expected; %d checks passed, %d mismatches"
          % (root, len(exp["tensors"]), len(exp["objects"]), good, len(bad)))
    return 1 if bad else 0


# ------------------------------------------------------------ building trees

def write_tree(root, items):
    """tensors/KEY (row-major bytes, dtype and shape xattrs) and objects/KEY
    (torch.save of the value; bytes given as such are written as they are)."""
    import torch
    import make_dcp_fixtures as mk
    for k, v in items.items():
        sub = "tensors" if isinstance(v, torch.Tensor) else "objects"
        p = os.path.join(root, sub, k)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            if isinstance(v, torch.Tensor):
                f.write(mk.tensor_bytes(v))
            elif isinstance(v, (bytes, bytearray)):
                f.write(v)
            else:
                torch.save(v, f)
        if sub == "tensors":
            os.setxattr(p, "user.shardfs.dtype", mk.DT[v.dtype].encode())
            os.setxattr(p, "user.shardfs.shape", json.dumps(list(v.shape)).encode())


def selftest():
    sys.path.insert(0, HERE)
    import torch
    import make_dcp_fixtures as mk
    failures = []

    def expect(what, res, want_bad):
        good, bad = res
        ok = bool(bad) == want_bad
        print("selftest: %-44s %s (%d passed, %d mismatches%s)"
              % (what, "ok" if ok else "FAILED", good, len(bad),
                 (": " + bad[0]) if bad else ""))
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        cases = {"single": mk.flat_items(mk.single_state()),
                 "rows4": mk.multi_items("rows4"),
                 "mesh2d": mk.multi_items("mesh2d")}
        for name, items in cases.items():
            ck = os.path.join(tmp, name)
            mk.expect(ck, items)
            write_tree(ck, items)
            with open(ck + ".expected.json") as f:
                exp = json.load(f)
            expect("%s: right tree passes" % name,
                   check_tree(ck, exp, True), False)
            rc = run_check(ck, ck + ".expected.json", True, True)
            expect("%s: command line exits 0" % name, (0, ["rc %d" % rc] if rc else []), False)

        with open(os.path.join(tmp, "single.expected.json")) as f:
            exp = json.load(f)
        src = os.path.join(tmp, "single")

        def damaged(label, fn, with_torch_load=True, want_bad=True):
            d = os.path.join(tmp, "dmg")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(src, d)  # copy2: keeps the xattrs
            fn(d)
            expect(label, check_tree(d, exp, with_torch_load), want_bad)

        def rewrite(d, sub, k, fn):
            p = os.path.join(d, sub, k)
            with open(p, "rb") as f:
                b = f.read()
            with open(p, "r+b") as f:
                f.truncate(0)
                f.write(fn(b))

        def flip(b):
            b = bytearray(b)
            b[3] ^= 1
            return bytes(b)

        damaged("flipped byte (BF16) is caught",
                lambda d: rewrite(d, "tensors", "model.head.weight", flip))
        damaged("short file is caught",
                lambda d: rewrite(d, "tensors", "sliced", lambda b: b[:-4]))
        storage_order = mk.tensor_bytes(mk.single_state()["transposed"].t())
        damaged("storage-order bytes are caught",
                lambda d: rewrite(d, "tensors", "transposed",
                                  lambda b: storage_order))
        damaged("missing tensor is caught",
                lambda d: os.unlink(os.path.join(d, "tensors", "scalar")))
        damaged("extra tensor is caught",
                lambda d: open(os.path.join(d, "tensors", "x"), "wb").close())
        damaged("wrong dtype xattr is caught",
                lambda d: os.setxattr(os.path.join(d, "tensors", "model.f64"),
                                      "user.shardfs.dtype", b"I64"))
        damaged("wrong shape xattr is caught",
                lambda d: os.setxattr(os.path.join(d, "tensors", "transposed"),
                                      "user.shardfs.shape", b"[6, 5]"))
        some_obj = sorted(exp["objects"])[0]
        damaged("missing object is caught",
                lambda d: os.unlink(os.path.join(d, "objects", some_obj)))
        damaged("extra object is caught",
                lambda d: torch.save(1, os.path.join(d, "objects", "x")))

        def changed(d):
            for k in exp["objects"]:
                torch.save(k, os.path.join(d, "objects", k))
        damaged("changed objects are caught", changed)
        damaged("changed objects unseen without --torch-load", changed,
                with_torch_load=False, want_bad=False)
        damaged("junk object fails torch.load",
                lambda d: rewrite(d, "objects", some_obj, lambda b: b"junk"))
    print("selftest (torch %s): %s" % (torch.__version__, "FAILED: " + ", ".join(failures)
                                       if failures else "all ok"))
    return 1 if failures else 0


def materialize(ckpt, out):
    sys.path.insert(0, HERE)
    import torch  # noqa: F401
    import make_dcp_fixtures as mk
    if mk.OLD:
        import torch.distributed._shard.checkpoint as dcp
        from torch.distributed._shard.checkpoint.metadata import TensorStorageMetadata
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp.FileSystemReader(ckpt)
    md = reader.read_metadata()
    items = {}
    for k, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            items[k] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
    sd = dict(items)
    if mk.OLD:
        dcp.load_state_dict(sd, reader, no_dist=True)
    else:
        dcp.load(sd, storage_reader=reader)
    for k in items:
        items[k] = sd[k]
    # objects: the stored bytes themselves, where .metadata says they lie
    for idx, info in md.storage_data.items():
        m = md.state_dict_metadata[idx.fqn]
        if isinstance(m, TensorStorageMetadata):
            continue
        if getattr(info, "transform_descriptors", None):
            raise SystemExit("%s: transformed (compressed) item, not handled" % idx.fqn)
        with open(os.path.join(ckpt, info.relative_path), "rb") as f:
            f.seek(info.offset)
            items[idx.fqn] = f.read(info.length)
    write_tree(out, items)
    print("materialized %s (torch %s): %d tensors, %d objects -> %s"
          % (ckpt, torch.__version__,
             sum(isinstance(v, torch.Tensor) for v in items.values()),
             sum(not isinstance(v, torch.Tensor) for v in items.values()), out))
    return 0


def main(argv):
    flags = set(a for a in argv[1:] if a.startswith("--"))
    args = [a for a in argv[1:] if not a.startswith("--")]
    unknown = flags - {"--torch-load", "--no-xattrs", "--selftest", "--materialize"}
    if unknown:
        print("check_dcp_tree: unknown option %s" % sorted(unknown)[0])
        return 2
    if "--selftest" in flags:
        return selftest()
    if len(args) != 2:
        print(__doc__)
        return 2
    if "--materialize" in flags:
        return materialize(args[0], args[1])
    return run_check(args[0], args[1], "--torch-load" in flags,
                     "--no-xattrs" not in flags)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
