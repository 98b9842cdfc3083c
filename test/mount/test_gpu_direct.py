#!/usr/bin/python3
"""Mount test: shardfs-load-gpu's direct path (issue 29, 2), run over the
mock CUDA runtime (gpu/tests/mock_cudart.c: device memory is host memory,
copies happen when the loader waits for them), so no GPU is needed.

- a committed checkpoint (shardctl gen, 2 ranks, 64 KiB blocks) mounted:
  the loader loads every tensors/NAME and the mount's model.safetensors
  (per file and per tensor) with --verify: every device buffer equals the
  mount's bytes; with the "fsdp" layout (flat ranges) and with "mixed"
  (row and column boxes: column blocks go to the device as 2-D copies,
  replicas) every byte is read direct, and with "llama" (64M: column
  blocks larger than the 1 MiB staging buffer, rows cut at its edges);
  --no-direct reads all through the mount;
- a byte flipped in a store file (fsdp: a flat range; mixed: a column
  block) with its mtime put back (the identity the
  daemon tells unchanged): the loader's check fails, it reads the chunk
  again through the mount, which answers EIO: the load fails with EIO,
  exit 1, and no "verify" line (nothing was handed out);
- as uid 65534 on an allow_other mount: with the store readable by all
  the load is direct; with rank 1's payload files closed to others (0600)
  the loader still loads every tensor right, those bytes (and the column
  blocks beside them) through the mount.
"""

import argparse
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sfmount as sm  # noqa: E402

LOADER = None   # shardfs-load-gpu-mock (--loader)
SUMMARY = re.compile(r"^direct path: +(\d+) bytes read direct, (\d+) through "
                     r"the mount, (\d+) chunks re-read", re.M)


def load(args, as_nobody=False):
    """Run the loader: (rc, output, (direct, mount, rereads) or None)."""
    argv = [LOADER, "--staging-mb", "1", "--depth", "3"] + list(args)
    if as_nobody:
        res = sm.as_nobody([["run"] + argv])[0]["ok"]
        rc, out = res["rc"], res["out"]
    else:
        rc, out, err = sm.run_cmd(argv)
        out += err
    m = SUMMARY.search(out)
    return rc, out, tuple(int(x) for x in m.groups()) if m else None


def tensor_files(root, ref):
    return [sm.tensor_path(root, n) for n in sorted(ref.tensors)]


def part_loads(env, ck, store, refs):
    with sm.Mount(env, store, ["-o", "allow_other"], name="gpu") as m:
        for ckname, ref in refs:
            root = os.path.join(m.mnt, ckname)
            total = sum(ref.nbytes(n) for n in ref.tensors)
            files = tensor_files(root, ref)
            rc, out, cnt = load(["--verify"] + files)
            n = len(files)
            ck.ok(rc == 0 and ("verify: %d of %d tensors match" % (n, n)) in out,
                  "%s: every tensor file loaded, device bytes = the mount's: %s"
                  % (ckname, out[-400:]))
            if not ck.ok(cnt is not None, "%s: the summary counts: %s" % (ckname, out[-300:])):
                continue
            direct, mount, rereads = cnt
            ck.eq(direct + mount, total, "%s: direct + mount = the tensors' bytes" % ckname)
            ck.eq(rereads, 0, "%s: no chunk re-read" % ckname)
            ck.eq((direct, mount), (total, 0), "%s: every byte read direct" % ckname)
            st = os.path.join(root, "model.safetensors")
            for extra in ([], ["--per-tensor"]):
                rc, out, cnt = load(["--verify"] + extra + [st])
                ck.ok(rc == 0 and re.search(r"^verify: (\d+) of \1 tensors match", out, re.M),
                      "%s: model.safetensors %s verified: %s" % (ckname, extra, out[-400:]))
                ck.ok(cnt is not None and cnt[0] + cnt[1] == total and cnt[0] > 0,
                      "%s: model.safetensors %s: tensors read direct (%r)" % (ckname, extra, cnt))
            rc, out, cnt = load(["--verify", "--no-direct"] + files)
            ck.ok(rc == 0 and cnt == (0, total, 0),
                  "%s: --no-direct: all through the mount (%r)" % (ckname, cnt))

        # another user: the store open to all, then rank 1's files closed
        # (the column blocks beside them then come through the mount)
        os.chmod(env.tmp, 0o755)
        for ckname, ref in refs:
            root = os.path.join(m.mnt, ckname)
            total = sum(ref.nbytes(n) for n in ref.tensors)
            files = tensor_files(root, ref)
            rc, out, cnt = load(["--verify"] + files, as_nobody=True)
            ck.ok(rc == 0 and cnt == (total, 0, 0),
                  "%s: uid 65534, open store: every byte direct (%r, %s)"
                  % (ckname, cnt, out[-300:]))
            payload = os.path.join(store, ckname, "rank-00001")
            closed = [os.path.join(payload, f) for f in os.listdir(payload)]
            for f in closed:
                os.chmod(f, 0o600)
            try:
                rc, out, cnt = load(["--verify"] + files, as_nobody=True)
            finally:
                for f in closed:
                    os.chmod(f, 0o644)
            n = len(files)
            ck.ok(rc == 0 and ("verify: %d of %d tensors match" % (n, n)) in out,
                  "%s: uid 65534, rank 1's files closed: every tensor right: %s"
                  % (ckname, out[-400:]))
            ck.ok(cnt is not None and cnt[0] > 0 and cnt[1] > 0 and cnt[0] + cnt[1] == total,
                  "%s: uid 65534, rank 1's files closed: those through the mount (%r)"
                  % (ckname, cnt))


def column_block(man):
    """(name, shard) of the largest 2-D tensor split by columns."""
    best = None
    for name, t in man["tensors"].items():
        for e in t["shards"]:
            if (len(t["shape"]) == 2 and "lengths" in e and e["nbytes"] > 0 and
                    e["lengths"][1] < t["shape"][1] and e["lengths"][0] > 1 and
                    (best is None or e["nbytes"] > best[1]["nbytes"])):
                best = (name, e)
    return best


def part_flip(env, ck, ref_store, ckname, ref):
    store = env.path("store-flip-" + ckname)
    shutil.copytree(ref_store, store, symlinks=True)
    with sm.Mount(env, store, name="flip-" + ckname) as m:
        root = os.path.join(m.mnt, ckname)
        man = sm.manifest_of(os.path.join(store, ckname))
        # fsdp: the largest tensor's first shard; mixed: a column block
        name = max(ref.tensors, key=ref.nbytes)
        e = man["tensors"][name]["shards"][0]
        if ckname == "mixed":
            found = column_block(man)
            if not ck.ok(found is not None, "mixed has a column block"):
                return
            name, e = found
        path = os.path.join(store, ckname, e["file"])
        st = os.stat(path)
        off = e["file_offset"] + e["nbytes"] // 2
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        rc, out, cnt = load(["--verify", sm.tensor_path(root, name)])
        ck.eq(rc, 1, "%s: flipped store byte: the load fails (%s)" % (ckname, out[-300:]))
        ck.ok("Input/output error" in out and "failed its check" in out,
              "%s: flipped store byte: the check failed, EIO from the mount: %s"
              % (ckname, out[-300:]))
        ck.ok("verify:" not in out and cnt is None,
              "%s: flipped store byte: nothing handed out" % ckname)
        rc, out, _ = load(["--verify", os.path.join(root, "model.safetensors")])
        ck.ok(rc == 1 and "Input/output error" in out,
              "%s: flipped store byte: model.safetensors fails with EIO too: %s"
              % (ckname, out[-300:]))


def test(env, ck):
    if not os.access(LOADER, os.X_OK):
        ck.ok(False, "%s is not built" % LOADER)
        return
    store = env.path("store")
    refs = [(lay, env.gen(os.path.join(store, lay), layout=lay, ranks=2, size=size,
                          block_size="64K"))
            for lay, size in (("mixed", "2M"), ("fsdp", "2M"), ("llama", "64M"))]
    part_loads(env, ck, store, refs)
    shutil.rmtree(os.path.join(store, "llama"))
    for ckname, ref in refs[:2]:
        part_flip(env, ck, store, ckname, ref)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--loader", required=True, help="shardfs-load-gpu-mock")
    known, rest = ap.parse_known_args()
    LOADER = os.path.abspath(known.loader)
    sys.exit(sm.main(test, rest))
