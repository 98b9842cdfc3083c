#!/usr/bin/python3
"""Mount test (b), (k): random slice files tensors/NAME@S:E,... against
numpy slicing of the reference (':' dims, open-ended sides, empty slices,
0-d and 1-d tensors, names in subdirectories), sizes by stat, and the slice
path errors: EINVAL for bad syntax or the wrong number of dimensions,
ERANGE for a box outside the tensor, ENOENT for an unknown tensor."""

import errno
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def check_slice(ck, root, ref, name, spec, sl, label, rng=None):
    p = sm.tensor_path(root, name, spec)
    want = ref.array(name)[sl].tobytes() if sl != () else ref.array(name).tobytes()
    try:
        got = sm.read_file(p)
        st = os.stat(p)
    except OSError as e:
        ck.ok(False, "%s: read %s@%s: %s" % (label, name, spec, e))
        return
    ck.bytes_eq(got, want, "%s: slice %s@%s" % (label, name, spec))
    ck.eq(st.st_size, len(want), "%s: st_size of %s@%s" % (label, name, spec))
    if rng is not None and want:
        # one pread inside and one across the end of the slice file
        for off in (rng.randrange(len(want)), max(0, len(want) - rng.randrange(1, 5000))):
            ln = rng.choice([1, 4096, 10000, 70000])
            try:
                got = sm.pread_all(p, off, ln)
            except OSError as e:
                ck.ok(False, "%s: pread %s@%s (%d, %d): %s" % (label, name, spec, off, ln, e))
                continue
            ck.bytes_eq(got, want[off:off + ln], "%s: pread %s@%s off %d len %d" % (
                label, name, spec, off, ln))


def check_errors(ck, root, ref, label):
    two_d = [n for n, t in ref.tensors.items() if len(t["shape"]) == 2]
    one_d = [n for n, t in ref.tensors.items() if len(t["shape"]) == 1]
    cases = []
    for n in two_d[:2] + one_d[:2]:
        shape = ref.tensors[n]["shape"]
        nd = len(shape)
        full = ",".join(":" for _ in shape)
        cases += [
            (n + "@abc", errno.EINVAL),
            (n + "@" + ",".join("1:2:3" for _ in shape), errno.EINVAL),
            (n + "@" + ",".join("1" for _ in shape), errno.EINVAL),
            (n + "@" + ",".join("x:2" for _ in shape), errno.EINVAL),
            (n + "@" + full + ",:", errno.EINVAL),                  # one dim too many
            (n + "@" + ",".join(":" for _ in range(nd - 1)) if nd > 1
             else n + "@:,:", errno.EINVAL),                         # wrong count
            (n + "@" + ",".join("0:%d" % (d + 1) for d in shape), errno.ERANGE),
            (n + "@" + ",".join("%d:" % (d + 1) for d in shape), errno.ERANGE),
            (n + "@", errno.EINVAL),                                # no dims at all
            (n + "@" + ",".join("-1:1" for _ in shape), errno.EINVAL),
            (n + "@" + ",".join(" 0:1" for _ in shape), errno.EINVAL),
            # a number past uint64: either answer is honest, success is not
            (n + "@" + ",".join("0:99999999999999999999999" for _ in shape),
             (errno.EINVAL, errno.ERANGE)),
            (n + "@" + "0:1," * 17 + "0:1", errno.EINVAL),          # > SF_MAX_NDIM dims
        ]
    # start > stop
    for n in two_d[:1] + one_d[:1]:
        shape = ref.tensors[n]["shape"]
        if shape[0] >= 2:
            rest = "".join(",:" for _ in shape[1:])
            cases.append((n + "@2:1" + rest, errno.ERANGE))
    cases += [("no.such.tensor@0:1", errno.ENOENT), ("no.such.tensor", errno.ENOENT)]
    for path, want in cases:
        p = os.path.join(root, "tensors", path)
        ck.raises(want, lambda: os.stat(p), "%s: stat tensors/%s" % (label, path))
        ck.raises(want, lambda: os.close(os.open(p, os.O_RDONLY)),
                  "%s: open tensors/%s" % (label, path))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "mixed": env.gen(os.path.join(store, "mixed"), layout="mixed", ranks=4,
                         size="3M", seed=31, block_size="64K"),
        "llama": env.gen(os.path.join(store, "llama"), layout="llama", ranks=3,
                         size="3M", dtype="F32", seed=32, block_size="64K"),
        "fsdp": env.gen(os.path.join(store, "fsdp"), layout="fsdp", ranks=4,
                        size="2M", dtype="BF16", seed=33, block_size="64K"),
    }
    rng = env.rng
    with sm.Mount(env, store, name="slices") as m:
        for cname, ref in sorted(refs.items()):
            root = os.path.join(m.mnt, cname)
            listing = []
            for dirpath, dirs, files in os.walk(os.path.join(root, "tensors")):
                listing += files
            ck.ok(not any("@" in f for f in listing),
                  "%s: slices are not listed in tensors/" % cname)
            for name in sorted(ref.tensors):
                shape = ref.tensors[name]["shape"]
                if len(shape) == 0:
                    # a 0-d tensor has zero START:STOP pairs: NAME@ is all of it
                    check_slice(ck, root, ref, name, "", (), cname)
                    continue
                # the whole tensor as a slice, then random ones
                check_slice(ck, root, ref, name, ",".join(":" for _ in shape),
                            tuple(slice(None) for _ in shape), cname)
                nrand = 6 if len(ref.tensors) < 40 else 2
                for _ in range(nrand):
                    dims = [sm.random_dim(rng, n) for n in shape]
                    check_slice(ck, root, ref, name, ",".join(d[0] for d in dims),
                                tuple(d[1] for d in dims), cname, rng)
            check_errors(ck, root, ref, cname)
        # still serving after the error paths (l)
        ref = refs["mixed"]
        name = max(ref.tensors, key=ref.nbytes)
        try:
            ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(m.mnt, "mixed"), name)),
                        ref.tensor_bytes(name), "mixed: %s after slice errors" % name)
        except OSError as e:
            ck.ok(False, "read after slice errors: %s" % e)
        ck.ok(m.alive(), "daemon alive after the slice tests")


if __name__ == "__main__":
    sys.exit(sm.main(run))
