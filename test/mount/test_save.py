#!/usr/bin/python3
"""test_save - a framework saving through the mount (SPEC 8, issue 26
items 2 and 3), one daemon.

Debian's torch 1.13 save_state_dict (2 gloo processes, the stock
FileSystemWriter, ShardedTensors split by rows and by columns, a plain
bf16 tensor, an int) saves into MOUNT/step-N:
  1. once both processes returned, the checkpoint is shown complete
     (user.shardfs.state committed) within 2 s, verified = yes, format
     torch-dcp; tensors/ is byte-exact against the state dict;
  2. its files are in the store under the names torch gave them, with
     shardfs.index.json beside them and none of shardfs/1's bookkeeping;
  3. a byte flipped on disk in one shard's file: reading that tensor
     fails with EIO (never wrong bytes); the others still read;
  4. a save whose rank 1 is killed (kill -9) before writing its data,
     rank 0 killed too: never shown complete (state saving, 4 s later);
  5. another user cannot remove a saved checkpoint (EACCES); rm -rf
     (shutil.rmtree) through the mount removes it, from the store too;
     shardctl rm removes the killed save;
  6. re-saving a name: a re-save killed midway leaves it not complete
     (the old .metadata is not taken for the new save's); a full re-save
     then shows the new values, verified, with torch's own files at its
     root, and load_state_dict from the mount gives the saved tensors; a
     byte flipped on disk in block 1 of torch's largest .distcp: the read
     covering it fails with EIO, block 0 reads byte-exact;
  7. a DCP checkpoint found in the store (written there directly) stays
     read-only: unlink, create and rmdir in it fail;
  9. a daemon started again shows step-3 verified, rm -rf removes it;
     a save killed midway before the restart is shown saving, and rm -rf
     removes it;
  8. a user who is not root saves (into a store they own): the files are
     theirs; another user cannot rm -rf it, they can.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import savelib  # noqa: E402
from savelib import PY, WORKER, expected, state  # noqa: E402
BOUND_S = 2.0


def wait_state(path, want, bound):
    return savelib.wait_until(lambda: state(path) == want, bound)


def start_ranks(env, path, tag, stall=-1, seed=5, big_mib=0):
    return savelib.start_ranks(env.path("init-%s" % tag), [path, path], stall, seed,
                               big_mib)


def save(env, ck, path, tag, seed=5, big_mib=0):
    ok = savelib.wait_ranks(start_ranks(env, path, tag, seed=seed, big_mib=big_mib), 120)
    ck.ok(ok, "%s: save_state_dict through the mount succeeded on both ranks" % tag)
    return ok


def check_tensors(ck, root, want, label, names=None):
    for n in names or sorted(want):
        ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)), want[n],
                    "%s: tensors/%s" % (label, n))


def killed_save(env, ck, path, tag):
    """A save whose rank 1 stalls before its data: kill -9 it, then rank 0."""
    procs = start_ranks(env, path, tag, stall=1)
    line = procs[1].stdout.readline()
    ck.eq(line.strip(), b"stalled", "%s: rank 1 reached its data" % tag)
    time.sleep(1.0)  # rank 0 writes its files meanwhile
    procs[1].send_signal(signal.SIGKILL)
    time.sleep(0.5)
    procs[0].send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)


def flipped_root_file(ck, spath, mpath):
    """A byte flipped on disk in block 1 of a root file (the .distcp
    holding the big tensor, > 4 MiB): a read covering it fails with EIO, block 0
    still reads byte-exact (checked block by block, not whole at open);
    the byte is put back after."""
    with open(spath, "rb") as f:
        good = f.read()
    at = (4 << 20) + 100
    if not ck.ok(len(good) > at + 4096, "%s spans 2 blocks (%d bytes)" % (spath, len(good))):
        return
    with open(spath, "r+b") as f:
        f.seek(at)
        f.write(bytes([good[at] ^ 0x40]))
    try:
        try:
            fd = os.open(mpath, os.O_RDONLY)
        except OSError as e:
            ck.ok(False, "root file with a flipped byte in block 1: open failed (%s), "
                  "want block 0 readable" % errno.errorcode.get(e.errno, e.errno))
            return
        try:
            # torch's load read it already: the kernel's cached pages go
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            ck.bytes_eq(os.pread(fd, 65536, 0), good[:65536],
                        "root file: block 0 reads byte-exact beside a flipped block")
            ck.raises(errno.EIO, lambda: os.pread(fd, 4096, at & ~4095),
                      "root file: the read covering the flipped byte")
            ck.bytes_eq(os.pread(fd, 4096, 8192), good[8192:12288],
                        "root file: block 0 still reads after the EIO")
        finally:
            os.close(fd)
    finally:
        with open(spath, "r+b") as f:
            f.seek(at)
            f.write(good[at:at + 1])


def run(env, ck):
    import json
    store = env.path("store")
    os.makedirs(store)
    os.chmod(env.tmp, 0o755)
    want = expected()
    with sm.Mount(env, store, ["-o", "allow_other"], name="save") as m:
        root = os.path.join(m.mnt, "step-1")
        # 1. save, complete within 2 s
        if not save(env, ck, root, "step-1"):
            return
        dt = wait_state(root, "committed", BOUND_S)
        ck.ok(dt is not None, "step-1 shown complete within %.0f s (state %s)" % (
            BOUND_S, state(root)))
        if dt is None:
            print(m.log_text()[-3000:])
            return
        print("step-1 complete %.2f s after the save returned" % dt)
        ck.eq(os.getxattr(root, "user.shardfs.verified"), b"yes",
              "step-1 verified from the write-time hashes")
        ck.ok(os.getxattr(root, "user.shardfs.format").startswith(b"torch-dcp"),
              "step-1 is a DCP checkpoint")
        check_tensors(ck, root, want, "step-1", ["rows", "bias"])

        # 2. the files in the store, as torch named them
        names = sorted(os.listdir(os.path.join(store, "step-1")))
        ck.ok(".metadata" in names and "__0_0.distcp" in names and
              "__1_0.distcp" in names, "the store holds torch's files: %s" % names)
        ck.ok("shardfs.index.json" in names, "the write-time hashes are kept beside them")
        ck.ok(not any(n.startswith("rank-") or n == ".shardfs" or n.endswith(".tmp")
                      for n in names), "no shardfs/1 bookkeeping, no temporary: %s" % names)
        # its root lists torch's .distcp files and no .safetensors beside
        # them (Paddle's load_state_dict refuses a directory listing both);
        # the model.safetensors view is still there by name
        shown = os.listdir(root)
        ck.ok("__0_0.distcp" in shown and not any(n.endswith(".safetensors") for n in shown),
              "step-1's root lists .distcp files and no .safetensors: %s" % sorted(shown))
        ck.ok(os.stat(os.path.join(root, "model.safetensors")).st_size > 0,
              "step-1: model.safetensors is still there by name")

        # 3. a byte flipped on disk -> EIO
        man = json.loads(sm.read_file(os.path.join(root, "manifest.json")))
        shard = next(s for s in man["tensors"]["cols"]["shards"]
                     if s["file"].startswith("__1_"))
        fpath = os.path.join(store, "step-1", shard["file"])
        with open(fpath, "r+b") as f:
            f.seek(shard["file_offset"] + 17)
            b = f.read(1)
            f.seek(shard["file_offset"] + 17)
            f.write(bytes([b[0] ^ 0x40]))
        ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, "cols")),
                  "step-1: tensors/cols after a byte of %s flipped on disk" % shard["file"])
        check_tensors(ck, root, want, "step-1 after the flip", ["rows"])

        # 4. a save killed midway is never shown complete
        root2 = os.path.join(m.mnt, "step-2")
        killed_save(env, ck, root2, "step-2")
        time.sleep(2.5)
        ck.eq(state(root2), "saving", "step-2 (killed midway) is not complete")
        ck.raises(errno.ENOENT, lambda: os.stat(os.path.join(root2, "tensors")),
                  "step-2 shows no tensors/")

        # 5. removal: not by another user; rm -rf by its saver
        res = sm.as_nobody([["unlink", os.path.join(root, ".metadata")],
                            ["rmdir", root],
                            ["run", "rm", "-rf", root]])
        ck.ok(all(r.get("errno") in ("EACCES", "EPERM", "EROFS") for r in res[:2]),
              "nobody cannot remove step-1's files: %s" % res[:2])
        ck.ok(os.path.isdir(os.path.join(store, "step-1")) and
              os.path.exists(os.path.join(store, "step-1", ".metadata")),
              "step-1 still in the store after nobody's tries")
        shutil.rmtree(root)
        ck.ok(not os.path.exists(os.path.join(store, "step-1")),
              "shutil.rmtree through the mount removed step-1 from the store")
        ck.ok("step-1" not in os.listdir(m.mnt), "step-1 no longer listed")
        r = env.shardctl_run("rm", root2, check=False)
        ck.eq(r.returncode, 0, "shardctl rm of the killed save step-2: %s" %
              r.stderr.decode(errors="replace")[-300:])
        ck.ok(not os.path.exists(os.path.join(store, "step-2")),
              "shardctl rm removed the killed save step-2 from the store")
        ck.ok("step-2" not in os.listdir(m.mnt), "step-2 no longer listed")

        # 6. re-save a name: killed midway, then whole
        root3 = os.path.join(m.mnt, "step-3")
        if save(env, ck, root3, "step-3a"):
            ck.ok(wait_state(root3, "committed", BOUND_S) is not None,
                  "step-3 complete")
            killed_save(env, ck, root3, "step-3b")
            time.sleep(2.5)
            ck.eq(state(root3), "saving",
                  "step-3 re-save killed midway: not complete (old .metadata not reused)")
            if save(env, ck, root3, "step-3c", seed=6, big_mib=6):
                dt = wait_state(root3, "committed", BOUND_S)
                ck.ok(dt is not None, "step-3 re-saved: complete within %.0f s" % BOUND_S)
                ck.eq(os.getxattr(root3, "user.shardfs.verified"), b"yes",
                      "step-3 re-saved: verified")
                check_tensors(ck, root3, expected(6), "step-3 re-saved")
                # the framework's own files at the root: torch reads it back
                ck.ok(os.path.isfile(os.path.join(root3, ".metadata")) and
                      os.path.isfile(os.path.join(root3, "__1_0.distcp")),
                      "step-3 shows torch's own files at its root")
                out = env.path("loaded")
                p = subprocess.run([PY, WORKER, "load", root3, out], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=120)
                ck.eq(p.returncode, 0, "load_state_dict from the mount: %s" %
                      p.stdout.decode(errors="replace")[-500:])
                if p.returncode == 0:
                    import numpy as np
                    w6 = expected(6)
                    for k in sorted(w6):
                        ck.bytes_eq(np.load(os.path.join(out, k + ".npy")).tobytes(),
                                    w6[k], "load_state_dict from the mount: %s" % k)
                big = max((f for f in os.listdir(os.path.join(store, "step-3"))
                           if f.endswith(".distcp")),
                          key=lambda f: os.path.getsize(os.path.join(store, "step-3", f)))
                flipped_root_file(ck, os.path.join(store, "step-3", big),
                                  os.path.join(root3, big))

        # 7. a DCP checkpoint found in the store stays read-only
        found = os.path.join(store, "found")
        p = subprocess.run([PY, "-c", (
            "import sys; sys.path.insert(0, %r); import dcp_save_worker as w\n"
            "import torch.distributed._shard.checkpoint as dcp\n"
            "dcp.save_state_dict(w.full_tensors(), dcp.FileSystemWriter(%r), no_dist=True)"
        ) % (HERE, found)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        ck.eq(p.returncode, 0, "torch wrote a checkpoint into the store directly")
        froot = os.path.join(m.mnt, "found")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 and not os.path.exists(froot):
            time.sleep(0.1)
        ck.eq(state(froot), "committed", "the checkpoint found in the store is shown")
        ck.raises((errno.EROFS, errno.EPERM), lambda: os.unlink(os.path.join(froot, "manifest.json")),
                  "found: unlink refused")
        ck.raises((errno.EROFS, errno.EPERM), lambda: open(os.path.join(froot, "x.bin"), "wb"),
                  "found: create refused")
        ck.raises((errno.EROFS, errno.EPERM, errno.ENOTEMPTY),
                  lambda: os.rmdir(os.path.join(froot, "tensors")), "found: rmdir refused")
        ck.ok(os.path.exists(os.path.join(found, ".metadata")),
              "found: its files untouched")
        # a save killed midway, left for the next daemon
        killed_save(env, ck, os.path.join(m.mnt, "step-4"), "step-4")
    # 9. a daemon started again finds step-3 verified and removable
    with sm.Mount(env, store, ["-o", "allow_other"], name="again") as m:
        root3 = os.path.join(m.mnt, "step-3")
        ck.eq(state(root3), "committed", "restarted: step-3 shown")
        ck.eq(os.getxattr(root3, "user.shardfs.verified"), b"yes",
              "restarted: step-3 verified from the hashes kept in the store")
        check_tensors(ck, root3, expected(6), "restarted step-3", ["rows"])
        shutil.rmtree(root3)
        ck.ok(not os.path.exists(os.path.join(store, "step-3")),
              "restarted: shutil.rmtree removed step-3 from the store")
        # the killed save: saving again, so its saver removes it
        root4 = os.path.join(m.mnt, "step-4")
        ck.ok(wait_state(root4, "saving", BOUND_S) is not None,
              "restarted: the killed save step-4 is shown saving (%s)" % state(root4))
        try:
            shutil.rmtree(root4)
        except OSError as e:
            ck.ok(False, "restarted: shutil.rmtree of step-4: %s" % e)
        ck.ok(not os.path.exists(os.path.join(store, "step-4")),
              "restarted: shutil.rmtree removed the killed save step-4 from the store")
        ck.raises((errno.EROFS, errno.EPERM),
                  lambda: os.unlink(os.path.join(m.mnt, "found", "manifest.json")),
                  "restarted: found still read-only")
    run_user(env, ck)


def as_user(uid, argv, timeout=120):
    return subprocess.run(["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid,
                           "--clear-groups"] + argv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout)


def run_user(env, ck):
    """8. A user who is not root saves (a store they own, a root daemon
    with allow_other): the files are theirs, they remove the checkpoint
    with rm -rf through the mount, another user cannot."""
    store = env.path("store-user")
    os.makedirs(store)
    os.chown(store, sm.NOBODY, sm.NOBODY)
    with sm.Mount(env, store, ["-o", "allow_other"], name="user") as m:
        root = os.path.join(m.mnt, "u-1")
        p = as_user(sm.NOBODY, [PY, "-c", (
            "import sys; sys.path.insert(0, %r); import dcp_save_worker as w\n"
            "import torch.distributed._shard.checkpoint as dcp\n"
            "dcp.save_state_dict(w.full_tensors(), dcp.FileSystemWriter(%r), no_dist=True)"
        ) % (HERE, root)])
        ck.eq(p.returncode, 0, "nobody saved u-1 through the mount: %s" %
              p.stdout.decode(errors="replace")[-500:])
        ck.ok(wait_state(root, "committed", BOUND_S) is not None,
              "u-1 complete within %.0f s" % BOUND_S)
        st = os.stat(os.path.join(store, "u-1", ".metadata"))
        ck.eq(st.st_uid, sm.NOBODY, "u-1's files in the store belong to their saver")
        p = as_user(1234, ["rm", "-rf", root])
        ck.ok(p.returncode != 0 and os.path.exists(os.path.join(store, "u-1", ".metadata")),
              "another user (uid 1234) cannot remove u-1")
        p = as_user(sm.NOBODY, ["rm", "-rf", root])
        ck.eq(p.returncode, 0, "its saver removes u-1 with rm -rf: %s" %
              p.stdout.decode(errors="replace")[-300:])
        ck.ok(not os.path.exists(os.path.join(store, "u-1")), "u-1 gone from the store")

        # 9. an empty directory made through the mount goes as on a local
        # disk: rm -rf (it walks the empty tensors/ view first) or rmdir,
        # by its maker; not by another user; one with a shardfs/1
        # declaration in it stays (shardctl rm discards those)
        for how in (["rm", "-rf"], ["rmdir"]):
            d = os.path.join(m.mnt, "empty-" + how[0])
            p = as_user(sm.NOBODY, ["mkdir", d])
            ck.eq(p.returncode, 0, "nobody makes %s" % d)
            p = as_user(1234, how + [d])
            ck.ok(p.returncode != 0 and os.path.isdir(os.path.join(store, os.path.basename(d))),
                  "another user cannot remove the empty %s with %s" % (d, how[0]))
            p = as_user(sm.NOBODY, how + [d])
            ck.eq(p.returncode, 0, "%s of an empty directory made through the mount: %s" %
                  (" ".join(how), p.stdout.decode(errors="replace")[-300:]))
            ck.ok(not os.path.exists(os.path.join(store, os.path.basename(d))),
                  "%s: gone from the store" % how[0])
            ck.ok(not os.path.exists(d), "%s: gone from the mount" % how[0])


if __name__ == "__main__":
    sys.exit(sm.main(run))
