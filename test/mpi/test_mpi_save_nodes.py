#!/usr/bin/python3
"""MPI, one checkpoint name saved through the mounts of two nodes (issue
26 item 2, SPEC 8): 2 MPI daemons with node-local stores, torch 1.13's
save_state_dict (Debian's python3-torch, the stock FileSystemWriter,
no_dist: every process its own coordinator, as a job launched without
its process group does) into MNT0/NAME and MNT1/NAME, one right after
the other:

  1. the same state dict on both nodes (.metadata and __0_0.distcp with
     the same bytes in store 0 and store 1): one file each; both daemons
     show it complete and verified, tensors/ byte-exact;
  2. different state dicts under one name: no daemon shows it complete
     (3 s after the saves returned), and the daemons' log says, at
     warning level, which file differs between which nodes (ranks and
     host names);
  3. a save through rank 0's mount only (nothing looked up on rank 1
     while it runs): once rank 0 shows it complete, rank 1 shows it too,
     verified from the index rank 0 sealed it with, tensors/ byte-exact,
     torch's own files at its root byte-exact (fetched from rank 0).
"""

import os
import socket
import subprocess
import sys
import time

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


def save_both(ck, c, name, seeds):
    """One process: save_state_dict(no_dist) of full_tensors(seeds[r])
    into rank r's mount, r = 0, 1, back to back."""
    script = (
        "import sys; sys.path.insert(0, %r); import dcp_save_worker as w\n"
        "import torch.distributed._shard.checkpoint as dcp\n"
        "for path, seed in %r:\n"
        "    dcp.save_state_dict(w.full_tensors(seed), dcp.FileSystemWriter(path),"
        " no_dist=True)\n") % (MOUNT, [(os.path.join(c.mnt(r), name), s)
                                       for r, s in enumerate(seeds)])
    p = subprocess.run([PY, "-c", script], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    return ck.eq(p.returncode, 0, "%s: torch saved through both mounts: %s" % (
        name, p.stdout.decode(errors="replace")[-500:]))


def run(env, ck):
    pattern = env.path("store%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    log = env.path("daemons.log")
    with sfmpi.Cluster(env, pattern, ["--log-file", log], nranks=NR,
                       name="nodes") as c:
        # 1. the same bytes under one name on both nodes: one file
        if save_both(ck, c, "same", [5, 5]):
            dt = savelib.wait_until(lambda: all(
                state(os.path.join(c.mnt(r), "same")) == "committed"
                for r in range(NR)), WITHIN_S)
            ck.ok(dt is not None, "same: complete on both daemons within %.0f s (%s)" % (
                WITHIN_S, [state(os.path.join(c.mnt(r), "same")) for r in range(NR)]))
            for r in range(NR):
                ck.ok(os.path.exists(os.path.join(c.store(r), "same", ".metadata")),
                      "same: store %d holds its own .metadata" % r)
                root = os.path.join(c.mnt(r), "same")
                if dt is not None:
                    ck.eq(os.getxattr(root, "user.shardfs.verified"), b"yes",
                          "same: rank %d verified" % r)
                    want = expected(5)
                    ck.bytes_eq(sm.read_file(sm.tensor_path(root, "rows")), want["rows"],
                                "same: rank %d tensors/rows" % r)

        # 2. different bytes under one name: left out, said once per node
        if save_both(ck, c, "clash", [5, 6]):
            time.sleep(3.0)
            ck.eq([state(os.path.join(c.mnt(r), "clash")) == "committed" for r in range(NR)],
                  [False] * NR, "clash: no daemon shows it complete (%s)" % (
                      [state(os.path.join(c.mnt(r), "clash")) for r in range(NR)]))
            host = socket.gethostname()
            lines = [ln for ln in sm.read_text(log).splitlines() if "clash" in ln]
            said = [ln for ln in lines if "left out" in ln]
            ck.ok(said, "clash: the log says it is left out: %s" % lines[-5:])
            ck.ok(any("rank 0 (host %s)" % host in ln and "rank 1 (host %s)" % host in ln
                      for ln in said),
                  "clash: the line names both nodes, ranks and hosts: %s" % said[:2])
            ck.ok(any(".metadata" in ln or "__0_0.distcp" in ln for ln in said),
                  "clash: the line names the file: %s" % said[:2])
            ck.ok(said and all("shardfs: warning: " in ln for ln in said),
                  "clash: said at warning level: %s" % said[:2])

        # 3. saved through one node only: the other shows it verified
        saved_elsewhere(ck, c)


def saved_elsewhere(ck, c):
    """3. Saved through rank 0's mount only; rank 1 shows it verified."""
    if not save_both(ck, c, "only0", [5]):
        return
    root0, root1 = (os.path.join(c.mnt(r), "only0") for r in range(NR))
    ck.ok(savelib.wait_until(lambda: state(root0) == "committed", WITHIN_S) is not None,
          "only0: complete on rank 0 (%s)" % state(root0))
    # no lookup on rank 1 before: a lookup while it is saved joins the save
    dt = savelib.wait_until(lambda: "only0" in os.listdir(c.mnt(1)), WITHIN_S)
    if not ck.ok(dt is not None, "only0: listed on rank 1 within %.0f s" % WITHIN_S):
        return
    ck.eq(state(root1), "committed", "only0: complete on rank 1")
    ck.eq(os.getxattr(root1, "user.shardfs.verified"), b"yes",
          "only0: rank 1 verified (from rank 0's index)")
    want = expected(5)
    for t in sorted(want):
        ck.bytes_eq(sm.read_file(sm.tensor_path(root1, t)), want[t],
                    "only0: rank 1 tensors/%s" % t)
    for f in (".metadata", "__0_0.distcp"):
        got = savelib.read(os.path.join(root1, f))
        ck.bytes_eq(got, sm.read_file(os.path.join(c.store(0), "only0", f)),
                    "only0: rank 1 shows torch's %s (rank 0's), byte-exact" % f)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
