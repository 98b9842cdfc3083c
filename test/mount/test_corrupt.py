#!/usr/bin/python3
"""Mount test (i): bad payloads.

Three copies of one generated checkpoint in one store, each damaged once:
  flip    one byte flipped in the middle block of one shard's payload,
  missing one payload file deleted,
  trunc   one payload file cut to half its length,
next to an intact copy. Reads that need damaged bytes fail with EIO and the
daemon logs a line naming checkpoint, tensor and shard; every other byte
(the rest of the damaged tensor, page by page, other tensors, the other
tensors' ranges of model.safetensors) reads correctly; the daemon keeps
serving. A second mount with --no-verify returns the flipped byte without
error."""

import errno
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

PAGE = 4096
GEN = dict(layout="mixed", ranks=3, size="4M", seed=61, block_size="8K")


def tensor_info(man, ref, name):
    t = man["tensors"][name]
    return t["shards"], ref.tensors[name]["shape"], ref.itemsize(name)


def pick_flip_targets(man, ref, bs):
    """Up to two (tensor, shard index, shard) to corrupt: the largest shard
    whose tensor has no overlapping shards, and the largest box shard split
    along dimension 1 (strided in the tensor), each with at least 3 checksum
    blocks so the bad block has good neighbours. Tensors with overlapping
    (replicated) shards are skipped: another copy may serve them."""
    best, best_d1 = None, None
    for name in sorted(ref.tensors):
        shards, shape, isz = tensor_info(man, ref, name)
        if sum(s["nbytes"] for s in shards) != ref.nbytes(name):
            continue
        for i, s in enumerate(shards):
            if s["nbytes"] < 3 * bs:
                continue
            if best is None or s["nbytes"] > best[2]["nbytes"]:
                best = (name, i, s)
            if ("lengths" in s and len(shape) >= 2 and s["lengths"][1] != shape[1]
                    and (best_d1 is None or s["nbytes"] > best_d1[2]["nbytes"])):
                best_d1 = (name, i, s)
    out = [t for t in (best, best_d1) if t is not None]
    if len(out) == 2 and out[0][0] == out[1][0]:
        out.pop()
    return out


def read_expect(ck, path, off, ln, want, label):
    try:
        got = sm.pread_all(path, off, ln)
    except OSError as e:
        ck.ok(False, "%s: pread(off %d, len %d): %s" % (label, off, ln, e))
        return
    ck.bytes_eq(got, want[off:off + ln], "%s: pread(off %d, len %d)" % (label, off, ln))


def check_clean_pages(ck, path, want, bad_mask, label):
    """Every page of the file with no bad byte reads correctly."""
    n = len(want)
    npages = (n + PAGE - 1) // PAGE
    page_bad = np.zeros(npages, dtype=bool)
    idx = np.nonzero(bad_mask)[0]
    page_bad[np.unique(idx // PAGE)] = True
    p = 0
    nruns = 0
    while p < npages:
        if page_bad[p]:
            p += 1
            continue
        q = p
        while q < npages and not page_bad[q]:
            q += 1
        off, end = p * PAGE, min(q * PAGE, n)
        read_expect(ck, path, off, end - off, want, label + " clean pages")
        nruns += 1
        p = q
    return nruns


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {c: env.gen(os.path.join(store, c), **GEN) for c in ("good", "flip", "missing", "trunc")}
    ref = refs["good"]
    for c in refs:
        ck.eq(refs[c].tensors, ref.tensors, "generator is deterministic for %s" % c)
    man = sm.manifest_of(os.path.join(store, "good"))
    bs = man["block_size"]

    # --- flip one byte in block 1 of one or two shards
    targets = pick_flip_targets(man, ref, bs)
    if not ck.ok(targets, "found a tensor with a shard of >= 3 blocks"):
        return
    flips = []     # (tensor, shard index, shard, bad-byte mask, flipped tensor byte)
    for fname, fshard_i, fshard in targets:
        shards, shape, isz = tensor_info(man, ref, fname)
        k = 1
        within = k * bs + 17
        with open(os.path.join(store, "flip", fshard["file"]), "r+b") as f:
            f.seek(fshard["file_offset"] + within)
            b = f.read(1)
            f.seek(fshard["file_offset"] + within)
            f.write(bytes([b[0] ^ 0xFF]))
        pos = sm.shard_positions(shape, isz, fshard)
        mask = np.zeros(ref.nbytes(fname), dtype=bool)
        mask[pos[k * bs:min((k + 1) * bs, fshard["nbytes"])]] = True
        flips.append((fname, fshard_i, fshard, mask, int(pos[within])))
        print("flip: tensor %s shard %d (%s) block %d -> tensor byte %d" % (
            fname, fshard_i, fshard["file"], k, int(pos[within])))
    flipped_names = {f[0] for f in flips}
    fshard = flips[0][2]

    # --- delete the payload file of one shard of another tensor
    files = sorted({s["file"] for t in man["tensors"].values() for s in t["shards"]})
    miss_file = next((f for f in files if f != fshard["file"]), files[0])
    os.unlink(os.path.join(store, "missing", miss_file))
    # --- truncate a payload file to half
    trunc_file = files[-1]
    tpath = os.path.join(store, "trunc", trunc_file)
    cut = os.path.getsize(tpath) // 2
    os.truncate(tpath, cut)
    print("missing: %s; truncated: %s at %d" % (miss_file, trunc_file, cut))

    def needs(name, bad_shard):
        return sm.classify(man, ref, name, bad_shard)

    with sm.Mount(env, store, name="corrupt") as m:
        # intact copy: everything correct
        for name in sorted(ref.tensors):
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(m.mnt, "good"), name)),
                            ref.tensor_bytes(name), "good: tensors/%s" % name)
            except OSError as e:
                ck.ok(False, "good: read tensors/%s: %s" % (name, e))

        # flip: EIO over the bad block, correct everywhere else
        root = os.path.join(m.mnt, "flip")
        stp = os.path.join(root, "model.safetensors")
        try:
            hlen = int.from_bytes(sm.pread_all(stp, 0, 8), "little")
            hdr = json.loads(sm.pread_all(stp, 8, hlen))
            base = 8 + hlen
        except (OSError, ValueError) as e:
            ck.ok(False, "flip: model.safetensors header: %s" % e)
            hdr, base = None, 0
        for fname, fshard_i, fsh, mask, flipped_at in flips:
            p = sm.tensor_path(root, fname)
            ck.raises(errno.EIO, lambda: sm.read_file(p), "flip: whole read of %s" % fname)
            ck.raises(errno.EIO, lambda: sm.pread_all(p, flipped_at, 1),
                      "flip: 1-byte pread of the flipped byte of %s" % fname)
            bad_idx = np.nonzero(mask)[0]
            for off in (int(bad_idx[0]), int(bad_idx[-1])):
                ck.raises(errno.EIO, lambda: sm.pread_all(p, off, 1),
                          "flip: pread of byte %d of the bad block of %s" % (off, fname))
            nruns = check_clean_pages(ck, p, ref.tensor_bytes(fname), mask, "flip: " + fname)
            ck.ok(nruns > 0, "flip: %s has clean pages to read" % fname)
            if hdr is not None:
                b0 = hdr[fname]["data_offsets"][0]
                ck.raises(errno.EIO, lambda: sm.pread_all(stp, base + b0 + flipped_at, 1),
                          "flip: model.safetensors byte of the flipped block of %s" % fname)
            lines = [l for l in m.log_lines() if "flip" in l and fname in l]
            ck.ok(lines, "flip: a log line names checkpoint 'flip' and tensor %s" % fname)
            ck.ok(any(("shard" in l.lower() or fsh["file"] in l) and "block" in l.lower()
                      for l in lines),
                  "flip: the log line names the shard and the block (lines: %s)" % lines[:3])
        for name in sorted(ref.tensors):
            if name in flipped_names:
                continue
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, name)), ref.tensor_bytes(name),
                            "flip: other tensor %s" % name)
            except OSError as e:
                ck.ok(False, "flip: read other tensor %s: %s" % (name, e))
            if hdr is None or ref.nbytes(name) == 0:
                continue
            # whole pages of model.safetensors strictly inside this tensor's range
            b, e = hdr[name]["data_offsets"]
            lo = (base + b + PAGE - 1) // PAGE * PAGE
            hi = (base + e) // PAGE * PAGE
            if hi > lo:
                try:
                    got = sm.pread_all(stp, lo, hi - lo)
                    ck.bytes_eq(got, ref.tensor_bytes(name)[lo - base - b:hi - base - b],
                                "flip: model.safetensors range of %s" % name)
                except OSError as e:
                    ck.ok(False, "flip: model.safetensors range of %s: %s" % (name, e))

        # missing / truncated payload files
        for cname, bad_shard in (
                ("missing", lambda s: s["file"] == miss_file),
                ("trunc", lambda s: s["file"] == trunc_file and
                 s["file_offset"] + s["nbytes"] > cut)):
            root = os.path.join(m.mnt, cname)
            nbroken = 0
            for name in sorted(ref.tensors):
                kind = needs(name, bad_shard)
                path = sm.tensor_path(root, name)
                if kind == "broken":
                    nbroken += 1
                    ck.raises(errno.EIO, lambda: sm.read_file(path), "%s: read of %s" % (cname, name))
                    continue
                try:
                    got = sm.read_file(path)
                except OSError as e:
                    ck.ok(kind == "either" and e.errno == errno.EIO,
                          "%s: read of %s (%s): %s" % (cname, name, kind, e))
                    continue
                ck.bytes_eq(got, ref.tensor_bytes(name), "%s: tensor %s (%s)" % (cname, name, kind))
            ck.ok(nbroken > 0, "%s: some tensor depends on the damaged file" % cname)
            ck.ok(any(cname in l and any(n in l for n in ref.tensors) for l in m.log_lines()),
                  "%s: a log line names the checkpoint and a tensor" % cname)
        # still serving (l)
        name = max(ref.tensors, key=ref.nbytes)
        try:
            ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(m.mnt, "good"), name)),
                        ref.tensor_bytes(name), "good: %s after the EIO paths" % name)
        except OSError as e:
            ck.ok(False, "good: read after the EIO paths: %s" % e)
        ck.ok(m.alive(), "daemon alive after the corruption tests")
        nerr = sum(1 for l in m.log_lines() if "flip" in l)
        ck.ok(nerr <= 400, "flip: log not flooded (%d lines)" % nerr)

    # --no-verify returns the flipped byte without error
    with sm.Mount(env, os.path.join(store, "flip"), opts=["--no-verify"], name="noverify") as m:
        for fname, fshard_i, fsh, mask, flipped_at in flips:
            want = bytearray(ref.tensor_bytes(fname))
            want[flipped_at] ^= 0xFF
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(m.mnt, fname)), bytes(want),
                            "--no-verify: %s has the flipped byte" % fname)
            except OSError as e:
                ck.ok(False, "--no-verify: read %s: %s" % (fname, e))
        ck.ok(m.alive(), "--no-verify daemon alive")


if __name__ == "__main__":
    sys.exit(sm.main(run))
