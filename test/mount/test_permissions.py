#!/usr/bin/python3
"""Mount test, issue "safe and at home" items 1 and 2: who may do what.

1. A store mounted by root with -o allow_other, used by an unprivileged
   user (nobody, through setpriv): reads work where the store's modes
   allow them; the mount shows the store's owner and modes (committed
   checkpoints at most 0555/0444, a 0700 checkpoint and 0600 files stay
   private); every change (mkdir, create, write, truncate, chmod, rename,
   unlink, rmdir, commit, delete by xattr and by `shardctl rm`) fails with
   EACCES or EPERM, both with the kernel checking modes
   (default_permissions, the default) and with --no-default-permissions
   (the daemon's own check); and the store is unchanged afterwards, byte
   for byte, mode for mode, mtime for mtime.
2. Directories shardfs did not make (a real PyTorch DCP checkpoint written
   by torch 1.13, an arbitrary directory of files) are skipped with one log
   line each and never adopted: mkdir over them fails with EEXIST, rm and
   writes cannot reach them, and they are byte-identical afterwards. A
   directory shardfs made (its marker) is adopted by mkdir; a new
   checkpoint's directory carries the marker from its first moment.
Skips (exit 77, saying why) when not run as root or without setpriv.
"""

import errno
import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = sm.NOBODY
DENIED = ("EACCES", "EPERM")


def write_dcp(path):
    """A real PyTorch DCP checkpoint, written by Debian's torch 1.13 (in a
    child process: torch is slow to import and holds threads)."""
    code = r"""
import sys
sys.path.insert(0, sys.argv[2])
import torch113  # noqa: F401  (torch 1.13 on Python 3.11)
import torch
import torch.distributed._shard.checkpoint as dcp
sd = {"model.w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
      "model.b": torch.ones(6, dtype=torch.bfloat16), "step": 7}
dcp.save_state_dict(sd, dcp.FileSystemWriter(sys.argv[1]), no_dist=True)
"""
    subprocess.run(["/usr/bin/python3", "-c", code, path,
                    os.path.join(HERE, "..", "interop")],
                   check=True, timeout=300)


def modes_of(res):
    return stat.S_IMODE(res["ok"][0]) if "ok" in res else None


def check_reads(ck, mnt, ref, label):
    """nobody reads every tensor of ck-a and sees the store's owner and the
    read-only modes."""
    names = sorted(ref.tensors)
    ops = [["read", sm.tensor_path(os.path.join(mnt, "ck-a"), n)] for n in names]
    ops += [["stat", mnt], ["stat", os.path.join(mnt, "ck-a")],
            ["stat", sm.tensor_path(os.path.join(mnt, "ck-a"), names[0])],
            ["listdir", os.path.join(mnt, "ck-priv")],
            ["read", sm.tensor_path(os.path.join(mnt, "ck-0600"), names[0])],
            ["stat", sm.tensor_path(os.path.join(mnt, "ck-0600"), names[0])],
            ["stat", os.path.join(mnt, "ck-priv")]]
    res = sm.as_nobody(ops)
    import hashlib
    for n, r in zip(names, res):
        ck.eq(r, {"ok": hashlib.sha256(ref.tensor_bytes(n)).hexdigest()},
              "%s: nobody reads tensor %s" % (label, n))
    r_root, r_ck, r_t, r_priv, r_0600, r_0600st, r_privst = res[len(names):]
    ck.eq(modes_of(r_root), 0o755, "%s: store root mode" % label)
    ck.eq(r_root["ok"][1], 0, "%s: store root owner" % label)
    ck.eq(modes_of(r_ck), 0o555, "%s: committed checkpoint dir mode" % label)
    ck.eq(modes_of(r_t), 0o444, "%s: committed tensor mode" % label)
    if label == "default_permissions":
        ck.eq(r_priv, {"errno": "EACCES"},
              "%s: a 0700 checkpoint cannot be listed by others" % label)
        ck.eq(r_0600, {"errno": "EACCES"},
              "%s: a checkpoint of 0600 files cannot be read by others" % label)
    ck.eq(modes_of(r_privst), 0o500, "%s: 0700 checkpoint shows 0500" % label)
    ck.eq(modes_of(r_0600st), 0o400, "%s: tensor of 0600 files shows 0400" % label)


def check_changes(env, ck, mnt, ref, label):
    """Every change nobody tries fails with EACCES/EPERM."""
    ca = os.path.join(mnt, "ck-a")
    w = os.path.join(mnt, "w-ck")
    t0 = sorted(ref.tensors)[0]
    ops = [
        ["mkdir", os.path.join(mnt, "evil")],
        ["setxattr", mnt, "user.shardfs.delete", "ck-a"],
        ["setxattr", ca, "user.shardfs.delete", "1"],
        ["run", env.shardctl, "rm", ca],
        ["open_w", os.path.join(ca, "tensors", t0)],
        ["create", os.path.join(ca, "evil.json")],
        ["rename", ca, os.path.join(mnt, "moved")],
        ["rmdir", ca],
        ["chmod", ca, 0o777],
        ["create", os.path.join(w, "tensors", "y")],
        ["open_w", os.path.join(w, "config.json")],
        ["truncate", os.path.join(w, "config.json"), 0],
        ["setxattr", os.path.join(w, "tensors", "x"), "user.shardfs.shape", "[8]"],
        ["setxattr", w, "user.shardfs.commit", "1"],
        ["setxattr", mnt, "user.shardfs.delete", "w-ck"],
        ["mkdir", os.path.join(w, "tensors", "sub")],
        ["unlink", os.path.join(w, "config.json")],
    ]
    res = sm.as_nobody(ops)
    for op, r in zip(ops, res):
        what = "%s: nobody: %s %s" % (label, op[0], " ".join(str(a) for a in op[1:]))
        if op[0] == "run":
            ck.ok(r.get("ok", {}).get("rc", 0) != 0, what + " must fail: %r" % r)
        else:
            ck.ok(r.get("errno") in DENIED, what + " must fail with EACCES/EPERM: %r" % r)


def test(env, ck):
    if os.geteuid() != 0:
        print("SKIP: needs root (mounts with allow_other, acts as nobody)")
        sys.exit(sm.SKIP)
    if subprocess.run(["which", "setpriv"], stdout=subprocess.DEVNULL).returncode:
        print("SKIP: setpriv (util-linux) is not installed")
        sys.exit(sm.SKIP)
    os.chmod(env.tmp, 0o711)  # nobody must reach the mountpoints
    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "ck-a"), layout="mixed", ranks=2, size="256K")
    env.gen(os.path.join(store, "ck-priv"), layout="mixed", ranks=2, size="256K",
            ref=False)
    os.chmod(os.path.join(store, "ck-priv"), 0o700)
    env.gen(os.path.join(store, "ck-0600"), layout="mixed", ranks=2, size="256K",
            ref=False)
    for dp, _, fns in os.walk(os.path.join(store, "ck-0600")):
        for f in fns:
            os.chmod(os.path.join(dp, f), 0o600)
    write_dcp(os.path.join(store, "dcp"))
    os.makedirs(os.path.join(store, "junk", "sub"))
    with open(os.path.join(store, "junk", "notes.txt"), "w") as f:
        f.write("not a checkpoint\n")
    with open(os.path.join(store, "junk", "sub", "x.bin"), "wb") as f:
        f.write(os.urandom(4096))
    # made by shardfs (its marker) but never written here: mkdir adopts it
    os.makedirs(os.path.join(store, "adopt"))
    with open(os.path.join(store, "adopt", ".shardfs"), "w") as f:
        f.write('{"format": "shardfs/1"}\n')

    for label, opts in (("default_permissions", ["-o", "allow_other"]),
                        ("no_default_permissions",
                         ["-o", "allow_other", "--no-default-permissions"])):
        with sm.Mount(env, store, opts + ["--log-level", "info"], name=label) as m:
            mnt = m.mnt
            # a checkpoint root is writing, for nobody to try to change
            w = os.path.join(mnt, "w-ck")
            if not os.path.isdir(w):
                os.mkdir(w)
            open(os.path.join(w, "tensors", "x"), "w").close()
            if label == "default_permissions":
                os.setxattr(os.path.join(w, "tensors", "x"), "user.shardfs.dtype", b"F32")
                with open(os.path.join(w, "config.json"), "w") as f:
                    f.write("{}")
            before = sm.store_snapshot(store)
            check_reads(ck, mnt, ref, label)
            check_changes(env, ck, mnt, ref, label)
            after = sm.store_snapshot(store)
            ck.eq(sm.snapshot_diff(before, after), [],
                  "%s: the store is unchanged by nobody's attempts" % label)
            if label == "default_permissions":
                check_foreign(env, ck, m, store)
            # root still reads and the writing checkpoint still takes changes
            for n in sorted(ref.tensors)[:3]:
                ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(mnt, "ck-a"), n)),
                            ref.tensor_bytes(n), "%s: root reads %s" % (label, n))
            ck.eq(os.getxattr(w, "user.shardfs.state").decode(), "writing",
                  "%s: w-ck still writing" % label)


def check_foreign(env, ck, m, store):
    """Item 2, as root: directories shardfs did not make are left alone.
    junk/ is no checkpoint (skipped with one log line); dcp/ is mounted
    read-only (issue 11): every change fails, nothing in the store moves."""
    mnt = m.mnt
    log = m.log_text()
    lines = [l for l in log.splitlines() if 'store: "junk" skipped' in l]
    ck.eq(len(lines), 1, "one log line says junk/ was skipped: %r" % lines)
    ck.ok(os.path.isdir(os.path.join(mnt, "dcp", "tensors")),
          "dcp/ is mounted (read-only)")
    before = sm.store_snapshot(store)
    for name, on_delete, on_create in (("dcp", errno.EROFS, errno.EROFS),
                                       ("junk", errno.ENOENT, errno.ENOENT)):
        ck.raises(errno.EEXIST, lambda: os.mkdir(os.path.join(mnt, name)),
                  "mkdir over %s/ (not made by shardfs)" % name)
        ck.raises(on_delete,
                  lambda: os.setxattr(mnt, "user.shardfs.delete", name.encode()),
                  "delete %s/ by xattr" % name)
        r = env.shardctl_run("rm", os.path.join(mnt, name), check=False)
        ck.ok(r.returncode != 0, "shardctl rm %s/ fails" % name)
        if name == "dcp":
            ck.ok(b"torch-dcp" in r.stderr and b"only reads" in r.stderr,
                  "shardctl rm says why: %r" % r.stderr)
        ck.raises((on_create,),
                  lambda: open(os.path.join(mnt, name, "planted"), "w"),
                  "create a file in %s/" % name)
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "dcp/ and junk/ are unchanged after mkdir, writes and rm")
    ck.ok(any("mkdir junk" in l and "left alone" in l for l in m.log_lines()),
          "the refused mkdir is logged")
    # a directory shardfs made is adopted; a new one carries the marker
    os.mkdir(os.path.join(mnt, "adopt"))
    ck.eq(os.getxattr(os.path.join(mnt, "adopt"), "user.shardfs.state").decode(),
          "writing", "mkdir adopts a directory with the shardfs marker")
    os.mkdir(os.path.join(mnt, "fresh"))
    ck.ok(os.path.isfile(os.path.join(store, "fresh", ".shardfs")),
          "a new checkpoint directory holds the marker")
    ck.ok(not [n for n in os.listdir(store) if n.startswith(".creating-")],
          "no temporary directory is left in the store")
    r = env.shardctl_run("rm", os.path.join(mnt, "fresh"), check=False)
    ck.eq(r.returncode, 0, "shardctl rm discards the new checkpoint: %s" %
          r.stderr.decode(errors="replace"))
    ck.ok(not os.path.exists(os.path.join(store, "fresh")), "fresh/ is gone")
    r = env.shardctl_run("rm", mnt, check=False)
    ck.ok(r.returncode != 0 and b"name one of its checkpoints" in r.stderr,
          "shardctl rm of the store's mount itself refuses: %r" % r.stderr)


if __name__ == "__main__":
    sys.exit(sm.main(test))
