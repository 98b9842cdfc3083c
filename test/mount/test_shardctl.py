#!/usr/bin/python3
"""Mount test: shardctl as a user meets it (issue "safe and at home").

gen never destroys what it did not write: an existing checkpoint is
refused without --force (exit 1, bytes unchanged), --force overwrites a
shardfs checkpoint but never one a mount serves nor anything else (a
directory of files, a PyTorch DCP checkpoint), and an empty directory is
fine. The mount's source in /proc/mounts names its store. gen's scale
layouts (--layout many, --sparse) make what they say, verifiably.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def mount_source(mnt):
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and fields[1] == os.path.abspath(mnt):
                return fields[0], fields[2]
    return None, None


def check_gen(env, ck):
    store = env.path("store")
    os.makedirs(store)
    a = os.path.join(store, "ck-a")
    env.gen(a, size="128K", ref=False)
    snap = sm.store_snapshot(a)
    r = env.shardctl_run("gen", "--size", "128K", "--seed", "2", a, check=False)
    ck.eq(r.returncode, 1, "gen over an existing checkpoint without --force fails")
    ck.ok(b"--force" in r.stderr, "and says --force: %r" % r.stderr)
    ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(a)), [],
          "the existing checkpoint is unchanged")

    junk = os.path.join(store, "junk")
    os.makedirs(junk)
    with open(os.path.join(junk, "notes.txt"), "w") as f:
        f.write("mine\n")
    snap_junk = sm.store_snapshot(junk)
    r = env.shardctl_run("gen", "--force", "--size", "128K", junk, check=False)
    ck.eq(r.returncode, 1, "gen --force over a directory of files fails")
    ck.ok(b"not a shardfs checkpoint" in r.stderr, "and says why: %r" % r.stderr)
    ck.eq(sm.snapshot_diff(snap_junk, sm.store_snapshot(junk)), [],
          "the directory of files is unchanged")

    empty = os.path.join(store, "empty")
    os.makedirs(empty)
    r = env.shardctl_run("gen", "--size", "128K", empty, check=False)
    ck.eq(r.returncode, 0, "gen into an empty directory works")

    with sm.Mount(env, store) as m:
        src, fstype = mount_source(m.mnt)
        ck.eq((src, fstype), ("shardfs:" + os.path.realpath(store), "fuse.shardfs"),
              "/proc/mounts names the store")
        r = env.shardctl_run("gen", "--force", "--size", "128K", "--seed", "3", a,
                             check=False)
        ck.eq(r.returncode, 1, "gen --force over a served checkpoint fails")
        ck.ok(m.mnt.encode() in r.stderr, "and names the mount: %r" % r.stderr)
        ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(a)), [],
              "the served checkpoint is unchanged")

    r = env.shardctl_run("gen", "--force", "--size", "128K", "--seed", "3", a,
                         check=False)
    ck.eq(r.returncode, 0, "gen --force over an unserved shardfs checkpoint works: %r"
          % r.stderr)
    ck.ok(sm.snapshot_diff(snap, sm.store_snapshot(a)) != [],
          "and rewrote it")


def check_version_and_order(env, ck):
    """--version as shardfs has it; info lists step-2 before step-10."""
    r = env.shardctl_run("--version")
    v = subprocess.run([env.shardfs, "--version"], stdout=subprocess.PIPE,
                       timeout=30).stdout.decode().split()
    ck.eq(r.stdout.decode().split(), ["shardctl", v[-1] if v else "?"],
          "shardctl --version names the version shardfs has")
    store = env.path("order")
    os.makedirs(store)
    for n in ("step-10", "step-2", "step-1", "final"):
        env.gen(os.path.join(store, n), size="64K", ref=False)
    out = env.shardctl_run("info", store).stdout.decode().splitlines()
    names = [ln.split()[0] for ln in out[1:] if ln.strip() and
             not ln.startswith("total")]
    ck.eq(names, ["final", "step-1", "step-2", "step-10"],
          "info sorts checkpoint names as numbers read")


def check_mountpoint_errors(env, ck):
    """A second daemon on a mounted directory, and a daemon on the stale
    mount a killed one left, refuse with a message saying what to do."""
    store = env.path("mpstore")
    os.makedirs(store)
    env.gen(os.path.join(store, "a"), size="64K", ref=False)
    with sm.Mount(env, store, name="first") as m:
        r = subprocess.run([env.shardfs, "-f", store, m.mnt],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30)
        ck.ok(r.returncode != 0, "a second daemon on a mounted directory fails")
        ck.ok(b"already has a FUSE" in r.stderr and b"fusermount3 -u" in r.stderr,
              "and says how to unmount it: %r" % r.stderr[-300:])
        ck.ok(m.alive(), "the first mount still serves")
    m = sm.Mount(env, store, name="stale")
    m.start()
    m.kill9()
    try:
        r = subprocess.run([env.shardfs, "-f", store, m.mnt],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30)
        ck.ok(r.returncode != 0 and b"stale" in r.stderr and
              b"fusermount3 -uz" in r.stderr,
              "a daemon on a stale mount says how to clear it: %r" % r.stderr[-300:])
    finally:
        m.stop(raise_on_crash=False)


def check_gen_scale(env, ck):
    """gen's scale layouts: --layout many is N tensors of 8 row boxes each,
    every byte the generator's (its --ref); --sparse makes zero tensors in
    files with holes whose checksums shardctl verify accepts, block by
    block, and that the mount serves verified."""
    store = env.path("store-scale")
    os.makedirs(store)
    many = os.path.join(store, "many")
    ref = env.gen(many, layout="many", ranks=8, size="256K", extra=("--tensors", "40"))
    ck.eq(len(ref.tensors), 40, "--tensors 40 makes 40 tensors")
    sparse = os.path.join(store, "sparse")
    env.gen(sparse, layout="llama", ranks=4, size="8M", ref=False,
            extra=("--sparse",))
    big = os.path.join(store, "big")
    env.gen(big, layout="llama", ranks=4, size="64G", block_size="4M", ref=False,
            extra=("--sparse",))
    used = sum(os.stat(os.path.join(dp, f)).st_blocks * 512
               for dp, _, fs in os.walk(big) for f in fs)
    ck.ok(used < 64 << 20, "a sparse 64G checkpoint takes %d bytes of disk" % used)
    # (verifying the 64G one would read 64 GB of holes)
    r = env.shardctl_run("verify", sparse, check=False)
    ck.eq(r.returncode, 0, "shardctl verify of the sparse checkpoint: %r" % (
        r.stdout[-300:] + r.stderr[-300:]))
    r = env.shardctl_run("gen", "--sparse", "--ref", env.path("nope"),
                         os.path.join(store, "x"), check=False)
    ck.eq(r.returncode, 2, "--sparse with --ref is a usage error")
    r = env.shardctl_run("gen", "--tensors", "5", os.path.join(store, "y"), check=False)
    ck.eq(r.returncode, 2, "--tensors without --layout many is a usage error")
    with sm.Mount(env, store) as m:
        names = sorted(os.listdir(os.path.join(m.mnt, "many", "tensors")))
        ck.eq(names, sorted(ref.tensors), "tensors/ lists the 40 tensors")
        for name in names:
            with open(os.path.join(m.mnt, "many", "tensors", name), "rb") as f:
                ck.ok(f.read() == ref.tensor_bytes(name), "%s: the generator's bytes" % name)
        ck.eq(os.getxattr(os.path.join(m.mnt, "sparse"), "user.shardfs.verified"),
              b"yes", "a sparse checkpoint is verified")
        tdir = os.path.join(m.mnt, "sparse", "tensors")
        for name in sorted(os.listdir(tdir))[:20]:
            with open(os.path.join(tdir, name), "rb") as f:
                data = f.read()
            ck.ok(len(data) > 0 and data.count(0) == len(data),
                  "%s: %d zero bytes, read verified" % (name, len(data)))


def test(env, ck):
    check_gen(env, ck)
    check_gen_scale(env, ck)
    check_version_and_order(env, ck)
    check_mountpoint_errors(env, ck)


if __name__ == "__main__":
    sys.exit(sm.main(test))
