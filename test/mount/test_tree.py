#!/usr/bin/python3
"""Mount test (f), (h): the tree a user sees and its immutability.

(f) directory listings ('/' in tensor names makes subdirectories; slices are
not listed), os.stat and `ls -l` sizes, file types, and the xattrs
user.shardfs.dtype / shape (JSON) / shards (JSON, one entry per manifest
shard) on tensors, user.shardfs.state = "committed" on the checkpoint dir.
(h) a committed checkpoint refuses every change with EROFS (open for write,
create, mkdir, unlink, rmdir, rename, truncate, setxattr) and the store on
disk is byte-for-byte unchanged afterwards."""

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def xattr_text(path, name):
    v = os.getxattr(path, name)
    return v.rstrip(b"\0").decode()


def expected_tree(names):
    """Files and directories (relative paths) a set of '/' names makes."""
    files, dirs = set(), set()
    for n in names:
        files.add(n)
        parts = n.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    return files, dirs


def walk(top):
    files, dirs = set(), set()
    for dirpath, dns, fns in os.walk(top):
        for d in dns:
            dirs.add(os.path.relpath(os.path.join(dirpath, d), top))
        for f in fns:
            files.add(os.path.relpath(os.path.join(dirpath, f), top))
    return files, dirs


def ls_sizes(d):
    """name -> size from `ls -l` of directory d (regular files only)."""
    r = subprocess.run(["ls", "-l", d], stdout=subprocess.PIPE, timeout=30, check=True)
    out = {}
    for line in r.stdout.decode().splitlines():
        f = line.split(None, 8)
        if len(f) == 9 and f[0].startswith("-"):
            out[f[8]] = int(f[4])
    return out


def store_digest(d):
    h = hashlib.sha256()
    for dirpath, dns, fns in sorted(os.walk(d)):
        dns.sort()
        for f in sorted(fns):
            p = os.path.join(dirpath, f)
            h.update(p.encode())
            h.update(sm.read_file(p))
    return h.hexdigest()


def check_tree(ck, root, ref, man, man_size, label):
    files, dirs = walk(os.path.join(root, "tensors"))
    wf, wd = expected_tree(ref.tensors)
    ck.eq(sorted(files), sorted(wf), "%s: files under tensors/" % label)
    ck.eq(sorted(dirs), sorted(wd), "%s: directories under tensors/" % label)
    top = set(os.listdir(root))
    want_top = {"tensors", "model.safetensors", "manifest.json"}
    want_top |= {f.split("/")[0] for f in ref.files}
    if any(sm.DTYPES[t["dtype"]][1] for t in ref.tensors.values()):
        want_top.add("npy")
    ck.ok(want_top <= top and top <= want_top | {"npy"},
          "%s: checkpoint root lists %s (got %s)" % (label, sorted(want_top), sorted(top)))
    st = os.stat(root)
    ck.ok(stat.S_ISDIR(st.st_mode), "%s: checkpoint is a directory" % label)
    for d in wd:
        ck.ok(stat.S_ISDIR(os.stat(os.path.join(root, "tensors", d)).st_mode),
              "%s: tensors/%s is a directory" % (label, d))
    # sizes by stat and by ls -l
    lsz = ls_sizes(os.path.join(root, "tensors"))
    for name in sorted(ref.tensors):
        p = sm.tensor_path(root, name)
        st = os.stat(p)
        ck.ok(stat.S_ISREG(st.st_mode), "%s: tensors/%s is a regular file" % (label, name))
        ck.eq(st.st_size, ref.nbytes(name), "%s: st_size of tensors/%s" % (label, name))
        if "/" not in name:
            ck.eq(lsz.get(name), ref.nbytes(name), "%s: ls -l size of tensors/%s" % (label, name))
    rsz = ls_sizes(root)
    for name, f in ref.files.items():
        ck.eq(os.stat(os.path.join(root, name)).st_size, f["size"], "%s: st_size of %s" % (label, name))
        if "/" not in name:
            ck.eq(rsz.get(name), f["size"], "%s: ls -l size of %s" % (label, name))
    ck.eq(rsz.get("manifest.json"), man_size, "%s: ls -l size of manifest.json" % label)
    # xattrs
    try:
        ck.eq(xattr_text(root, "user.shardfs.state"), "committed",
              "%s: user.shardfs.state of the checkpoint dir" % label)
    except OSError as e:
        ck.ok(False, "%s: getxattr user.shardfs.state: %s" % (label, e))
    for name in sorted(ref.tensors):
        p = sm.tensor_path(root, name)
        t = ref.tensors[name]
        try:
            names = os.listxattr(p)
            for x in ("user.shardfs.dtype", "user.shardfs.shape", "user.shardfs.shards"):
                ck.ok(x in names, "%s: listxattr(tensors/%s) has %s (got %s)" % (label, name, x, names))
            ck.eq(xattr_text(p, "user.shardfs.dtype"), t["dtype"], "%s: dtype xattr of %s" % (label, name))
            ck.eq(json.loads(xattr_text(p, "user.shardfs.shape")), t["shape"],
                  "%s: shape xattr of %s" % (label, name))
            shards = json.loads(xattr_text(p, "user.shardfs.shards"))
            ck.ok(isinstance(shards, list), "%s: shards xattr of %s is a JSON list" % (label, name))
            ck.eq(len(shards), len(man["tensors"][name]["shards"]),
                  "%s: shard count in the shards xattr of %s" % (label, name))
        except (OSError, ValueError) as e:
            ck.ok(False, "%s: xattrs of tensors/%s: %s" % (label, name, e))
    ck.raises((errno.ENODATA,), lambda: os.getxattr(sm.tensor_path(root, sorted(ref.tensors)[0]),
                                                     "user.shardfs.nosuch"),
              "%s: getxattr of an unknown attribute" % label)


def check_readonly(ck, root, ref, label):
    name = max(ref.tensors, key=ref.nbytes)
    p = sm.tensor_path(root, name)
    t = os.path.join(root, "tensors")
    EROFS = errno.EROFS
    ck.raises(EROFS, lambda: os.open(p, os.O_WRONLY), "%s: open O_WRONLY" % label)
    ck.raises(EROFS, lambda: os.open(p, os.O_RDWR), "%s: open O_RDWR" % label)
    ck.raises(EROFS, lambda: os.open(p, os.O_WRONLY | os.O_TRUNC), "%s: open O_TRUNC" % label)
    ck.raises(EROFS, lambda: os.open(os.path.join(t, "new.tensor"), os.O_WRONLY | os.O_CREAT, 0o644),
              "%s: create tensors/new.tensor" % label)
    ck.raises(EROFS, lambda: os.open(os.path.join(root, "new.txt"), os.O_WRONLY | os.O_CREAT, 0o644),
              "%s: create a root file" % label)
    ck.raises(EROFS, lambda: os.mkdir(os.path.join(t, "newdir")), "%s: mkdir in tensors/" % label)
    ck.raises(EROFS, lambda: os.unlink(p), "%s: unlink a tensor" % label)
    ck.raises(EROFS, lambda: os.unlink(os.path.join(root, "manifest.json")), "%s: unlink manifest.json" % label)
    ck.raises(EROFS, lambda: os.rmdir(t), "%s: rmdir tensors/" % label)
    ck.raises(EROFS, lambda: os.rename(p, p + ".moved"), "%s: rename a tensor" % label)
    ck.raises(EROFS, lambda: os.truncate(p, 0), "%s: truncate a tensor" % label)
    ck.raises(EROFS, lambda: os.setxattr(p, "user.shardfs.dtype", b"F32"), "%s: setxattr dtype" % label)
    ck.raises(EROFS, lambda: os.setxattr(root, "user.shardfs.commit", b"1"),
              "%s: setxattr commit on a committed checkpoint" % label)
    ck.raises(EROFS, lambda: os.open(os.path.join(root, "model.safetensors"), os.O_WRONLY),
              "%s: open model.safetensors for write" % label)
    ck.raises(EROFS, lambda: os.open(os.path.join(root, "manifest.json"), os.O_RDWR),
              "%s: open manifest.json for write" % label)
    # the tensor still reads back unchanged
    ck.bytes_eq(sm.read_file(p), ref.tensor_bytes(name), "%s: %s after refused writes" % (label, name))


def check_du(ck, root, label):
    """Derived views occupy no blocks (issue 14, 8): du counts each byte once."""
    tens = 0
    for dp, _, fns in os.walk(os.path.join(root, "tensors")):
        for f in fns:
            st = os.lstat(os.path.join(dp, f))
            tens += st.st_size
            ck.ok(st.st_size == 0 or st.st_blocks > 0,
                  "%s: tensors/%s has blocks" % (label, f))
    st = os.stat(os.path.join(root, "model.safetensors"))
    ck.eq(st.st_blocks, 0, "%s: model.safetensors occupies no blocks" % label)
    npys = [os.path.join(dp, f) for dp, _, fns in os.walk(os.path.join(root, "npy"))
            for f in fns]
    ck.ok(all(os.stat(p).st_blocks == 0 for p in npys),
          "%s: npy/ files (%d) occupy no blocks" % (label, len(npys)))
    out = subprocess.run(["du", "-sk", root], stdout=subprocess.PIPE,
                         timeout=60).stdout.decode().split()
    du_kib = int(out[0]) if out else -1
    # tensors (rounded up per file) + manifest + root files + directories
    ck.ok(tens // 1024 <= du_kib <= tens // 1024 * 1.2 + 256,
          "%s: du -sk counts the tensors once (%d KiB for %d KiB of tensors)"
          % (label, du_kib, tens // 1024))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "mixed": env.gen(os.path.join(store, "mixed"), layout="mixed", ranks=3,
                         size="2M", seed=51, block_size="64K"),
        "llama": env.gen(os.path.join(store, "llama"), layout="llama", ranks=2,
                         size="2M", dtype="BF16", seed=52, block_size="64K"),
        "fsdp": env.gen(os.path.join(store, "fsdp"), layout="fsdp", ranks=3,
                        size="1M", dtype="F32", seed=53, block_size="64K"),
    }
    digest = store_digest(store)
    with sm.Mount(env, store, name="tree") as m:
        for cname, ref in sorted(refs.items()):
            root = os.path.join(m.mnt, cname)
            man = sm.manifest_of(os.path.join(store, cname))
            man_size = os.path.getsize(os.path.join(store, cname, "manifest.json"))
            check_tree(ck, root, ref, man, man_size, cname)
            check_readonly(ck, root, ref, cname)
            check_du(ck, root, cname)
        ck.ok(m.alive(), "daemon alive after the tree and EROFS tests")
    ck.eq(store_digest(store), digest, "store on disk unchanged by the refused writes")


if __name__ == "__main__":
    sys.exit(sm.main(run))
