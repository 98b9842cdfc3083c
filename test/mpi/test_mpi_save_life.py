#!/usr/bin/python3
"""MPI, the life cycle of a save through the mounts seen from a daemon
that holds none of its files (issue 26 items 3 and 5, SPEC 8): 2 MPI
daemons with node-local stores (owned by uid 65534, -o allow_other),
torch 1.13's save_state_dict (Debian's python3-torch, the stock
FileSystemWriter, no_dist) into rank 0's mount only.

  1. rotation through the other mount: `shutil.rmtree` of the save
     through rank 1's mount (store 1 holds nothing of it) by a user who
     did not save it (the store's owner) fails and removes nothing (so
     does its `shardctl rm`); by its
     saver, and by root, it removes the save from store 0 and its name
     from both mounts within 2 s; so does `shardctl rm` through rank 1;
  2. a checkpoint found in store 0 (torch saved into the store directly)
     stays read-only through rank 1's mount: rmtree and `shardctl rm`
     fail, nothing goes;
  3. a save through rank 0 only saved again by 2 ranks, each through
     its own mount (rank 1's held nothing of it): complete and verified on
     both with the new bytes, rank 1's file in store 1; rm -rf through
     rank 0 and at once through rank 1: both succeed, gone everywhere;
  4. a save killed before DCP's .metadata while a lookup on rank 1 had
     joined it (an empty directory in store 1), then both daemons
     restarted: rank 0 shows it as saving; saved again through rank 0 it
     is complete and verified on both with the new bytes, and rank 1 lets
     go of its joined directory (gone from store 1 within 2 s) as it does
     when it was not restarted; rmtree through rank 1 removes it from
     every store and mount within 2 s.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402
import savelib  # noqa: E402
from savelib import PY, read, state, xattr  # noqa: E402

NR = 2
WITHIN_S = 2.0
SEAL_S = 4.0
MOUNT = os.path.join(HERE, "..", "mount")
OTHER = 1234
OPTS = ["-o", "allow_other", "--log-level", "info"]


def as_uid(uid, argv, timeout=120):
    """argv as uid (root: as is); the CompletedProcess, output merged."""
    pre = [] if uid == 0 else ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid,
                               "--clear-groups"]
    return subprocess.run(pre + argv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout)


def save(uid, path, join=None, die=False, seed=5):
    """save_state_dict(no_dist) into path as uid; with join, its writer
    lists that path (a lookup on another mount) after the data files;
    with die, the process ends there (before DCP's .metadata)."""
    script = (
        "import os, sys; sys.path.insert(0, %r); import dcp_save_worker as w\n"
        "import torch.distributed._shard.checkpoint as dcp\n"
        "class Writer(dcp.FileSystemWriter):\n"
        "    def finish(self, metadata, results):\n"
        "        if %r: print('joined:', sorted(os.listdir(%r)), flush=True)\n"
        "        if %r: os._exit(3)\n"
        "        return super().finish(metadata, results)\n"
        "dcp.save_state_dict(w.full_tensors(%d), Writer(%r), no_dist=True)\n") % (
            MOUNT, bool(join), join or "", die, seed, path)
    p = as_uid(uid, [PY, "-c", script])
    return p.returncode, p.stdout.decode(errors="replace")


def rmtree(uid, path):
    """shutil.rmtree(path) as uid: "" or the error."""
    p = as_uid(uid, [PY, "-c", "import shutil, sys; shutil.rmtree(sys.argv[1])", path])
    return "" if p.returncode == 0 else p.stdout.decode(errors="replace").strip()[-300:]


def everywhere(c, name):
    """Where name still is: mounts and stores."""
    return [p for p in (c.mnt(0), c.mnt(1), c.store(0), c.store(1))
            if os.path.lexists(os.path.join(p, name))]


def gone_within(ck, c, name, label):
    dt = savelib.wait_until(lambda: not everywhere(c, name), WITHIN_S)
    ck.ok(dt is not None, "%s: gone from every mount and store within %.0f s (left: %s)"
          % (label, WITHIN_S, everywhere(c, name)))


def saved_on_both(ck, c, uid, name, seed=5):
    rc, out = save(uid, os.path.join(c.mnt(0), name), seed=seed)
    if not ck.eq(rc, 0, "%s: saved through rank 0 as uid %d: %s" % (name, uid, out[-500:])):
        return False
    return ck.ok(savelib.wait_until(lambda: all(
        state(os.path.join(c.mnt(r), name)) == "committed" for r in range(NR)), SEAL_S)
        is not None, "%s: complete on both daemons within %.0f s" % (name, SEAL_S))


def run_rotation(ck, c):
    # 1. rotation through rank 1's mount, which holds nothing of it
    for name, saver in (("rot-u", sm.NOBODY), ("rot-r", 0)):
        if not saved_on_both(ck, c, saver, name):
            print(c.log_text()[-3000:])
            return
        ck.eq(everywhere(c, name), [c.mnt(0), c.mnt(1), c.store(0)],
              "%s: held by store 0 only" % name)
    err = rmtree(sm.NOBODY, os.path.join(c.mnt(1), "rot-r"))
    ck.ok(err and "Permission denied" in err,
          "rot-r: its store's owner (not its saver) cannot remove it through rank 1: %r" % err)
    p = as_uid(sm.NOBODY, [c.env.shardctl, "rm", os.path.join(c.mnt(1), "rot-r")])
    ck.ok(p.returncode != 0 and b"Permission denied" in p.stdout,
          "rot-r: nor with shardctl rm through rank 1: %r" % p.stdout[-300:])
    ck.ok(os.path.exists(os.path.join(c.store(0), "rot-r", ".metadata")) and
          state(os.path.join(c.mnt(1), "rot-r")) == "committed",
          "rot-r: nothing removed by the refused rmtree and shardctl rm")
    import errno
    for k in range(2):
        ck.raises(errno.ENOTEMPTY, lambda: os.rmdir(os.path.join(c.mnt(1), "rot-r")),
                  "rot-r: a plain rmdir through rank 1 (nothing unlinked first), try %d" % k)
    ck.ok(os.path.exists(os.path.join(c.store(0), "rot-r", ".metadata")),
          "rot-r: nothing removed by the plain rmdir")
    for name, who in (("rot-u", sm.NOBODY), ("rot-r", 0)):
        err = rmtree(who, os.path.join(c.mnt(1), name))
        ck.eq(err, "", "%s: rmtree through rank 1 by uid %d" % (name, who))
        gone_within(ck, c, name, "%s (rmtree through rank 1)" % name)

    # `shardctl rm` through rank 1 too
    if saved_on_both(ck, c, 0, "rot-s"):
        p = as_uid(0, [c.env.shardctl, "rm", os.path.join(c.mnt(1), "rot-s")])
        ck.eq(p.returncode, 0, "rot-s: shardctl rm through rank 1: %s" %
              p.stdout.decode(errors="replace")[-300:])
        gone_within(ck, c, "rot-s", "rot-s (shardctl rm through rank 1)")

    # 2. found in the store: read-only through either mount
    found = os.path.join(c.store(0), "found")
    rc, out = save(0, found)
    ck.eq(rc, 0, "found: torch saved into store 0 directly: %s" % out[-300:])
    ck.ok(savelib.wait_until(lambda: state(os.path.join(c.mnt(1), "found")) == "committed",
                             SEAL_S) is not None, "found: shown by rank 1")
    err = rmtree(0, os.path.join(c.mnt(1), "found"))
    ck.ok(err and "Read-only file system" in err,
          "found: rmtree through rank 1 refused (read-only): %r" % err)
    p = as_uid(0, [c.env.shardctl, "rm", os.path.join(c.mnt(1), "found")])
    ck.ok(p.returncode != 0 and b"only reads" in p.stdout,
          "found: shardctl rm through rank 1 refuses and says why: %r" % p.stdout[-300:])
    ck.ok(os.path.exists(os.path.join(found, ".metadata")) and
          os.path.exists(os.path.join(found, "__0_0.distcp")),
          "found: its files stay in store 0")


def run_resave(ck, env, c):
    """A save through rank 0 only, saved again by 2 ranks through both
    mounts: rank 1's mount held none of the first save's files."""
    if not saved_on_both(ck, c, 0, "re"):
        return
    procs = savelib.start_ranks(env.path("init-re"),
                                [os.path.join(c.mnt(r), "re") for r in range(NR)], seed=10)
    if not ck.ok(savelib.wait_ranks(procs, 120),
                 "re: saved again by 2 ranks, each through its own mount"):
        return
    ck.ok(savelib.wait_until(lambda: all(
        state(os.path.join(c.mnt(r), "re")) == "committed" for r in range(NR)), SEAL_S)
        is not None, "re: complete on both daemons within %.0f s" % SEAL_S)
    want = savelib.expected(10)
    for r in range(NR):
        root = os.path.join(c.mnt(r), "re")
        ck.eq(xattr(root, "user.shardfs.verified"), b"yes", "re: rank %d verified" % r)
        for t in sorted(want):
            ck.bytes_eq(read(sm.tensor_path(root, t)), want[t],
                        "re: rank %d tensors/%s has the re-save's bytes" % (r, t))
    ck.ok(any(f.startswith("__1_") for f in os.listdir(os.path.join(c.store(1), "re"))),
          "re: rank 1's file of the re-save is in store 1")
    # rotation by two nodes' scripts, one after the other: rm -rf through
    # rank 0, then at once through rank 1 (its daemon drops the name a
    # moment after rank 0's rmdir returned): both succeed
    p = as_uid(0, ["sh", "-c", 'rm -rf "$1" || exit 7; rm -rf "$2"', "sh",
                   os.path.join(c.mnt(0), "re"), os.path.join(c.mnt(1), "re")])
    ck.eq(p.returncode, 0, "re: rm -rf through rank 0, then at once through rank 1 "
          "(nothing left to do): %s" % p.stdout.decode(errors="replace")[-300:])
    gone_within(ck, c, "re", "re (rmtree through rank 0, then rank 1)")


def run(env, ck):
    pattern = env.path("store%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
        os.chown(sfmpi.expand(pattern, r), sm.NOBODY, sm.NOBODY)
    os.chmod(env.tmp, 0o755)
    with sfmpi.Cluster(env, pattern, OPTS, nranks=NR, name="life") as c:
        run_rotation(ck, c)
        run_resave(ck, env, c)
        # 4. a join, the save killed before .metadata
        rc, out = save(0, os.path.join(c.mnt(0), "j"), join=os.path.join(c.mnt(1), "j"),
                       die=True)
        ck.ok(rc == 3 and "joined: [" in out, "j: the lookup on rank 1 joined, then the "
              "save died before .metadata: %s" % out[-300:])
        ck.ok(os.path.isdir(os.path.join(c.store(1), "j")),
              "j: rank 1 made the directory in its store when the lookup joined")
    with sfmpi.Cluster(env, pattern, OPTS, nranks=NR, name="life2") as c:
        ck.ok(os.path.isdir(os.path.join(c.store(1), "j")),
              "j: the joined directory is still in store 1 after the restart")
        ck.eq(savelib.wait_until(lambda: state(os.path.join(c.mnt(0), "j")) == "saving",
                                 WITHIN_S) is not None, True,
              "j: rank 0 shows the killed save as saving after the restart (%s)" %
              state(os.path.join(c.mnt(0), "j")))
        # saved again through rank 0: complete on both, rank 1 lets go
        if saved_on_both(ck, c, 0, "j", seed=9):
            ck.ok(savelib.wait_until(lambda: not os.path.exists(
                os.path.join(c.store(1), "j")), WITHIN_S) is not None,
                "j: rank 1's joined directory left store 1 within %.0f s" % WITHIN_S)
            want = savelib.expected(9)
            for r in range(NR):
                root = os.path.join(c.mnt(r), "j")
                ck.eq(xattr(root, "user.shardfs.verified"), b"yes", "j: rank %d verified" % r)
                ck.bytes_eq(read(sm.tensor_path(root, "rows")), want["rows"],
                            "j: rank %d tensors/rows has the re-save's bytes" % r)
        # removed through rank 1 (nothing of it there)
        err = rmtree(0, os.path.join(c.mnt(1), "j"))
        ck.eq(err, "", "j: rmtree through rank 1")
        gone_within(ck, c, "j", "j (re-saved after the restart, removed through rank 1)")
        if everywhere(c, "j"):
            print("rank 1 shows j as %r" % state(os.path.join(c.mnt(1), "j")))
            print("\n".join(ln for ln in c.log_text().splitlines() if '"j"' in ln)[-3000:])


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
