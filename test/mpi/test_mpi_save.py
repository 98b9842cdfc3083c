#!/usr/bin/python3
"""MPI, a framework saving through the mounts (issue 26 items 2-5, SPEC
sections 2 and 8): torch 1.13's save_state_dict (Debian's python3-torch,
gloo, 4 processes, the stock FileSystemWriter), rank r saving into the
mount of daemon r; 4 MPI daemons with node-local stores store0..3.

  1. a save whose rank 2 stalls before its data: no daemon shows it
     complete while it runs; rank 2 killed (kill -9), then the others:
     never complete on any daemon (4 s later), its files stay;
  2. a full save: every daemon shows it complete within 2 s of the save's
     end, verified = yes; tensors/ and torch's own files at the root are
     byte-exact on every daemon; rank r's files only in store r (the
     .metadata in store 0 only);
  3. load_state_dict through another rank's mount gives the saved
     tensors;
  4. one byte flipped on disk in store 1 after a save: reading what lies
     there fails with EIO on every daemon, never wrong bytes;
  5. rotation: shutil.rmtree through one mount removes the save's files
     from every store and its name from every mount; a re-save of the
     same name comes back complete with the new values.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

NR = 4
import savelib  # noqa: E402
from savelib import PY, WORKER, expected, state  # noqa: E402
WITHIN_S = 2.0


def wait_all_committed(c, name, bound):
    return savelib.wait_until(lambda: all(
        state(os.path.join(c.mnt(r), name)) == "committed" for r in range(NR)), bound)


def start_ranks(env, c, name, tag, stall=-1, seed=5):
    return savelib.start_ranks(env.path("init-%s" % tag),
                               [os.path.join(c.mnt(r), name) for r in range(NR)],
                               stall, seed)


def save(env, ck, c, name, tag, seed=5):
    ok = savelib.wait_ranks(start_ranks(env, c, name, tag, seed=seed), 180)
    ck.ok(ok, "%s: save_state_dict through %d mounts succeeded on every rank" % (tag, NR))
    return ok


def store_files(c, r, name):
    d = os.path.join(c.store(r), name)
    try:
        return sorted(f for f in os.listdir(d)
                      if not f.startswith(".shardfs") and f != "shardfs.index.json")
    except OSError:
        return []


def run(env, ck):
    pattern = env.path("store%r")
    for r in range(NR):
        os.makedirs(sfmpi.expand(pattern, r))
    os.chmod(env.tmp, 0o755)
    want = expected()
    with sfmpi.Cluster(env, pattern, ["--log-level", "info"], nranks=NR,
                       name="save") as c:
        # 1. a save killed midway: never complete anywhere
        procs = start_ranks(env, c, "killed", "killed", stall=2)
        line = procs[2].stdout.readline()
        ck.eq(line.strip(), b"stalled", "killed: rank 2 reached its data")
        time.sleep(2.0)  # the others write their files meanwhile
        ck.eq([state(os.path.join(c.mnt(r), "killed")) == "committed" for r in range(NR)],
              [False] * NR, "killed: no daemon shows it complete while rank 2 stalls")
        procs[2].send_signal(signal.SIGKILL)
        time.sleep(0.5)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)
        time.sleep(4.0)
        ck.eq([state(os.path.join(c.mnt(r), "killed")) == "committed" for r in range(NR)],
              [False] * NR, "killed: never complete on any daemon (4 s after the kill)")
        ck.ok(any(store_files(c, r, "killed") for r in range(NR)),
              "killed: its files stay in the stores")

        # 2. a full save through the 4 mounts
        if not save(env, ck, c, "step-1", "step-1"):
            print(c.log_text()[-4000:])
            return
        dt = wait_all_committed(c, "step-1", WITHIN_S)
        ck.ok(dt is not None, "step-1 complete on every daemon within %.0f s (%s)" % (
            WITHIN_S, [state(os.path.join(c.mnt(r), "step-1")) for r in range(NR)]))
        if dt is None:
            print(c.log_text()[-6000:])
            return
        print("step-1 complete on every daemon %.2f s after the save returned" % dt)
        for r in range(NR):
            fs_r = store_files(c, r, "step-1")
            ck.ok(fs_r and all(f.startswith("__%d_" % r) and f.endswith(".distcp")
                               for f in fs_r if f != ".metadata"),
                  "store %d holds rank %d's files only: %s" % (r, r, fs_r))
            ck.eq(".metadata" in fs_r, r == 0, "store %d: .metadata only in store 0" % r)
        raw = {}
        for r in range(NR):
            for f in store_files(c, r, "step-1"):
                raw[f] = sm.read_file(os.path.join(c.store(r), "step-1", f))
        for r in range(NR):
            root = os.path.join(c.mnt(r), "step-1")
            try:
                v = os.getxattr(root, "user.shardfs.verified")
            except OSError as e:
                v = str(e).encode()
            ck.eq(v, b"yes", "rank %d: step-1 verified from the write-time hashes" % r)
            for t in sorted(want):
                try:
                    got = sm.read_file(sm.tensor_path(root, t))
                except OSError as e:
                    got = str(e).encode()
                ck.bytes_eq(got, want[t], "rank %d: tensors/%s byte-exact" % (r, t))
            for f, b in sorted(raw.items()):
                try:
                    got = sm.read_file(os.path.join(root, f))
                except OSError as e:
                    got = str(e).encode()
                ck.bytes_eq(got, b, "rank %d: torch's own %s at the root byte-exact" % (r, f))

        # 3. load_state_dict through rank 3's mount (files on every node)
        out = env.path("loaded")
        p = subprocess.run([PY, WORKER, "load", os.path.join(c.mnt(3), "step-1"), out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        if ck.eq(p.returncode, 0, "load_state_dict through rank 3's mount: %s" %
                 p.stdout.decode(errors="replace")[-1500:]):
            import numpy as np
            for k in sorted(want):
                ck.bytes_eq(np.load(os.path.join(out, k + ".npy")).tobytes(), want[k],
                            "load_state_dict through rank 3's mount: %s" % k)

        # 4. a byte flipped in store 1 after a save (read nowhere before)
        if save(env, ck, c, "step-2", "step-2", seed=6) and \
                wait_all_committed(c, "step-2", WITHIN_S) is not None:
            want6 = expected(6)
            path = os.path.join(c.store(1), "step-2", "__1_0.distcp")
            with open(path, "r+b") as fh:
                fh.seek(os.path.getsize(path) // 3)
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0x5A]))
            for r in range(NR):
                root = os.path.join(c.mnt(r), "step-2")
                ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, "rows")),
                          "rank %d: tensors/rows after a byte of store 1's file flipped" % r)
                ck.raises(errno.EIO, lambda: sm.read_file(os.path.join(root, "__1_0.distcp")),
                          "rank %d: __1_0.distcp after a byte flipped in store 1" % r)
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, "bias")), want6["bias"],
                            "rank %d: step-2 tensors/bias still reads" % r)
        else:
            ck.ok(False, "step-2 saved and complete on every daemon")

        # 5. rotation through rank 2's mount, then a re-save of step-1
        try:
            shutil.rmtree(os.path.join(c.mnt(2), "step-1"))
            ck.ok(True, "shutil.rmtree of step-1 through rank 2's mount")
        except OSError as e:
            ck.ok(False, "shutil.rmtree of step-1 through rank 2's mount: %s" % e)
            print("\n".join(ln for ln in c.log_text().splitlines()
                            if "step-1" in ln and "since indexing" not in ln)[-6000:])
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and any(
                "step-1" in os.listdir(c.mnt(r)) for r in range(NR)):
            time.sleep(0.05)
        ck.eq([r for r in range(NR) if "step-1" in os.listdir(c.mnt(r))], [],
              "rmtree through rank 2: step-1 gone from every mount (%.2f s)" % (
                  time.monotonic() - t0))
        ck.eq([r for r in range(NR) if store_files(c, r, "step-1")], [],
              "rmtree through rank 2: step-1's files gone from every store")
        if save(env, ck, c, "step-1", "step-1 again", seed=7) and \
                wait_all_committed(c, "step-1", WITHIN_S) is not None:
            want7 = expected(7)
            for r in range(NR):
                root = os.path.join(c.mnt(r), "step-1")
                for t in sorted(want7):
                    try:
                        got = sm.read_file(sm.tensor_path(root, t))
                    except OSError as e:
                        got = str(e).encode()
                    ck.bytes_eq(got, want7[t], "re-saved step-1: rank %d tensors/%s" % (r, t))
        else:
            ck.ok(False, "step-1 saved again and complete on every daemon")
            print(c.log_text()[-4000:])


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
