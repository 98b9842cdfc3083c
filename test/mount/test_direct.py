#!/usr/bin/python3
"""Mount test: the direct data path (issue 29, 2): user.shardfs.where and
the Python package's direct reader (python/shardfs/direct.py).

- user.shardfs.where of every tensor of a generated 2-rank checkpoint
  (64 KiB blocks: many per shard; replicated tensors among them) lists its
  shards with this store's absolute paths and identities; read with the
  direct path every tensor equals the reference and equals a read through
  the mount, all of its bytes read directly (stats), none through the
  mount (also with every block a task of its own, rows cut at the task
  edges, short runs read aside or in place); the same for a DCP checkpoint written by torch 1.13 once
  `shardctl index` gave it checksums (before the index: no path, "no
  checksums", every byte through the mount, still equal);
- where is not offered on a checkpoint's directory (ENODATA) nor on a
  checkpoint being written;
- another local user (uid 65534, allow_other): with the store readable by
  all, the paths are given and the direct read works as that user; with
  the store's directory closed (0700), no path is told ("not readable by
  the caller") and the read, through the mount, still equals the
  reference;
- a byte flipped in a payload file with its mtime put back (the identity
  unchanged): the direct reader finds the checksum differs, reads through
  the mount, and the mount answers EIO: OSError EIO, never wrong bytes;
  a payload file replaced by a symlink to a copy: the open (O_NOFOLLOW)
  fails, the bytes come through the mount and are right; a file changed
  in size: "file changed";
- without the xxhash module every byte is read through the mount.
"""

import errno
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import sfmount as sm  # noqa: E402

try:
    import shardfs
except ImportError:
    sys.path.insert(0, os.path.join(TOP, "python"))
    import shardfs
from shardfs import direct  # noqa: E402

WHERE = "user.shardfs.where"


def where(path):
    return json.loads(os.getxattr(path, WHERE))


def read_all(root, direct_on):
    ck = shardfs.open(root, direct=direct_on)
    return ck, {n: ck[n].numpy().tobytes() for n in ck.names()}


def check_equal_ref(ck, got, ref, label):
    bad = [n for n in ref.tensors if got.get(n) != ref.tensor_bytes(n)]
    ck.eq(bad[:5], [], "%s: tensors that differ from the reference" % label)


def part_basic(env, ck, store, ref, ref2):
    with sm.Mount(env, store, ["-o", "allow_other"], name="basic") as m:
        root = os.path.join(m.mnt, "step-1")
        total = sum(ref.nbytes(n) for n in ref.tensors)
        nshards = npath = nrep = 0
        for name in ref.tensors:
            w = where(sm.tensor_path(root, name))
            ck.eq(w["nbytes"], ref.nbytes(name), "where %s: nbytes" % name)
            geos = set()
            for e in w["shards"]:
                nshards += 1
                sh = e["shard"]
                key = json.dumps([sh.get("flat"), sh.get("offsets"), sh.get("lengths")])
                nrep += key in geos
                geos.add(key)
                if "path" in e:
                    npath += 1
                    ok = (e["path"].startswith(os.path.realpath(store) + "/") and
                          os.stat(e["path"]).st_ino == e["ino"] and
                          e["path"].endswith("/" + sh["file"]))
                    ck.ok(ok, "where %s: path %s is the store's file %s" % (
                        name, e["path"], sh["file"]))
        ck.eq(npath, nshards, "every shard of a local checkpoint has a path")
        ck.ok(nrep > 0, "the layout has replicated shards (%d)" % nrep)
        ck.ok(max(len(e["shard"]["xxh3"]) for n in ref.tensors
                  for e in where(sm.tensor_path(root, n))["shards"]) > 1,
              "some shard spans several blocks")
        dck, got = read_all(root, True)
        check_equal_ref(ck, got, ref, "direct")
        ck.eq(dck.stats["direct_bytes"], total, "every byte read directly")
        ck.eq((dck.stats["mount_bytes"], dck.stats["reasons"]), (0, {}),
              "no byte through the mount")
        _, mgot = read_all(root, False)
        ck.ok(mgot == got, "direct reads equal reads through the mount")
        # every block its own task (runs cut at task edges), short runs
        # read aside or every run read in place; step-2 (llama) splits
        # matrices by columns: many runs per shard
        saved = (direct.TASK_BYTES, direct.SCATTER_RUN)
        for ckname, cref in (("step-1", ref), ("step-2", ref2)):
            ctotal = sum(cref.nbytes(n) for n in cref.tensors)
            for scatter in (1 << 30, 1):
                direct.TASK_BYTES, direct.SCATTER_RUN = 65536, scatter
                try:
                    sck, sgot = read_all(os.path.join(m.mnt, ckname), True)
                finally:
                    direct.TASK_BYTES, direct.SCATTER_RUN = saved
                label = "%s, one block per task, scatter run %d" % (ckname, scatter)
                check_equal_ref(ck, sgot, cref, label)
                ck.eq(sck.stats["direct_bytes"], ctotal, label + ": every byte directly")
        ck.raises((errno.ENODATA,), lambda: os.getxattr(root, WHERE),
                  "where on the checkpoint directory")
        wt = os.path.join(m.mnt, "being-written", "tensors")
        os.makedirs(wt, exist_ok=True)
        open(os.path.join(wt, "x"), "wb").close()
        os.setxattr(os.path.join(wt, "x"), "user.shardfs.dtype", b"F32")
        os.setxattr(os.path.join(wt, "x"), "user.shardfs.shape", b"[4]")
        with open(os.path.join(wt, "x"), "r+b") as f:
            f.write(b"\0" * 16)
        ck.raises((errno.ENODATA,), lambda: os.getxattr(os.path.join(wt, "x"), WHERE),
                  "where on a tensor of a checkpoint being written")
        # another user, store readable by all
        script = env.path("as_user.py")
        with open(script, "w") as f:
            f.write("import json, sys, hashlib\nsys.path.insert(0, %r)\n"
                    "import shardfs\nck = shardfs.open(sys.argv[1])\n"
                    "h = {n: hashlib.sha256(ck[n].numpy().tobytes()).hexdigest() "
                    "for n in ck.names()}\n"
                    "w = open(ck.tensor_path(ck.names()[0]), 'rb') and "
                    "json.loads(__import__('os').getxattr(ck.tensor_path(ck.names()[0]), %r))\n"
                    "print(json.dumps({'h': h, 'stats': ck.stats, 'w': w}))\n"
                    % (os.path.join(TOP, "python"), WHERE))
        os.chmod(script, 0o644)
        os.chmod(env.tmp, 0o755)
        want = {n: __import__("hashlib").sha256(ref.tensor_bytes(n)).hexdigest()
                for n in ref.tensors}
        for mode, label in ((0o755, "open store"), (0o700, "closed store")):
            os.chmod(store, mode)
            res = sm.as_nobody([["run", "/usr/bin/python3", script, root]])[0]
            try:
                out = json.loads(res["ok"]["out"].strip().splitlines()[-1])
            except (ValueError, KeyError, IndexError):
                ck.ok(False, "%s: as uid 65534: %r" % (label, res))
                continue
            ck.ok(out["h"] == want, "%s: uid 65534 reads every tensor right" % label)
            paths = [e for e in out["w"]["shards"] if "path" in e]
            if mode == 0o755:
                ck.eq(out["stats"]["direct_bytes"], total,
                      "%s: uid 65534 reads directly" % label)
            else:
                ck.eq(paths, [], "%s: no path told to uid 65534" % label)
                ck.ok(all(e.get("why") == "not readable by the caller"
                          for e in out["w"]["shards"]), "%s: the reason" % label)
                ck.eq(out["stats"]["direct_bytes"], 0,
                      "%s: nothing read directly by uid 65534" % label)
        os.chmod(store, 0o755)
        # no xxhash: the mount
        saved = direct._xxh3
        direct._xxh3 = None
        try:
            nck, got = read_all(root, True)
        finally:
            direct._xxh3 = saved
        check_equal_ref(ck, got, ref, "no xxhash")
        ck.eq((nck.stats["direct_bytes"], nck.stats["mount_bytes"]), (0, total),
              "no xxhash: every byte through the mount")


def e0_file(e, path):
    """The shard file name of path (STORE/CKPT/FILE) as where names it."""
    return e["shard"]["file"] if path.endswith("/" + e["shard"]["file"]) else None


def biggest_shard(root, ref):
    best = None
    for name in ref.tensors:
        for e in where(sm.tensor_path(root, name))["shards"]:
            sh = e["shard"]
            if "path" in e and (best is None or sh["nbytes"] > best[1]["shard"]["nbytes"]):
                best = (name, e)
    return best


def part_faults(env, ck, ref_store, ref):
    store = env.path("store-faults")
    shutil.copytree(ref_store, store, symlinks=True)
    with sm.Mount(env, store, name="faults") as m:
        root = os.path.join(m.mnt, "step-1")
        name, e = biggest_shard(root, ref)
        path = e["path"]
        # 1. a flipped byte, identity kept: checksum differs, then EIO
        st = os.stat(path)
        off = e["shard"]["file_offset"] + e["shard"]["nbytes"] // 2
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        dck = shardfs.open(root)
        try:
            got = dck[name].numpy().tobytes()
            ck.ok(False, "flipped byte: read returned %s bytes" % (
                "the right" if got == ref.tensor_bytes(name) else "WRONG"))
        except OSError as ex:
            ck.eq(ex.errno, errno.EIO, "flipped byte: the read fails with EIO")
        ck.eq(dck.stats["reasons"].get("checksum differs"), 1,
              "flipped byte: the direct reader saw the checksum differ")
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(b)
    with sm.Mount(env, store, name="faults2") as m:
        root = os.path.join(m.mnt, "step-1")
        name, e = biggest_shard(root, ref)
        path = e["path"]
        # 2. the file became a symlink to a copy after the where was told:
        # the reader's open (O_NOFOLLOW) refuses it; asked again, the
        # daemon no longer offers it either
        copy = env.path("copy.bin")
        shutil.copyfile(path, copy)
        w = where(sm.tensor_path(root, name))
        dck = shardfs.open(root)
        t = dck[name]
        plan = [(ent, geo) for ent, geo in direct._plan(t, w["shards"])
                if ent.get("path") == path]
        os.rename(path, path + ".orig")
        os.symlink(copy, path)
        reasons = [direct._open_shard(ent, geo) for ent, geo in plan]
        ck.ok(reasons and all(x.startswith("open:") for x in reasons),
              "symlinked file: the reader's open refuses it: %r" % reasons[:3])
        ck.ok(all(e.get("why") == "not in this node's store"
                  for e in where(sm.tensor_path(root, name))["shards"]
                  if e["shard"]["file"] == e0_file(e, path)),
              "symlinked file: the daemon no longer offers it")
        try:
            got = dck[name].numpy().tobytes()
            ck.ok(got == ref.tensor_bytes(name), "symlinked file: right bytes")
        except OSError as ex:
            ck.eq(ex.errno, errno.EIO, "symlinked file: right bytes or EIO")
        os.unlink(path)
        os.rename(path + ".orig", path)
        # 3. a file grown since the where: its identity differs
        with open(path, "ab") as f:
            f.write(b"\0" * 10)
        dck = shardfs.open(root)
        reasons = [direct._open_shard(ent, geo)
                   for ent, geo in direct._plan(dck[name], w["shards"])
                   if ent.get("path") == path]
        ck.ok(reasons and all(x == "file changed" for x in reasons),
              "grown file: the identity differs: %r" % reasons[:3])


def part_dcp(env, ck):
    """A DCP checkpoint torch 1.13 wrote: no checksums, then indexed."""
    store = env.path("store-dcp")
    os.makedirs(store)
    r = subprocess.run(["/usr/bin/python3", "-c", DCP_WRITE, os.path.join(store, "dcp1"),
                        os.path.join(TOP, "test", "interop")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    if not ck.eq(r.returncode, 0, "torch 1.13 wrote a DCP checkpoint (%s)" % r.stdout[-500:]):
        return
    for indexed in (False, True):
        if indexed:
            env.shardctl_run("index", os.path.join(store, "dcp1"))
        with sm.Mount(env, store, name="dcp%d" % indexed) as m:
            root = os.path.join(m.mnt, "dcp1")
            dck, got = read_all(root, True)
            _, mgot = read_all(root, False)
            total = sum(len(v) for v in mgot.values())
            ck.ok(total > 0 and got == mgot, "dcp (indexed %s): direct equals the mount" % indexed)
            if indexed:
                ck.eq(dck.stats["direct_bytes"], total, "dcp indexed: every byte directly")
            else:
                ck.eq((dck.stats["direct_bytes"], set(dck.stats["reasons"])),
                      (0, {"no checksums"}), "dcp unindexed: none directly, no checksums")


DCP_WRITE = r"""
import sys
sys.path.insert(0, sys.argv[2])
import torch113  # noqa: F401  (makes torch.distributed._shard importable)
import torch
import torch.distributed._shard.checkpoint as dcp
torch.manual_seed(0)
sd = {"w": torch.randn(300, 70), "b": torch.arange(1000, dtype=torch.int64),
      "h": torch.randn(64, 33).to(torch.bfloat16)}
dcp.save_state_dict(sd, dcp.FileSystemWriter(sys.argv[1]), no_dist=True)
"""


def test(env, ck):
    ck.ok(direct.available(), "the xxhash module is importable (python3-xxhash)")
    store = env.path("store")
    ref = env.gen(os.path.join(store, "step-1"), layout="mixed", ranks=2, size="3M",
                  block_size="64K")
    ref2 = env.gen(os.path.join(store, "step-2"), layout="llama", ranks=2, size="3M",
                   block_size="64K")
    part_basic(env, ck, store, ref, ref2)
    part_faults(env, ck, store, ref)
    part_dcp(env, ck)


if __name__ == "__main__":
    sys.exit(sm.main(test))
