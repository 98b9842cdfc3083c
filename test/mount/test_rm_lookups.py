#!/usr/bin/python3
"""Mount test: deletes beside lookups in the mount's root never hang it.

After a delete (`shardctl rm`: user.shardfs.delete on the root) the daemon
invalidates the kernel's entry for the checkpoint. The kernel takes the
root's lock for that, and a client looking a name up in the root holds it
while its request waits for a daemon worker. The invalidation used to be
sent from the worker that answered the delete: with every worker (4 on 2
cores) blocked so, the lookups were never answered and the mount hung for
good; tools/soak.sh with 16 clients found it, and 6 mkdir + rm loops
beside 6 loops of stat() of missing names hung it within a second.

Here: the same loops for DURATION_S; every client operation must finish
within HANG_S, every mkdir and rm must succeed, every deleted checkpoint
must be gone from the store and from the mount, and the daemon must stay
up. On a hang the FUSE connection is aborted (fusectl) so that the test
can clean up, and the test fails.
"""

import errno
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

DURATION_S = 5.0
HANG_S = 10.0       # no operation finished for this long: a hang
NRM = 6
NLOOK = 6


def abort_connection(mnt):
    """Abort the FUSE connection of the mount at mnt (fusectl)."""
    dev = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            p = line.split()
            if p[4] == mnt:
                dev = p[2].split(":")[1]
    ctl = "/sys/fs/fuse/connections"
    if dev is None:
        return
    if not os.listdir(ctl):
        subprocess.run(["mount", "-t", "fusectl", "fusectl", ctl],
                       stderr=subprocess.DEVNULL)
    try:
        with open(os.path.join(ctl, dev, "abort"), "w") as f:
            f.write("1")
        print("aborted FUSE connection %s of %s" % (dev, mnt))
    except OSError as e:
        print("cannot abort FUSE connection %s of %s: %s" % (dev, mnt, e))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    m = sm.Mount(env, store, name="rm")
    m.start()
    stop = threading.Event()
    lock = threading.Lock()
    state = {"ops": 0, "last": time.monotonic(), "rm": 0, "look": 0}
    errors = []
    deleted = []

    def did(kind):
        with lock:
            state["ops"] += 1
            state[kind] += 1
            state["last"] = time.monotonic()

    def rm_loop(i):
        k = 0
        while not stop.is_set():
            name = "r%d-%d" % (i, k)
            k += 1
            try:
                os.mkdir(os.path.join(m.mnt, name))
                os.setxattr(m.mnt, "user.shardfs.delete", name.encode())
            except OSError as e:
                if not stop.is_set():
                    errors.append("mkdir + rm %s: %s" % (name, e))
                return
            with lock:
                deleted.append(name)
            did("rm")

    def look_loop(i):
        k = 0
        while not stop.is_set():
            k += 1
            try:
                os.stat(os.path.join(m.mnt, "missing-%d-%d" % (i, k)))
                errors.append("stat of a missing name succeeded")
                return
            except OSError as e:
                if e.errno != errno.ENOENT:
                    if not stop.is_set():
                        errors.append("stat of a missing name: %s" % e)
                    return
            did("look")

    threads = [threading.Thread(target=rm_loop, args=(i,), daemon=True) for i in range(NRM)]
    threads += [threading.Thread(target=look_loop, args=(i,), daemon=True)
                for i in range(NLOOK)]
    hung = False
    try:
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while time.monotonic() < t0 + DURATION_S:
            time.sleep(0.1)
            with lock:
                idle = time.monotonic() - state["last"]
            if idle > HANG_S:
                hung = True
                break
        stop.set()
        end = time.monotonic() + HANG_S
        for t in threads:
            t.join(timeout=max(0.1, end - time.monotonic()))
        hung = hung or any(t.is_alive() for t in threads)
        ck.ok(not hung, "no operation stuck for %.0fs (%d deletes, %d lookups done)" % (
            HANG_S, state["rm"], state["look"]))
        ck.ok(state["rm"] >= NRM and state["look"] >= NLOOK,
              "every loop made progress (%d deletes, %d lookups)" % (state["rm"], state["look"]))
        ck.eq(errors[:5], [], "client errors")
        if not hung:
            ck.ok(m.alive(), "daemon alive")
            left = [n for n in deleted if os.path.exists(os.path.join(store, n))]
            ck.eq(left[:5], [], "deleted checkpoints gone from the store")
            time.sleep(1.1)      # entries the invalidation may have missed expire
            listed = set(os.listdir(m.mnt))
            ck.eq(sorted(listed & set(deleted))[:5], [], "deleted checkpoints not listed")
    finally:
        stop.set()
        if hung:
            abort_connection(m.mnt)
            m.kill9()
        m.stop(raise_on_crash=not hung)


if __name__ == "__main__":
    sys.exit(sm.main(run))
