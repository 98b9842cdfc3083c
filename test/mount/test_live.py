#!/usr/bin/python3
"""test_live - the live store (issue 14, 4): checkpoints that appear in or
vanish from STORE while it is mounted.

Through one mount of a store that starts with one shardfs/1 checkpoint:
  1. `shardctl gen` writes a second one into the store: it is listed within
     2 s and every tensor reads back equal to its reference;
  2. a real torch 2.15 DCP checkpoint arrives the way a save writes it: its
     .distcp files first (not shown: a save still running), .metadata last:
     then it is listed within 2 s and every tensor is byte-exact
     (check_dcp_tree.py);
  3. a directory nobody recognizes appears: never listed;
  4. the first checkpoint's directory is removed from the store: it leaves
     the listing within 2 s and its path gives ENOENT, the others still read.
The daemon writes nothing into the store.
"""

import errno
import os
import shutil
import subprocess
import sys
import time

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                   os.path.join(TOP, "test", "fixtures"), "dcp", "torch-2.15")
CHECKER = os.path.join(TOP, "test", "interop", "check_dcp_tree.py")
BOUND_S = 2.0


def wait_listed(mnt, name, want, bound=BOUND_S):
    """Seconds until name is (want) or is not (not want) listed; None past bound."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        if (name in os.listdir(mnt)) == want:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def check_tensors(ck, root, ref, label):
    for n in sorted(ref.tensors):
        ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)), ref.tensor_bytes(n),
                    "%s: %s" % (label, n))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    env.gen(os.path.join(store, "step-1"), size="512K", seed=71, ref=False)
    with sm.Mount(env, store, name="live") as m:
        ck.eq(sorted(os.listdir(m.mnt)), ["step-1"], "the store's one checkpoint")

        # 1. a new shardfs/1 checkpoint
        ref_b = env.gen(os.path.join(store, "step-2"), size="512K", seed=72)
        dt = wait_listed(m.mnt, "step-2", True)
        ck.ok(dt is not None, "step-2 written by shardctl gen is listed within "
              "%.0fs (%s)" % (BOUND_S, dt))
        if dt is not None:
            check_tensors(ck, os.path.join(m.mnt, "step-2"), ref_b, "step-2")

        # 2. a DCP checkpoint whose .metadata comes last
        dst = os.path.join(store, "dcp-rows4")
        os.makedirs(dst)
        src = os.path.join(FIX, "rows4")
        for fn in sorted(os.listdir(src)):
            if fn != ".metadata":
                shutil.copy2(os.path.join(src, fn), os.path.join(dst, fn))
        time.sleep(1.5)
        ck.ok("dcp-rows4" not in os.listdir(m.mnt),
              "a DCP save without its .metadata yet is not listed")
        shutil.copy2(os.path.join(src, ".metadata"), os.path.join(dst, ".metadata"))
        dt = wait_listed(m.mnt, "dcp-rows4", True)
        ck.ok(dt is not None, "listed within %.0fs of its .metadata (%s)" % (
            BOUND_S, dt))
        if dt is not None:
            r = subprocess.run(["/usr/bin/python3", CHECKER,
                                os.path.join(m.mnt, "dcp-rows4"),
                                os.path.join(FIX, "rows4.expected.json")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=120)
            ck.ok(r.returncode == 0, "dcp-rows4 byte-exact: %s" %
                  r.stdout.decode(errors="replace")[-400:])

        # 3. an unrecognized directory
        os.makedirs(os.path.join(store, "notes"))
        with open(os.path.join(store, "notes", "todo.txt"), "w") as f:
            f.write("x\n")
        time.sleep(1.5)
        ck.ok("notes" not in os.listdir(m.mnt), "a directory no format "
              "recognizes is never listed")

        # 4. a checkpoint removed from the store
        shutil.rmtree(os.path.join(store, "step-1"))
        dt = wait_listed(m.mnt, "step-1", False)
        ck.ok(dt is not None, "step-1 removed from the store leaves the listing "
              "within %.0fs (%s)" % (BOUND_S, dt))
        try:
            os.stat(os.path.join(m.mnt, "step-1"))
            ck.ok(False, "stat of the removed checkpoint fails")
        except OSError as e:
            ck.eq(e.errno, errno.ENOENT, "stat of the removed checkpoint: ENOENT")
        check_tensors(ck, os.path.join(m.mnt, "step-2"), ref_b, "step-2 after")
        snap = sm.store_snapshot(store)
        time.sleep(1.2)  # two more rounds of the watcher
        ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(store)), [],
              "the daemon writes nothing into the store")
        ck.ok(m.alive(), "daemon alive")


if __name__ == "__main__":
    sys.exit(sm.main(run))
