#!/usr/bin/python3
"""Mount test of the write path (SPEC section 4), one daemon, empty store.

Writes three checkpoints through the mount and checks each against a numpy
reference built here, before and after a remount (tensors/, slices,
model.safetensors, npy/, root files, dtype/shape xattrs):
  py-ckpt  tools/shardfs_save.py: dim-0 / dim-1 / 3-d boxes, flat ranges,
           replicated tensors (whole on "every rank", and a whole box over a
           flat copy), dtypes F32 BF16 (torch when importable) F16 F64 F8_E4M3
           I64 I32 U8 BOOL, blobs (config.json, tokenizer.json); plus a
           tensor of flat pwrite ranges from one handle and from two handles
           open at once, out of order;
  c-ckpt   test/mount/write_ckpt.c (plain open/pwrite/setxattr, commits);
  cp-ckpt  a whole tensor copied in with `cp`, another with `dd bs=1M`
           (sizes not a multiple of 1 MiB), committed with `shardctl commit`.
Errors: EROFS into a committed checkpoint, EEXIST for mkdir of one, EINVAL
for bad slice paths / undeclared tensors / conflicting declarations,
ERANGE for boxes outside the shape and flat writes past the end, EIO at
close of a partial box; a commit with a gap fails with EIO and a state
naming the tensor, leaves the checkpoint writable, and succeeds once the gap
is filled; an overlap with different bytes fails; `shardctl commit` prints
the reason and exits non-zero; `shardctl rm` deletes a committed checkpoint
and discards an uncommitted one. The kernel's caches below a checkpoint
being written never hide a size a declaration or write changed, the
committed tree right after commit, or a discard right after rm.
"""

import argparse
import errno
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import sfmount as sm  # noqa: E402
import shardfs_save as sfs  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

WRITER = None               # path of the write_ckpt helper (--writer)
CONFIG_JSON = b'{"model": "tiny", "layers": 2}\n'
TOKENIZER_JSON = b'{"vocab": ["a", "b", "c"]}' * 50


# ----------------------------------------------------------- the writers

def write_py_ckpt(mnt, ref, seed):
    """py-ckpt through shardfs_save (no commit yet); returns the Shards."""
    rng = np.random.default_rng(seed)
    shards = []
    # dim-0 boxes (column parallel), uneven rows
    a = ref.add("layers/0/attn.wq", None, sm.random_array(rng, (64, 48), np.float32))
    for lo, hi in ((0, 20), (20, 41), (41, 64)):
        shards.append(sfs.Shard("layers/0/attn.wq", a[lo:hi], shape=a.shape, offsets=[lo, 0]))
    # dim-1 boxes of a BF16 tensor (torch when we have it, else uint16 bits)
    if torch is not None:
        b = torch.randn(32, 96, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        ref.add("layers/0/attn.wo", None, b)
        cols = [b[:, lo:hi] for lo, hi in ((0, 32), (32, 64), (64, 96))]
        bdt = None
    else:
        b = ref.add("layers/0/attn.wo", "BF16", sm.random_array(rng, (32, 96), np.uint16))
        cols = [b[:, lo:hi] for lo, hi in ((0, 32), (32, 64), (64, 96))]
        bdt = "BF16"
    for k, piece in enumerate(cols):
        shards.append(sfs.Shard("layers/0/attn.wo", piece, shape=[32, 96],
                                offsets=[0, 32 * k], dtype=bdt))
    # 3-d boxes split along the last dimension (I32)
    c = ref.add("layers/0/conv", None, sm.random_array(rng, (3, 5, 7), np.int32))
    shards.append(sfs.Shard("layers/0/conv", c[:, :, :4], shape=c.shape, offsets=[0, 0, 0]))
    shards.append(sfs.Shard("layers/0/conv", c[:, :, 4:], shape=c.shape, offsets=[0, 0, 4]))
    # flat ranges cut inside elements (FSDP style), F16
    e = ref.add("embed.weight", None, sm.random_array(rng, (100, 30), np.float16))
    raw = e.tobytes()
    for lo, hi in ((0, 1777), (1777, 4001), (4001, len(raw))):
        shards.append(sfs.Shard("embed.weight", raw[lo:hi], shape=e.shape, flat=lo, dtype="F16"))
    # replicated: every "rank" saves the whole tensor
    n = ref.add("layers/0/norm", None, sm.random_array(rng, (48,), np.float64))
    shards += [sfs.Shard("layers/0/norm", n), sfs.Shard("layers/0/norm", n)]
    # replicated as a whole box over a whole flat copy (same bytes)
    s = ref.add("step", None, np.array([3000, -1], dtype=np.int64))
    shards += [sfs.Shard("step", s), sfs.Shard("step", s, offsets=[0])]
    # small dtypes
    q = ref.add("quant.f8", "F8_E4M3", sm.random_array(rng, (16, 16), np.uint8))
    shards += [sfs.Shard("quant.f8", q[:8], shape=q.shape, offsets=[0, 0], dtype="F8_E4M3"),
               sfs.Shard("quant.f8", q[8:], shape=q.shape, offsets=[8, 0], dtype="F8_E4M3")]
    m = ref.add("mask", None, sm.random_array(rng, (10, 3), np.bool_))
    shards.append(sfs.Shard("mask", m))
    u = ref.add("bytes.u8", None, sm.random_array(rng, (1000,), np.uint8))
    shards.append(sfs.Shard("bytes.u8", u))
    files = {"config.json": CONFIG_JSON, "tokenizer.json": TOKENIZER_JSON}
    ref.files.update(files)
    sfs.save(mnt, "py-ckpt", shards, files=files, commit=False)
    return shards


def write_pwrite_ranges(ck, mnt, ckpt, ref, seed):
    """flat.one: pwrites from one handle out of order (runs that join);
    flat.two: two handles open at once, interleaved ranges."""
    rng = np.random.default_rng(seed)
    for name, nhandles in (("flat.one", 1), ("flat.two", 2)):
        data = ref.add(name, None, sm.random_array(rng, (3000,), np.uint32))
        raw = data.tobytes()
        sfs.declare(mnt, ckpt, name, "U32", [3000])
        cuts = sorted(set([0, len(raw)] + [int(x) for x in rng.integers(1, len(raw), 9)]))
        ranges = list(zip(cuts[:-1], cuts[1:]))
        rng.shuffle(ranges)
        path = sm.tensor_path(os.path.join(mnt, ckpt), name)
        fds = [os.open(path, os.O_WRONLY) for _ in range(nhandles)]
        try:
            for k, (lo, hi) in enumerate(ranges):
                n = os.pwrite(fds[k % nhandles], raw[lo:hi], lo)
                ck.eq(n, hi - lo, "pwrite %s [%d,%d)" % (name, lo, hi))
        finally:
            for fd in fds:
                os.close(fd)


# ----------------------------------------------------------- the checks

def c_reference():
    """What write_ckpt.c writes (its value_* functions, in numpy)."""
    ref = sm.Reference()
    i = np.arange(40 * 24, dtype=np.int64)
    ref.add("c/w0", None, ((i * 7 % 1009) - 500).astype(np.float32).reshape(40, 24))
    i = np.arange(10 * 33, dtype=np.int64)
    ref.add("c/w1", None, ((i * 37 + 11) & 0xffff).astype(np.uint16).view(np.int16).reshape(10, 33))
    i = np.arange(1000, dtype=np.uint64)
    ref.add("c/flat", None, ((i * 2654435761) & 0xffffffff).astype(np.uint32))
    ref.files["config.json"] = b'{"writer": "write_ckpt.c", "layers": 1}\n'
    return ref


def write_cp_ckpt(env, ck, mnt, ref):
    """Two whole tensors copied into declared tensor files: cp and dd."""
    root = os.path.join(mnt, "cp-ckpt")
    subprocess.run(["mkdir", "-p", os.path.join(root, "tensors", "big")], check=True, timeout=30)
    rng = np.random.default_rng(7)
    for name, shape, tool in (("big/cp.f32", (700, 1031), "cp"),
                              ("big/dd.f16", (1000, 1537), "dd")):
        data = ref.add(name, None, sm.random_array(rng, shape, np.float32 if tool == "cp" else np.float16))
        src = env.path("src-" + tool)
        with open(src, "wb") as f:
            f.write(data.tobytes())
        dst = sm.tensor_path(root, name)
        sfs.declare(mnt, "cp-ckpt", name, ref.tensors[name][0], shape)
        cmd = (["cp", src, dst] if tool == "cp"
               else ["dd", "if=" + src, "of=" + dst, "bs=1M", "status=none"])
        r = subprocess.run(cmd, stderr=subprocess.PIPE, timeout=60)
        ck.eq(r.returncode, 0, "%s into tensors/%s: %s" % (tool, name, r.stderr.decode()[-300:]))
    r = env.shardctl_run("commit", root, check=False)
    ck.eq(r.returncode, 0, "shardctl commit cp-ckpt: %s" % r.stderr.decode()[-300:])


# ----------------------------------------------------------- error cases

def wait_for(pred, timeout_s):
    """Poll pred until it holds or timeout_s passes; its last value."""
    end = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < end:
        time.sleep(0.05)
    return pred()


def open_write(path, data=b"x", off=0, flags=0):
    fd = os.open(path, os.O_WRONLY | flags)
    try:
        os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def check_errors(env, ck, m, store):
    mnt = m.mnt
    # a committed checkpoint is read-only
    py = os.path.join(mnt, "py-ckpt")
    ck.raises(errno.EROFS, lambda: open_write(sm.tensor_path(py, "step")), "write into committed tensor")
    ck.raises(errno.EROFS, lambda: open_write(sm.tensor_path(py, "layers/0/conv", "0:1,:,:")),
              "write into committed box")
    ck.raises(errno.EROFS, lambda: open_write(os.path.join(py, "new.txt"), flags=os.O_CREAT),
              "create in committed checkpoint")
    ck.raises(errno.EROFS, lambda: os.mkdir(os.path.join(py, "tensors", "newdir")),
              "mkdir in committed checkpoint")
    ck.raises(errno.EROFS, lambda: os.setxattr(sm.tensor_path(py, "step"), "user.shardfs.dtype", b"I32"),
              "re-declare in committed checkpoint")
    ck.raises(errno.EEXIST, lambda: os.mkdir(py), "mkdir of a committed checkpoint")

    # a writing checkpoint with one declared tensor
    root = os.path.join(mnt, "err-ckpt")
    os.mkdir(root)
    os.makedirs(os.path.join(root, "tensors"), exist_ok=True)        # mkdir -p: idempotent
    os.makedirs(os.path.join(root, "tensors"), exist_ok=True)
    ck.eq(sfs.state(mnt, "err-ckpt"), "writing", "state of a new checkpoint")
    sfs.declare(mnt, "err-ckpt", "gap.tensor", "F32", [8, 8])
    sfs.declare(mnt, "err-ckpt", "gap.tensor", "F32", [8, 8])        # idempotent
    t = sm.tensor_path(root, "gap.tensor")
    ck.eq(os.getxattr(t, "user.shardfs.dtype"), b"F32", "getxattr dtype while writing")
    ck.eq(json.loads(os.getxattr(t, "user.shardfs.shape")), [8, 8], "getxattr shape while writing")
    ck.raises(errno.EINVAL, lambda: os.setxattr(t, "user.shardfs.dtype", b"F16"),
              "conflicting dtype re-declaration")
    ck.raises(errno.EINVAL, lambda: os.setxattr(t, "user.shardfs.shape", b"[8,9]"),
              "conflicting shape re-declaration")
    ck.raises(errno.EINVAL, lambda: os.setxattr(t, "user.shardfs.dtype", b"F33"), "unknown dtype")
    ck.raises(errno.EINVAL, lambda: os.setxattr(t, "user.shardfs.shape", b"[8,"), "malformed shape")
    ck.ok("gap.tensor" in m.log_text(), "the conflicting declaration is logged with the tensor name")
    for spec in ("0:4", "0:4,:,:", "x:y,:", "0:4;:", "-1:2,:"):
        ck.raises(errno.EINVAL, lambda s=spec: open_write(sm.tensor_path(root, "gap.tensor", s),
                                                          flags=os.O_CREAT),
                  "bad slice path gap.tensor@%s" % spec)
    for spec in ("0:9,:", ":,7:9", "8:9,:", "4:2,:"):
        ck.raises(errno.ERANGE, lambda s=spec: open_write(sm.tensor_path(root, "gap.tensor", s),
                                                          flags=os.O_CREAT),
                  "box outside the shape gap.tensor@%s" % spec)
    ck.raises((errno.ERANGE, errno.EFBIG), lambda: open_write(t, b"y" * 8, 8 * 8 * 4 - 4),
              "flat write past the end of the tensor")
    # an undeclared tensor (created, no xattrs) takes no bytes
    u = sm.tensor_path(root, "undeclared")
    os.close(os.open(u, os.O_WRONLY | os.O_CREAT, 0o644))
    ck.raises(errno.EINVAL, lambda: open_write(u), "flat write to an undeclared tensor")
    ck.raises(errno.EINVAL, lambda: open_write(u + "@0:1", flags=os.O_CREAT),
              "box write to an undeclared tensor")
    # A partial box is dropped when its handle is released (logged; the
    # commit then reports the gap). close() itself cannot tell: a forked
    # child closing its copy of the fd flushes too.
    rows = np.arange(64, dtype=np.float32).reshape(8, 8)
    open_write(sm.tensor_path(root, "gap.tensor", "0:4,:"), rows[:4].tobytes()[:100],
               flags=os.O_CREAT)
    ck.ok(wait_for(lambda: "box write incomplete" in m.log_text(), 5.0),
          "a partially written box is dropped, with a log line")
    # a child that inherits a box fd and exits does not end the box
    sfs.declare(mnt, "err-ckpt", "fork.tensor", "U8", [8, 8])
    fd = os.open(sm.tensor_path(root, "fork.tensor", "0:8,:"), os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"a" * 32)
        subprocess.run(["true"], close_fds=False, check=True)
        os.write(fd, b"b" * 32)
        ck.ok(True, "box writes go on after a child closed its copy of the fd")
    except OSError as e:
        ck.ok(False, "box write after a child closed its copy of the fd: %s" % e)
    finally:
        os.close(fd)
    # declared and covered now, so only gap.tensor can fail the commit
    sfs.declare(mnt, "err-ckpt", "undeclared", "U8", [1])
    open_write(u, b"\x07")
    # gap: rows 0:4 only
    open_write(sm.tensor_path(root, "gap.tensor", "0:4,:"), rows[:4].tobytes(), flags=os.O_CREAT)
    try:
        sfs.commit(mnt, "err-ckpt")
        ck.ok(False, "commit with a gap succeeded")
    except sfs.CommitError as e:
        ck.eq(e.errno, errno.EIO, "commit with a gap: errno")
        ck.ok(e.reason.startswith("failed") and "gap.tensor" in e.reason,
              "commit with a gap: state names the tensor (got %r)" % e.reason)
    ck.ok(sfs.state(mnt, "err-ckpt").startswith("failed"), "state after a failed commit")
    ck.ok(not os.path.exists(os.path.join(store, "err-ckpt", "manifest.json")),
          "no manifest.json after a failed commit")
    r = env.shardctl_run("commit", root, check=False)
    err = r.stderr.decode(errors="replace")
    ck.ok(r.returncode != 0 and "gap.tensor" in err,
          "shardctl commit of a gap exits non-zero with the reason (rc %d, %r)" % (r.returncode, err))
    # still writable: fill the gap, commit again
    try:
        open_write(sm.tensor_path(root, "gap.tensor", "4:8,:"), rows[4:].tobytes(), flags=os.O_CREAT)
        sfs.commit(mnt, "err-ckpt")
        ck.eq(sfs.state(mnt, "err-ckpt"), "committed", "commit after filling the gap")
        ck.bytes_eq(sm.read_file(t), rows.tobytes(), "gap.tensor after the second commit")
        ck.ok(os.path.exists(os.path.join(store, "err-ckpt", "manifest.json")),
              "manifest.json after the second commit")
    except OSError as e:
        ck.ok(False, "filling the gap and committing again: %s" % e)

    # overlap with different bytes
    root = os.path.join(mnt, "ovl-ckpt")
    os.makedirs(os.path.join(root, "tensors"), exist_ok=True)
    sfs.declare(mnt, "ovl-ckpt", "o", "U8", [100])
    open_write(sm.tensor_path(root, "o"), b"\x01" * 60, 0)
    open_write(sm.tensor_path(root, "o"), b"\x02" * 60, 40)
    try:
        sfs.commit(mnt, "ovl-ckpt")
        ck.ok(False, "commit with overlapping different bytes succeeded")
    except sfs.CommitError as e:
        ck.eq(e.errno, errno.EIO, "commit with an overlap: errno")
        ck.ok(e.reason.startswith("failed"), "commit with an overlap: state %r" % e.reason)
    ck.ok(not os.path.exists(os.path.join(store, "ovl-ckpt", "manifest.json")),
          "no manifest.json after the overlap commit")
    # shardctl rm discards the uncommitted one ...
    r = env.shardctl_run("rm", root, check=False)
    ck.eq(r.returncode, 0, "shardctl rm of an uncommitted checkpoint: %s" % r.stderr.decode()[-300:])
    ck.ok("ovl-ckpt" not in os.listdir(mnt), "discarded checkpoint gone from the mount")
    ck.ok(not os.path.exists(root), "discarded checkpoint: stat fails at once (entry invalidated)")
    ck.ok(not os.path.exists(os.path.join(store, "ovl-ckpt")), "discarded checkpoint gone from the store")
    # ... and deletes a committed one, whose payloads the daemon has open:
    # a handle opened before rm keeps reading right bytes, and once it is
    # closed the daemon holds no descriptor on the deleted payloads (they
    # would keep their disk space).
    x = np.arange(1 << 16, dtype=np.int32)
    sfs.save(mnt, "rm-ckpt", [sfs.Shard("x", x)])
    ck.eq(sfs.state(mnt, "rm-ckpt"), "committed", "rm-ckpt committed")
    xpath = sm.tensor_path(os.path.join(mnt, "rm-ckpt"), "x")
    ck.bytes_eq(sm.read_file(xpath), x.tobytes(), "rm-ckpt: x before rm")
    held = open(xpath, "rb", buffering=0)
    first = held.read(1000)
    r = env.shardctl_run("rm", os.path.join(mnt, "rm-ckpt"), check=False)
    ck.eq(r.returncode, 0, "shardctl rm of a committed checkpoint: %s" % r.stderr.decode()[-300:])
    ck.ok("rm-ckpt" not in os.listdir(mnt), "deleted checkpoint gone from the mount")
    ck.ok(not os.path.exists(os.path.join(mnt, "rm-ckpt")),
          "deleted checkpoint: stat fails at once (entry invalidated)")
    ck.ok(not os.path.exists(os.path.join(store, "rm-ckpt")), "deleted checkpoint gone from the store")
    # A new checkpoint under the same name has the same payload paths but
    # other files: it reads its own bytes while the old handle reads the old.
    y = x[::-1].copy()
    sfs.save(mnt, "rm-ckpt", [sfs.Shard("x", y)])
    ck.bytes_eq(sm.read_file(xpath), y.tobytes(), "rm-ckpt again: new bytes beside an old handle")
    # drop the kernel's cached pages of the old file: the rest must come
    # from the daemon, through the deleted checkpoint's own descriptors
    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    rest = os.pread(held.fileno(), len(x.tobytes()), 1000)
    ck.bytes_eq(first + rest, x.tobytes(), "rm-ckpt: a handle opened before rm reads on")
    held.close()
    ck.bytes_eq(sm.read_file(xpath), y.tobytes(), "rm-ckpt again: new bytes after the old handle closed")
    r = env.shardctl_run("rm", os.path.join(mnt, "rm-ckpt"), check=False)
    ck.eq(r.returncode, 0, "shardctl rm of the second rm-ckpt")
    ck.eq(m.deleted_fds(), [], "no daemon descriptor on a deleted file once no handle is open")


# ----------------------------------------------------------- the test

def check_cached_attrs(env, ck, mnt):
    """The kernel caches names and attributes below a checkpoint being
    written (issue 12: 34 requests per box written became 16); what it must
    never hide: a size that a declaration or a write changed, the committed
    tree right after the commit, a discarded checkpoint right after rm."""
    d = os.path.join(mnt, "cache-ckpt")
    os.makedirs(os.path.join(d, "tensors"), exist_ok=True)
    t = os.path.join(d, "tensors", "w")
    os.close(os.open(t, os.O_WRONLY | os.O_CREAT, 0o644))
    ck.eq(os.stat(t).st_size, 0, "an undeclared tensor has size 0")
    os.setxattr(t, "user.shardfs.dtype", b"F32")
    ck.eq(os.stat(t).st_size, 0, "and still with only a dtype")
    os.setxattr(t, "user.shardfs.shape", b"[4,8]")
    ck.eq(os.stat(t).st_size, 128, "the declared size at once after the shape")
    f = os.path.join(d, "blob.json")
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"0123456789")
    os.close(fd)
    ck.eq(os.stat(f).st_size, 10, "a root file's size after a write")
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"abc")
    os.close(fd)
    ck.eq(os.stat(f).st_size, 13, "and after an append")
    for r in range(2):
        fd = os.open("%s@%d:%d,:" % (t, 2 * r, 2 * r + 2), os.O_WRONLY)
        os.write(fd, bytes([r]) * 64)
        os.close(fd)
    ck.eq(sfs.state(mnt, "cache-ckpt"), "writing", "cache-ckpt writing")
    sfs.commit(mnt, "cache-ckpt")
    ck.eq(sfs.state(mnt, "cache-ckpt"), "committed", "committed at once")
    with open(t, "rb") as fh:
        ck.ok(fh.read() == bytes(64) + bytes([1]) * 64, "the committed bytes at once")
    ck.raises(errno.EROFS, lambda: os.setxattr(t, "user.shardfs.dtype", b"F32"),
              "the committed tensor, not the one being written")
    g = os.path.join(mnt, "cache-gone")
    os.makedirs(os.path.join(g, "tensors"), exist_ok=True)
    os.close(os.open(os.path.join(g, "tensors", "x"), os.O_WRONLY | os.O_CREAT, 0o644))
    os.stat(os.path.join(g, "tensors", "x"))
    r = env.shardctl_run("rm", g, check=False)
    ck.eq(r.returncode, 0, "shardctl rm of a checkpoint being written: %r" % r.stderr[-300:])
    ck.raises(errno.ENOENT, lambda: os.stat(g), "discarded: gone at once")
    ck.raises(errno.ENOENT, lambda: os.stat(os.path.join(g, "tensors", "x")),
              "and what was below it")


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {"py-ckpt": sm.Reference(), "c-ckpt": c_reference(), "cp-ckpt": sm.Reference()}
    with sm.Mount(env, store, name="write") as m:
        ck.eq(os.listdir(m.mnt), [], "empty store mounts empty")
        # py-ckpt: the Python example, committed separately
        write_py_ckpt(m.mnt, refs["py-ckpt"], env.rng.randrange(1 << 30))
        write_pwrite_ranges(ck, m.mnt, "py-ckpt", refs["py-ckpt"], env.rng.randrange(1 << 30))
        ck.eq(sfs.state(m.mnt, "py-ckpt"), "writing", "py-ckpt state before commit")
        ck.ok(os.path.isdir(os.path.join(store, "py-ckpt", "rank-00000")),
              "payloads go to STORE/py-ckpt/rank-00000/")
        sfs.commit(m.mnt, "py-ckpt")
        ck.ok(os.path.exists(os.path.join(store, "py-ckpt", "manifest.json")),
              "manifest.json in the store after commit")
        # c-ckpt: the C writer commits itself
        r = subprocess.run([WRITER, os.path.join(m.mnt, "c-ckpt")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        ck.eq(r.returncode, 0, "write_ckpt: %s" % r.stderr.decode(errors="replace")[-500:])
        write_cp_ckpt(env, ck, m.mnt, refs["cp-ckpt"])
        for name, ref in sorted(refs.items()):
            sm.check_written(env.rng, ck, os.path.join(m.mnt, name), ref, name)
        check_errors(env, ck, m, store)
        check_cached_attrs(env, ck, m.mnt)
        ck.ok(m.alive(), "daemon alive after the writes and the errors")
    # remount the same store: everything committed reads the same
    with sm.Mount(env, store, name="again") as m:
        ck.eq(sorted(os.listdir(m.mnt)), sorted(list(refs) + ["err-ckpt", "cache-ckpt"]),
              "checkpoints after remount")
        for name, ref in sorted(refs.items()):
            sm.check_written(env.rng, ck, os.path.join(m.mnt, name), ref, name + " (remount)")
        ck.ok(m.alive(), "daemon alive after reading back")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--writer", required=True, help="the write_ckpt helper binary")
    known, rest = ap.parse_known_args()
    WRITER = os.path.abspath(known.writer)
    sys.exit(sm.main(run, rest))
