"""check_dcp_tree - a mounted DCP checkpoint against what torch was given.

    /usr/bin/python3 check_dcp_tree.py MOUNTED_CKPT EXPECTED_JSON [--torch-load]

EXPECTED_JSON is what make_dcp_fixtures.py wrote beside the checkpoint.
Checks that MOUNTED_CKPT/tensors/KEY exists for every expected tensor with
its size, dtype and shape xattrs and the xxh3 of the original tensor's
bytes; that tensors/ holds nothing else; that objects/KEY exists for every
expected object and nothing else, and (--torch-load) that torch.load of
it gives a value whose repr is the original's. One line per mismatch, a
summary; exit 1 on any mismatch.
"""

import json
import os
import sys

import xxhash


def listing(top):
    out = set()
    for dp, _, fns in os.walk(top):
        for f in fns:
            out.add(os.path.relpath(os.path.join(dp, f), top))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    root, exp_path = argv[1], argv[2]
    torch_load = "--torch-load" in argv[3:]
    with open(exp_path) as f:
        exp = json.load(f)
    bad, good = [], 0
    tdir = os.path.join(root, "tensors")
    got = listing(tdir) if os.path.isdir(tdir) else set()
    for k, e in sorted(exp["tensors"].items()):
        p = os.path.join(tdir, k)
        if k not in got:
            bad.append("tensor %s: missing" % k)
            continue
        with open(p, "rb") as f:
            b = f.read()
        h = "%016x" % xxhash.xxh3_64_intdigest(b)
        dt = os.getxattr(p, "user.shardfs.dtype").decode()
        shape = json.loads(os.getxattr(p, "user.shardfs.shape"))
        for what, g, w in (("size", len(b), e["nbytes"]), ("xxh3", h, e["xxh3"]),
                           ("dtype", dt, e["dtype"]), ("shape", shape, e["shape"])):
            if g != w:
                bad.append("tensor %s: %s %r, want %r" % (k, what, g, w))
            else:
                good += 1
    for k in sorted(got - set(exp["tensors"])):
        bad.append("tensor %s: not expected" % k)
    odir = os.path.join(root, "objects")
    gobj = listing(odir) if os.path.isdir(odir) else set()
    for k in sorted(set(exp["objects"]) - gobj):
        bad.append("object %s: missing" % k)
    for k in sorted(gobj - set(exp["objects"])):
        bad.append("object %s: not expected" % k)
    if torch_load:
        import torch
        for k in sorted(gobj & set(exp["objects"])):
            try:
                v = torch.load(os.path.join(odir, k))
            except Exception as ex:  # report, go on
                bad.append("object %s: torch.load failed: %s" % (k, ex))
                continue
            if repr(v) != exp["objects"][k]["repr"]:
                bad.append("object %s: %r, want %s" % (k, v, exp["objects"][k]["repr"]))
            else:
                good += 1
    for b in bad:
        print("MISMATCH", b)
    print("%s: %d checks passed, %d mismatches" % (root, good, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
