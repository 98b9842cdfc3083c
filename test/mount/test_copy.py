#!/usr/bin/python3
"""Mount test: shardctl copy SRC DST (issue 14, item 8).

- store to store: the copy of a generated shardfs/1 checkpoint passes
  `shardctl verify`, holds the same manifest and payload bytes, and mounted
  shows the same model.safetensors and tensors as the original's mount and
  the unsharded reference; nothing of the copy's temporary directory is
  left; SRC is unchanged;
- mount to store: SRC given as MOUNT/CKPT copies the checkpoint's store
  directory;
- resumable: a copy killed mid-way (SIGKILL from the test hook
  SHARDFS_TEST_COPY_KILL_AFTER) leaves no DST (a mount of that store does
  not show it), and the same command then completes, keeping the files
  already complete (it says so), and the result verifies;
- verified: a flipped payload byte or a truncated payload in SRC fails the
  copy with a message naming file, tensor and block, and DST is not made;
- DST rules (gen's): an existing checkpoint only with --force, never one
  a mount serves, never a directory of other files, never inside a mount;
  an uncommitted SRC is refused;
- another framework's checkpoint (committed fixtures: PyTorch DCP, a
  Hugging Face tree with a subdirectory) is copied file for file (bytes,
  modes, mtimes), a symlink in it is left out and never followed, and
  after `shardctl index` its blocks are verified as copied (a flipped
  byte then fails the copy).
"""

import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
KILL_ENV = "SHARDFS_TEST_COPY_KILL_AFTER"


def copy(env, *argv, extra_env=None):
    e = dict(os.environ)
    e.update(extra_env or {})
    return subprocess.run([env.shardctl, "copy"] + [str(a) for a in argv],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=sm.CMD_TIMEOUT_S, env=e)


def out(r):
    return (r.stdout + r.stderr).decode(errors="replace")


def files_of(top):
    """{relative path: (mode, size, mtime_ns, sha256)} of the regular files
    under top, and the sorted list of everything else (links, ...)."""
    snap = sm.store_snapshot(top)
    files = {k: v[1:] for k, v in snap.items() if v[0] == 0o100000}
    other = sorted(k for k, v in snap.items() if v[0] not in (0o100000, 0o040000))
    return files, other


def payload_files(ckpt):
    """manifest.json and every file a shard names, relative."""
    man = sm.manifest_of(ckpt)
    names = {"manifest.json"}
    for sect in ("tensors", "files"):
        for t in man.get(sect, {}).values():
            names.update(s["file"] for s in t["shards"])
    return names


def tmp_left(parent):
    return [n for n in os.listdir(parent) if n.startswith(".shardctl-copy-")]


def check_same_ckpt(ck, a, b, label):
    fa, _ = files_of(a)
    fb, _ = files_of(b)
    want = payload_files(a)
    ck.eq(sorted(n for n in fb if n != ".shardfs"), sorted(want),
          "%s: the copy holds manifest.json and the payload files" % label)
    for n in sorted(want):
        ck.eq(fb.get(n, (None,))[1:], fa[n][1:],
              "%s: %s: size, mtime and bytes as the source's" % (label, n))


def check_mounted_same(env, ck, store_a, store_b, name_a, name_b, ref, label):
    with sm.Mount(env, store_a) as ma, sm.Mount(env, store_b) as mb:
        ra, rb = os.path.join(ma.mnt, name_a), os.path.join(mb.mnt, name_b)
        sta = sm.read_file(os.path.join(ra, "model.safetensors"))
        stb = sm.read_file(os.path.join(rb, "model.safetensors"))
        ck.ok(len(sta) > 0 and sta == stb,
              "%s: model.safetensors of the copy equals the original's (%d bytes)"
              % (label, len(sta)))
        for name in sorted(ref.tensors):
            ck.bytes_eq(sm.read_file(sm.tensor_path(rb, name)), ref.tensor_bytes(name),
                        "%s: tensors/%s of the copy vs the reference" % (label, name))


def check_store_to_store(env, ck):
    a, b = env.path("a"), env.path("b")
    os.makedirs(a)
    os.makedirs(b)
    ref = env.gen(os.path.join(a, "ck"), ranks=3, size="3M", dtype="BF16",
                  block_size="64K")
    snap = sm.store_snapshot(a)
    r = copy(env, os.path.join(a, "ck"), os.path.join(b, "ck"))
    ck.eq(r.returncode, 0, "copy store to store: %s" % out(r))
    ck.ok(b"blocks verified" in r.stdout and b" 0 blocks verified" not in r.stdout,
          "it verified blocks: %r" % r.stdout)
    v = env.shardctl_run("verify", os.path.join(b, "ck"), check=False)
    ck.eq(v.returncode, 0, "shardctl verify passes on the copy: %s" % out(v))
    check_same_ckpt(ck, os.path.join(a, "ck"), os.path.join(b, "ck"), "store copy")
    ck.eq(tmp_left(b), [], "no temporary directory is left")
    ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(a)), [], "SRC is unchanged")
    check_mounted_same(env, ck, a, b, "ck", "ck", ref, "store copy")

    # mount to store: MOUNT/CKPT names the store's directory
    with sm.Mount(env, a) as m:
        r = copy(env, os.path.join(m.mnt, "ck"), os.path.join(b, "ck2"))
        ck.eq(r.returncode, 0, "copy MOUNT/CKPT to a store: %s" % out(r))
        ck.ok(os.path.realpath(os.path.join(a, "ck")).encode() in r.stdout,
              "it copied the store's directory: %r" % r.stdout)
        # a DST inside a mount is refused, and nothing is made there
        r = copy(env, os.path.join(a, "ck"), os.path.join(m.mnt, "ck9"))
        ck.eq(r.returncode, 1, "DST inside a mount is refused: %s" % out(r))
        ck.ok(b"inside a FUSE mount" in r.stderr, "and says so: %r" % r.stderr)
        ck.ok(not os.path.exists(os.path.join(a, "ck9")), "and nothing is made in its store")
        # --force never replaces a checkpoint a mount serves
        snap_a = sm.store_snapshot(a)
        r = copy(env, "--force", os.path.join(b, "ck2"), os.path.join(a, "ck"))
        ck.eq(r.returncode, 1, "--force over a served checkpoint is refused: %s" % out(r))
        ck.ok(m.mnt.encode() in r.stderr, "and names the mount: %r" % r.stderr)
        ck.eq(sm.snapshot_diff(snap_a, sm.store_snapshot(a)), [], "the store is unchanged")
    check_same_ckpt(ck, os.path.join(a, "ck"), os.path.join(b, "ck2"), "mount copy")
    return a, b, ref


def check_dst_rules(env, ck, a, b):
    src = os.path.join(a, "ck")
    dst = os.path.join(b, "ck")
    snap = sm.store_snapshot(dst)
    r = copy(env, src, dst)
    ck.eq(r.returncode, 1, "copy over a committed checkpoint without --force: %s" % out(r))
    ck.ok(b"--force" in r.stderr, "and says --force: %r" % r.stderr)
    ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(dst)), [], "DST is unchanged")

    other = os.path.join(a, "other")
    env.gen(other, ranks=2, size="256K", seed=7, ref=False)
    r = copy(env, "--force", other, dst)
    ck.eq(r.returncode, 0, "copy --force over an unserved checkpoint: %s" % out(r))
    check_same_ckpt(ck, other, dst, "--force copy")
    ck.ok(not any(os.path.exists(os.path.join(dst, n)) for n in payload_files(src)
                  if n not in payload_files(other)),
          "no file of the replaced checkpoint is left in DST")
    ck.eq(tmp_left(b), [], "the replaced checkpoint is removed")

    junk = os.path.join(b, "junk")
    os.makedirs(junk)
    with open(os.path.join(junk, "notes.txt"), "w") as f:
        f.write("mine\n")
    snap = sm.store_snapshot(junk)
    r = copy(env, "--force", src, junk)
    ck.eq(r.returncode, 1, "copy --force over a directory of files: %s" % out(r))
    ck.ok(b"not a shardfs checkpoint" in r.stderr, "and says why: %r" % r.stderr)
    ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(junk)), [], "it is unchanged")

    empty = os.path.join(b, "empty")
    os.makedirs(empty)
    r = copy(env, src, empty)
    ck.eq(r.returncode, 0, "copy into an empty directory: %s" % out(r))
    check_same_ckpt(ck, src, empty, "copy into an empty directory")

    r = copy(env, src, os.path.join(env.path("nowhere"), "x"))
    ck.eq(r.returncode, 1, "a DST whose directory does not exist: %s" % out(r))
    ck.ok(not os.path.exists(env.path("nowhere")), "nothing is made")

    unfinished = os.path.join(a, "unfinished")
    shutil.copytree(src, unfinished)
    os.unlink(os.path.join(unfinished, "manifest.json"))
    with open(os.path.join(unfinished, ".shardfs"), "w") as f:
        f.write('{"format": "shardfs/1"}\n')
    r = copy(env, unfinished, os.path.join(b, "unfinished"))
    ck.eq(r.returncode, 1, "an uncommitted SRC is refused: %s" % out(r))
    ck.ok(b"still being written" in r.stderr, "and says why: %r" % r.stderr)
    ck.ok(not os.path.exists(os.path.join(b, "unfinished")) and not tmp_left(b),
          "nothing is made")
    shutil.rmtree(unfinished)


def check_resume(env, ck):
    a, b = env.path("ra"), env.path("rb")
    os.makedirs(a)
    os.makedirs(b)
    ref = env.gen(os.path.join(a, "big"), ranks=4, size="12M", block_size="64K")
    total = sum(os.path.getsize(os.path.join(a, "big", n))
                for n in payload_files(os.path.join(a, "big")))
    dst = os.path.join(b, "big")
    r = copy(env, os.path.join(a, "big"), dst, extra_env={KILL_ENV: str(total // 2)})
    ck.eq(r.returncode, -signal.SIGKILL, "the copy is killed mid-way: %s" % out(r))
    ck.ok(not os.path.exists(dst), "an interrupted copy leaves no DST")
    tmp = os.path.join(b, ".shardctl-copy-big")
    done, parts = [], []
    for dp, _, fns in os.walk(tmp):
        for f in fns:
            (parts if f.endswith(".shardctl-part") else done).append(f)
    ck.ok(done and parts and "manifest.json" not in done,
          "the temporary copy has complete files, a part file and no manifest: %s %s"
          % (done, parts))
    with sm.Mount(env, b, opts=["--log-level", "info"]) as m:
        ck.eq(os.listdir(m.mnt), [], "a mount of DST's store shows nothing of it")
    r = copy(env, os.path.join(a, "big"), dst)
    ck.eq(r.returncode, 0, "the same command completes the copy: %s" % out(r))
    ck.ok(b"kept from an earlier run" in r.stdout,
          "and keeps the files already complete: %r" % r.stdout)
    v = env.shardctl_run("verify", dst, check=False)
    ck.eq(v.returncode, 0, "the resumed copy verifies: %s" % out(v))
    check_same_ckpt(ck, os.path.join(a, "big"), dst, "resumed copy")
    ck.eq(tmp_left(b), [], "no temporary directory is left")
    check_mounted_same(env, ck, a, b, "big", "big", ref, "resumed copy")


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        c = f.read(1)
        f.seek(off)
        f.write(bytes([c[0] ^ 0x40]))


def check_damaged(env, ck, a):
    b = env.path("db")
    os.makedirs(b)
    bad = os.path.join(a, "bad")
    shutil.copytree(os.path.join(a, "ck"), bad, copy_function=shutil.copy2)
    man = sm.manifest_of(bad)
    name = sorted(man["tensors"])[len(man["tensors"]) // 2]
    s = man["tensors"][name]["shards"][-1]
    flip(os.path.join(bad, s["file"]), s["file_offset"] + s["nbytes"] // 2)
    for attempt in (1, 2):
        r = copy(env, bad, os.path.join(b, "bad"))
        ck.eq(r.returncode, 1, "a flipped payload byte fails the copy (run %d): %s"
              % (attempt, out(r)))
        ck.ok(b"checksum mismatch" in r.stderr and s["file"].encode() in r.stderr and
              name.encode() in r.stderr,
              "and names the file, tensor and block: %r" % r.stderr)
        ck.ok(not os.path.exists(os.path.join(b, "bad")), "and DST is not made")

    short = os.path.join(a, "short")
    shutil.copytree(os.path.join(a, "ck"), short, copy_function=shutil.copy2)
    big = max(payload_files(short) - {"manifest.json"},
              key=lambda n: os.path.getsize(os.path.join(short, n)))
    os.truncate(os.path.join(short, big), os.path.getsize(os.path.join(short, big)) - 100)
    r = copy(env, short, os.path.join(b, "short"))
    ck.eq(r.returncode, 1, "a truncated payload fails the copy: %s" % out(r))
    ck.ok(big.encode() in r.stderr and b"past the end" in r.stderr,
          "and says where: %r" % r.stderr)
    ck.ok(not os.path.exists(os.path.join(b, "short")), "and DST is not made")
    shutil.rmtree(bad)
    shutil.rmtree(short)


def check_foreign(env, ck):
    b = env.path("fb")
    os.makedirs(b)
    for rel in ("dcp/torch-2.15/rows4", "hf/torch-2.15/dcp-hf-cons2",
                "hf/transformers-4.46/llama-bin"):
        src = os.path.join(FIXTURES, rel)
        if not os.path.isdir(src):
            ck.ok(False, "fixture %s is missing" % rel)
            continue
        snap = sm.store_snapshot(src)
        dst = os.path.join(b, os.path.basename(rel))
        r = copy(env, src, dst)
        ck.eq(r.returncode, 0, "copy of fixture %s: %s" % (rel, out(r)))
        ck.ok(b"not verified" in r.stdout,
              "it says the copy of an unindexed checkpoint is not verified: %r" % r.stdout)
        fs, _ = files_of(src)
        fd, other = files_of(dst)
        ck.eq(fd, fs, "%s: the copy holds the same files (paths, modes, sizes, mtimes, "
              "bytes)" % rel)
        ck.eq(other, [], "%s: and nothing else" % rel)
        ck.eq(sm.snapshot_diff(snap, sm.store_snapshot(src)), [], "%s: SRC is unchanged" % rel)

    # an indexed DCP checkpoint: blocks verified; a symlink is left out
    a = env.path("fa")
    src = os.path.join(a, "rows4")
    shutil.copytree(os.path.join(FIXTURES, "dcp/torch-2.15/rows4"), src,
                    copy_function=shutil.copy2)
    env.shardctl_run("index", src)
    os.symlink("/etc/passwd", os.path.join(src, "evil"))
    r = copy(env, src, os.path.join(b, "rows4i"))
    ck.eq(r.returncode, 0, "copy of an indexed DCP checkpoint: %s" % out(r))
    ck.ok(b"not verified" not in r.stdout and b" 0 blocks verified" not in r.stdout,
          "its blocks are verified: %r" % r.stdout)
    ck.ok(b"evil: left out: a symbolic link" in r.stderr, "the symlink is left out: %r"
          % r.stderr)
    ck.ok(not os.path.lexists(os.path.join(b, "rows4i", "evil")),
          "and is not in the copy")
    v = env.shardctl_run("verify", os.path.join(b, "rows4i"), check=False)
    ck.eq(v.returncode, 0, "shardctl verify of the copy passes against its index "
          "(mtimes kept): %s" % out(v))
    with sm.Mount(env, b) as m:
        ck.eq(os.getxattr(os.path.join(m.mnt, "rows4i"), "user.shardfs.verified"), b"yes",
              "the mounted copy is verified")
        ti, tp = (os.path.join(m.mnt, n, "tensors") for n in ("rows4i", "rows4"))
        names = sorted(os.listdir(tp))
        ck.ok(names and sorted(os.listdir(ti)) == names and all(
            sm.read_file(os.path.join(ti, n)) == sm.read_file(os.path.join(tp, n))
            for n in names), "and shows the same tensors as the plain copy: %s" % names)
    with open(os.path.join(src, "shardfs.index.json")) as f:
        sh = json.load(f)["shards"][0]
    flip(os.path.join(src, sh["file"]), sh["file_offset"] + sh["nbytes"] // 2)
    r = copy(env, src, os.path.join(b, "rows4bad"))
    ck.eq(r.returncode, 1, "a flipped byte in an indexed chunk fails the copy: %s" % out(r))
    ck.ok(b"checksum mismatch" in r.stderr, "and says so: %r" % r.stderr)
    ck.ok(not os.path.exists(os.path.join(b, "rows4bad")), "and DST is not made")


def test(env, ck):
    a, b, _ = check_store_to_store(env, ck)
    check_dst_rules(env, ck, a, b)
    check_damaged(env, ck, a)
    check_resume(env, ck)
    check_foreign(env, ck)


if __name__ == "__main__":
    sys.exit(sm.main(test))
