#!/usr/bin/python3
"""Mount test: blocks served from leased mappings of the payload files
(issue 12, item 2), and payload files changed under them.

A llama-layout checkpoint with 256 KiB blocks (the engine maps plain
blocks of 64 KiB or more) is mounted with --log-level info and every tensor read once
(blocks mapped, verified and cached; the mount's page cache keeps what
was read). First, on a mount with a 1 MiB cache (leases dropped and
taken again all the time through the same descriptors), six rounds of
reading everything anew while another process opens every payload file
for writing: every break must reach the daemon's handler. Then, while the
daemon serves, another process
  trunc  cuts one payload file to a third of its length, and
  flip   overwrites one byte in place in another payload file.
Each change must wait only for the daemon to copy its mapped blocks and
drop its lease (a few seconds at most, not the kernel's lease-break-time),
and afterwards every read of every tensor (through the mount's page
cache, then through a second mount that fetches everything again) gives
the reference's bytes or fails with EIO, never other bytes; the daemon
never dies. The daemon's closing line counts mapped blocks.

Last (root only: it sets the system's lease-break-time to 1 s for the
while, and puts it back), a lease the kernel revokes: with every block of
a fresh checkpoint mapped and cached, the daemon is stopped (SIGSTOP), a
writer opens a payload file (the kernel revokes the daemon's lease after
the 1 s) and flips a byte, and the daemon goes on (SIGCONT): its copies of
the mappings come too late, so the blocks of that file must be fetched
and verified anew (the tensor holding the flipped byte fails with EIO),
never served as they now are; the log says why."""

import errno
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

GEN = dict(layout="llama", ranks=3, size="8M", seed=71, block_size="256K")


def change(path, how):
    """In a child process (the daemon's lease must be broken by someone
    else): open for writing and close, truncate to a third, or flip one
    byte in place. Seconds taken."""
    if how == "open":
        code = "import sys; open(sys.argv[1], 'r+b').close()"
    elif how == "trunc":
        code = "import os,sys; os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) // 3)"
    else:
        code = ("import sys; f = open(sys.argv[1], 'r+b'); f.seek(100); b = f.read(1); "
                "f.seek(100); f.write(bytes([b[0] ^ 0xFF])); f.close()")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)
    return time.monotonic() - t0


def read_all(ck, root, ref, label):
    """Every tensor: the reference's bytes or EIO. Returns (good, eio)."""
    good = eio = 0
    for name in sorted(ref.tensors):
        try:
            got = sm.read_file(sm.tensor_path(root, name))
        except OSError as e:
            ck.eq(e.errno, errno.EIO, "%s: tensors/%s fails only with EIO" % (label, name))
            eio += 1
            continue
        ck.bytes_eq(got, ref.tensor_bytes(name), "%s: tensors/%s" % (label, name))
        good += 1
    return good, eio


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "c"), **GEN)
    man = sm.manifest_of(os.path.join(store, "c"))
    files = sorted({s["file"] for t in man["tensors"].values() for s in t["shards"]})
    if not ck.ok(len(files) >= 2, "at least two payload files"):
        return
    # Breaks again and again through descriptors that stay open: a 1 MiB
    # cache unmaps blocks (and drops leases) all the time, the mount's
    # page cache is dropped so every round is served anew, and a writer
    # opens a payload file each round. The daemon must survive each break.
    with sm.Mount(env, store, opts=["--cache-mb", "1"], name="rebreak") as m:
        root = os.path.join(m.mnt, "c")
        for rnd in range(6):
            for name in sorted(ref.tensors):
                fd = os.open(sm.tensor_path(root, name), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            good, eio = read_all(ck, root, ref, "rebreak %d" % rnd)
            ck.eq(eio, 0, "rebreak %d: every tensor reads" % rnd)
            for f in files:  # whichever still has mapped blocks
                took = change(os.path.join(store, "c", f), "open")
                ck.ok(took < 10, "rebreak %d: the writer of %s waited %.2f s (< 10 s)"
                      % (rnd, f, took))
            ck.ok(m.alive(), "rebreak %d: the daemon serves" % rnd)
    with sm.Mount(env, store, opts=["--log-level", "info"], name="mapped") as m:
        root = os.path.join(m.mnt, "c")
        good, eio = read_all(ck, root, ref, "before")
        ck.eq(eio, 0, "before: every tensor reads")
        for how, f in (("trunc", files[0]), ("flip", files[-1])):
            took = change(os.path.join(store, "c", f), how)
            print("%s %s: %.2f s" % (how, f, took))
            ck.ok(took < 10, "%s: the change waited %.2f s (< 10 s)" % (how, took))
            read_all(ck, root, ref, "after " + how)
            ck.ok(m.alive(), "%s: the daemon serves" % how)
    ck.ok(re.search(r"misses \([1-9][0-9]* mapped\)", m.log_text()),
          "the daemon mapped blocks: %s" % [l for l in m.log_text().splitlines()
                                            if "engine:" in l])
    # A fresh daemon fetches everything again: damaged parts fail with EIO.
    with sm.Mount(env, store, name="again") as m2:
        good, eio = read_all(ck, os.path.join(m2.mnt, "c"), ref, "fresh mount")
        ck.ok(eio > 0, "fresh mount: the damaged tensors fail (%d of %d)" % (eio, good + eio))
        ck.ok(m2.alive(), "fresh mount: the daemon serves")
    revoked(env, ck)


LEASE_BREAK = "/proc/sys/fs/lease-break-time"


def revoked(env, ck):
    if os.geteuid() != 0 or not os.access(LEASE_BREAK, os.W_OK):
        print("revoked lease: skipped: setting %s needs root" % LEASE_BREAK)
        return
    store = env.path("store-revoked")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "c"), **GEN)
    man = sm.manifest_of(os.path.join(store, "c"))
    f = sorted({s["file"] for t in man["tensors"].values() for s in t["shards"]})[0]
    victims = [n for n, t in man["tensors"].items() for s in t["shards"]
               if s["file"] == f and s["file_offset"] <= 100 < s["file_offset"] + s["nbytes"]]
    if not ck.ok(len(victims) == 1, "revoked: one tensor holds byte 100 of %s" % f):
        return
    with open(LEASE_BREAK) as fh:
        old = fh.read().strip()
    try:
        with open(LEASE_BREAK, "w") as fh:
            fh.write("1\n")
        with sm.Mount(env, store, opts=["--cache-mb", "256", "--log-level", "info"],
                      name="revoked") as m:
            root = os.path.join(m.mnt, "c")
            good, eio = read_all(ck, root, ref, "revoked, before")
            ck.eq(eio, 0, "revoked, before: every tensor reads")
            os.kill(m.proc.pid, signal.SIGSTOP)
            try:
                took = change(os.path.join(store, "c", f), "flip")
            finally:
                os.kill(m.proc.pid, signal.SIGCONT)
            print("revoked: the writer of %s waited %.2f s" % (f, took))
            ck.ok(0.5 <= took < 10, "revoked: the writer waited for the kernel to revoke "
                  "the stopped daemon's lease (%.2f s)" % took)
            time.sleep(1.0)  # the daemon's break thread runs
            for name in sorted(ref.tensors):
                fd = os.open(sm.tensor_path(root, name), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            read_all(ck, root, ref, "revoked, after")
            try:
                sm.read_file(sm.tensor_path(root, victims[0]))
                ck.ok(False, "revoked: tensors/%s (the flipped byte) fails" % victims[0])
            except OSError as e:
                ck.eq(e.errno, errno.EIO, "revoked: tensors/%s fails with EIO" % victims[0])
            ck.ok(m.alive(), "revoked: the daemon serves")
        log = m.log_text()
        mapped = re.search(r"misses \(([0-9]+) mapped", log)
        if mapped and int(mapped.group(1)) > 0:
            ck.ok("changed before its mapped blocks were copied" in log,
                  "revoked: the log says the file changed before the copies")
        else:
            print("revoked lease: the daemon mapped no block (leases not usable here); "
                  "only the bytes were checked")
    finally:
        with open(LEASE_BREAK, "w") as fh:
            fh.write(old + "\n")


if __name__ == "__main__":
    sys.exit(sm.main(run))
