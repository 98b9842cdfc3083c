#!/usr/bin/python3
"""Mount test: kill -9 of the daemon in the middle of writing (SPEC 4, 6).

1. On an empty store, write and commit checkpoint A (tools/shardfs_save.py),
   and record a hash of every file of STORE/A.
2. Start checkpoint B: a flat tensor written and closed (b.done), one of the
   two boxes of b.box written and closed, the other box half written on an
   open handle, and a large streaming `dd bs=1M` into b.big fed from a pipe:
   it has 48 MiB in and is waiting for more (so it is certainly mid-write,
   not finished) when the daemon is killed with SIGKILL.
3. Unmount the dead mount (fusermount3 -u, umount -l as the last resort),
   restart the daemon on the same store:
   - A: state committed, every tensor byte for byte, every store file of A
     unchanged;
   - B: listed, state `writing`, no manifest.json; its declarations survive;
   - finishing B's missing pieces (the second box, b.big; b.done is NOT
     rewritten, so it must have been resumed from the journal) and
     committing works, and everything reads back equal.
"""

import hashlib
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import sfmount as sm  # noqa: E402
import shardfs_save as sfs  # noqa: E402

MIB = 1 << 20
BIG = 96 * MIB              # b.big, U8 [BIG]
FED_BEFORE_KILL = 48 * MIB  # what dd has been given when the daemon dies
WAIT_S = 30.0               # bound on waiting for the daemon to store it


def tree_hashes(top):
    """{relative path: sha256} of every file under top."""
    out = {}
    for dirpath, _, files in os.walk(top):
        for f in files:
            p = os.path.join(dirpath, f)
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(MIB), b""):
                    h.update(chunk)
            out[os.path.relpath(p, top)] = h.hexdigest()
    return out


def du(top):
    total = 0
    for dirpath, _, files in os.walk(top):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def sha_of_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def check_a(ck, mnt, ref, label):
    root = os.path.join(mnt, "A")
    ck.eq(sfs.state(mnt, "A"), "committed", "%s: state of A" % label)
    for name, want in sorted(ref.items()):
        try:
            ck.bytes_eq(sm.read_file(sm.tensor_path(root, name)), want, "%s: A/%s" % (label, name))
        except OSError as e:
            ck.ok(False, "%s: A/%s: %s" % (label, name, e))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    rng = np.random.default_rng(env.rng.randrange(1 << 30))
    a_w = rng.standard_normal((256, 512)).astype(np.float32)
    a_e = rng.integers(0, 1 << 16, (1024, 300), dtype=np.uint16)
    ref_a = {"w": a_w.tobytes(), "emb": a_e.tobytes()}
    b_done = rng.integers(-1000, 1000, (4096,), dtype=np.int32)
    b_box = rng.standard_normal((64, 32)).astype(np.float32)
    big_src = env.path("big.src")
    with open(big_src, "wb") as f:
        for _ in range(BIG // MIB):
            f.write(rng.bytes(MIB))

    m = sm.Mount(env, store, name="first")
    m.start()
    try:
        sfs.save(m.mnt, "A", [
            sfs.Shard("w", a_w[:100], shape=a_w.shape, offsets=[0, 0]),
            sfs.Shard("w", a_w[100:], shape=a_w.shape, offsets=[100, 0]),
            sfs.Shard("emb", a_e.tobytes()[:250000], shape=a_e.shape, flat=0, dtype="U16"),
            sfs.Shard("emb", a_e.tobytes()[250000:], shape=a_e.shape, flat=250000, dtype="U16"),
        ])
        check_a(ck, m.mnt, ref_a, "before the crash")
        hashes_a = tree_hashes(os.path.join(store, "A"))
        ck.ok("manifest.json" in hashes_a, "A has manifest.json in the store")

        # B: one finished flat tensor, one finished box of two, a half box
        sfs.save(m.mnt, "B", [sfs.Shard("b.done", b_done),
                              sfs.Shard("b.box", b_box[:32], shape=b_box.shape, offsets=[0, 0])],
                 commit=False)
        sfs.declare(m.mnt, "B", "b.big", "U8", [BIG])
        dd = subprocess.Popen(["dd", "of=" + sm.tensor_path(os.path.join(m.mnt, "B"), "b.big"),
                               "bs=1M", "iflag=fullblock", "status=none"],
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        # opened after the fork: a child closing a copy would flush the box
        half = os.open(sm.tensor_path(os.path.join(m.mnt, "B"), "b.box", "32:64,:"), os.O_WRONLY)
        os.write(half, b_box[32:].tobytes()[:3000])
        def feed():
            try:
                with open(big_src, "rb") as f:
                    dd.stdin.write(f.read(FED_BEFORE_KILL))
                    dd.stdin.flush()
            except OSError:       # dd died: reported by the checks below
                pass

        feeder = threading.Thread(target=feed, daemon=True)
        try:
            feeder.start()
            feeder.join(timeout=WAIT_S)   # a hung daemon must not hang the test
            ck.ok(not feeder.is_alive(), "dd took %d MiB within %.0fs" % (
                FED_BEFORE_KILL // MIB, WAIT_S))
            rank_dir = os.path.join(store, "B", "rank-00000")
            deadline = time.monotonic() + WAIT_S
            while du(rank_dir) < FED_BEFORE_KILL // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            stored = du(rank_dir)
            print("B payloads on disk at the kill: %.1f MiB" % (stored / MIB))
            ck.ok(stored >= FED_BEFORE_KILL // 2, "dd's bytes reach the store before the kill "
                  "(%d of %d fed)" % (stored, FED_BEFORE_KILL))
            ck.ok(dd.poll() is None, "dd is still writing when the daemon is killed")
            m.proc.kill()                                   # kill -9, mid-write
            m.proc.wait(timeout=10)
        finally:
            if not feeder.is_alive():
                try:                  # one more block: dd's write meets the dead daemon
                    dd.stdin.write(b"\0" * MIB)
                    dd.stdin.close()
                except OSError:
                    pass
            try:
                dd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                dd.kill()
                dd.wait(timeout=10)
            try:
                os.close(half)
            except OSError:
                pass
        ck.ok(dd.returncode != 0, "dd fails once the daemon is gone (rc %s)" % dd.returncode)
    finally:
        m.stop(raise_on_crash=False)        # it died by our SIGKILL: expected
    ck.ok(not sm.is_mounted(m.mnt), "the dead mount is gone")
    ck.ok(not os.path.exists(os.path.join(store, "B", "manifest.json")),
          "B has no manifest.json after the crash")

    with sm.Mount(env, store, name="restarted") as m:
        ck.eq(sorted(os.listdir(m.mnt)), ["A", "B"], "checkpoints after the restart")
        check_a(ck, m.mnt, ref_a, "after the restart")
        ck.eq(tree_hashes(os.path.join(store, "A")), hashes_a, "every store file of A unchanged")
        try:
            ck.eq(sfs.state(m.mnt, "B"), "writing", "B resumes as writing")
        except OSError as e:
            ck.ok(False, "state of B: %s" % e)
        bt = os.path.join(m.mnt, "B", "tensors")
        for name, dt in (("b.done", b"I32"), ("b.box", b"F32"), ("b.big", b"U8")):
            try:
                ck.eq(os.getxattr(os.path.join(bt, name), "user.shardfs.dtype"), dt,
                      "declaration of %s survives the crash" % name)
            except OSError as e:
                ck.ok(False, "declaration of %s after the crash: %s" % (name, e))
        # finish B: the second box and b.big (b.done must come from the journal)
        try:
            sfs.save(m.mnt, "B", [sfs.Shard("b.box", b_box[32:], shape=b_box.shape,
                                            offsets=[32, 0])], commit=False)
            r = subprocess.run(["dd", "if=" + big_src, "of=" + os.path.join(bt, "b.big"),
                                "bs=1M", "status=none"], stderr=subprocess.PIPE, timeout=120)
            ck.eq(r.returncode, 0, "dd of b.big after the restart: %s" % r.stderr.decode()[-300:])
            sfs.commit(m.mnt, "B")
        except OSError as e:
            ck.ok(False, "finishing B after the restart: %s" % e)
        ck.eq(sfs.state(m.mnt, "B"), "committed", "B committed after finishing it")
        root = os.path.join(m.mnt, "B")
        for name, want in (("b.done", b_done.tobytes()), ("b.box", b_box.tobytes())):
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, name)), want, "B/%s" % name)
            except OSError as e:
                ck.ok(False, "B/%s: %s" % (name, e))
        try:
            ck.eq(sha_of_file(sm.tensor_path(root, "b.big")), sha_of_file(big_src),
                  "B/b.big (sha256 of %d bytes)" % BIG)
        except OSError as e:
            ck.ok(False, "B/b.big: %s" % e)
        check_a(ck, m.mnt, ref_a, "after committing B")
        ck.ok(m.alive(), "restarted daemon alive")


if __name__ == "__main__":
    sys.exit(sm.main(run))
