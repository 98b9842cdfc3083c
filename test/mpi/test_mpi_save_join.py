#!/usr/bin/python3
"""MPI, a daemon that a lookup joined to a save but that no file was
saved through (issue 26 item 2, SPEC 8): 2 MPI daemons with node-local
stores, torch 1.13's save_state_dict (Debian's python3-torch, the stock
FileSystemWriter, no_dist) into rank 0's mount only; while it runs (its
data files written, DCP's .metadata not yet) a process looks the name up
on rank 1's mount (`ls MNT1/NAME`), which joins the save there (an empty
directory in store 1). Once the save returned:

  1. rank 0 shows it complete and verified (the directory rank 1 made
     does not keep the save open);
  2. rank 1 ends up like a daemon that did not join: complete, verified
     from the index rank 0 sealed it with, tensors/ and torch's own files
     at its root byte-exact (fetched from rank 0), and store 1 holds
     none of the save's files;
  3. `shutil.rmtree` of it through rank 0's mount (rotation) removes it
     from every store and mount, rank 1's included.
"""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402
import savelib  # noqa: E402
from savelib import PY, expected, state  # noqa: E402

NR = 2
WITHIN_S = 4.0
MOUNT = os.path.join(HERE, "..", "mount")


def save_joined(ck, c, name):
    """One process: save_state_dict(no_dist) into rank 0's mount; its
    writer lists MNT1/NAME after the data files, before .metadata."""
    script = (
        "import os, sys; sys.path.insert(0, %r); import dcp_save_worker as w\n"
        "import torch.distributed._shard.checkpoint as dcp\n"
        "class Writer(dcp.FileSystemWriter):\n"
        "    def finish(self, metadata, results):\n"
        "        print('joined:', sorted(os.listdir(%r)), flush=True)\n"
        "        return super().finish(metadata, results)\n"
        "dcp.save_state_dict(w.full_tensors(5), Writer(%r), no_dist=True)\n") % (
            MOUNT, os.path.join(c.mnt(1), name), os.path.join(c.mnt(0), name))
    p = subprocess.run([PY, "-c", script], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode(errors="replace")
    return ck.eq(p.returncode, 0, "%s: torch saved through rank 0, listed on rank 1: %s" % (
        name, out[-500:])) and ck.ok("joined: [" in out,
                                     "%s: the lookup on rank 1 joined the save: %s" % (
                                         name, out[-300:]))


def run(env, ck):
    pattern = env.path("store%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    with sfmpi.Cluster(env, pattern, nranks=NR, name="join") as c:
        name = "joined"
        if not save_joined(ck, c, name):
            return
        ck.ok(os.path.isdir(os.path.join(c.store(1), name)),
              "joined: rank 1 made the directory in its store when the lookup joined")
        root0, root1 = (os.path.join(c.mnt(r), name) for r in range(NR))
        # 1. the joined directory does not keep the save open
        ck.ok(savelib.wait_until(lambda: state(root0) == "committed", WITHIN_S)
              is not None, "joined: complete on rank 0 within %.0f s (%s)" % (
                  WITHIN_S, state(root0)))
        # 2. rank 1 as if it had not joined
        ck.ok(savelib.wait_until(lambda: state(root1) == "committed", WITHIN_S)
              is not None, "joined: complete on rank 1 within %.0f s (%s)" % (
                  WITHIN_S, state(root1)))
        for r, root in ((0, root0), (1, root1)):
            ck.eq(savelib.xattr(root, "user.shardfs.verified"), b"yes",
                  "joined: rank %d verified" % r)
        want = expected(5)
        for t in sorted(want):
            ck.bytes_eq(savelib.read(sm.tensor_path(root1, t)), want[t],
                        "joined: rank 1 tensors/%s" % t)
        for f in (".metadata", "__0_0.distcp"):
            got = savelib.read(os.path.join(root1, f))
            ck.bytes_eq(got, sm.read_file(os.path.join(c.store(0), name, f)),
                        "joined: rank 1 shows torch's %s (rank 0's), byte-exact" % f)
        d1 = os.path.join(c.store(1), name)
        left = sorted(os.listdir(d1)) if os.path.isdir(d1) else []
        ck.ok(not [f for f in left if f in (".metadata", "__0_0.distcp") or
                   f.startswith("shardfs.")],
              "joined: store 1 holds none of the save's files (%s)" % left)
        # 3. rotation through the saver's daemon
        try:
            shutil.rmtree(root0)
            err = None
        except OSError as e:
            err = e
        ck.ok(err is None, "joined: rmtree through rank 0: %s" % err)
        gone = savelib.wait_until(lambda: all(
            not os.path.exists(os.path.join(p, name))
            for p in (c.mnt(0), c.mnt(1), c.store(0), c.store(1))), WITHIN_S)
        ck.ok(gone is not None, "joined: gone from every mount and store within %.0f s" % WITHIN_S)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
