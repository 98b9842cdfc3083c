#!/usr/bin/python3
"""Mount test (a), (c), (g): every tensor and root file byte-for-byte
against the unsharded reference, for every generator layout with different
rank counts, dtypes and a small checksum block (64 KiB, so tensors span many
blocks); STORE given as a directory of checkpoints and as one checkpoint
directory. Also random (offset, length) preads including across the end of
file, mmap(MAP_SHARED) reads equal plain reads, and manifest.json shown as
stored."""

import mmap
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

CONFIGS = [
    # (checkpoint name, layout, ranks, size, dtype, block size, seed)
    ("mixed-r3", "mixed", 3, "12M", None, "64K", 11),
    ("llama-r4-bf16", "llama", 4, "24M", "BF16", "64K", 12),
    ("fsdp-r8-f32", "fsdp", 8, "8M", "F32", "64K", 13),
    ("repl-r2-f16", "replicated", 2, "2M", "F16", "64K", 14),
    ("llama-r1-f32", "llama", 1, "2M", "F32", "4K", 15),
    ("fsdp-r5-bf16", "fsdp", 5, "3M", "BF16", "128K", 16),
]


def check_ckpt(env, ck, root, ref, ckpt_dir, label):
    rng = env.rng
    # tensors, whole
    for name in sorted(ref.tensors):
        p = sm.tensor_path(root, name)
        want = ref.tensor_bytes(name)
        try:
            got = sm.read_file(p)
        except OSError as e:
            ck.ok(False, "%s: read tensors/%s: %s" % (label, name, e))
            continue
        ck.bytes_eq(got, want, "%s: tensors/%s" % (label, name))
        ck.eq(os.stat(p).st_size, len(want), "%s: st_size of tensors/%s" % (label, name))
    # root files
    for name in sorted(ref.files):
        p = os.path.join(root, name)
        try:
            ck.bytes_eq(sm.read_file(p), ref.file_bytes(name), "%s: root file %s" % (label, name))
        except OSError as e:
            ck.ok(False, "%s: read root file %s: %s" % (label, name, e))
    # manifest.json as stored
    try:
        ck.bytes_eq(sm.read_file(os.path.join(root, "manifest.json")),
                    sm.read_file(os.path.join(ckpt_dir, "manifest.json")),
                    "%s: manifest.json as stored" % label)
    except OSError as e:
        ck.ok(False, "%s: read manifest.json: %s" % (label, e))
    # random preads, some across the end of file (c)
    names = sorted(ref.tensors)
    for _ in range(60):
        name = rng.choice(names)
        want = ref.tensor_bytes(name)
        size = len(want)
        off = rng.randrange(0, size + 8192)
        length = rng.choice([1, 3, 4096, 5000, 65536 + 7, 200000, size + 10])
        if rng.random() < 0.3 and size > 0:
            off = max(0, size - rng.randrange(1, 3000))   # straddle the end
        try:
            fd = os.open(sm.tensor_path(root, name), os.O_RDONLY)
            try:
                got = os.pread(fd, length, off)
            finally:
                os.close(fd)
        except OSError as e:
            ck.ok(False, "%s: pread(%s, %d, %d): %s" % (label, name, length, off, e))
            continue
        ck.bytes_eq(got, want[off:off + length],
                    "%s: pread(tensors/%s, len %d, off %d) of size %d" % (
                        label, name, length, off, size))
    # mmap(MAP_SHARED) equals plain read (g)
    for name in names:
        p = sm.tensor_path(root, name)
        want = ref.tensor_bytes(name)
        if not want:
            continue       # an empty file cannot be mapped
        try:
            with open(p, "rb") as f:
                with mmap.mmap(f.fileno(), len(want), flags=mmap.MAP_SHARED,
                               prot=mmap.PROT_READ) as m:
                    got = m[:]
                    # a random window too, so page faults hit the middle
                    a = rng.randrange(len(want))
                    win = m[a:a + 10000]
        except OSError as e:
            ck.ok(False, "%s: mmap tensors/%s: %s" % (label, name, e))
            continue
        ck.bytes_eq(got, want, "%s: mmap tensors/%s" % (label, name))
        ck.bytes_eq(win, want[a:a + 10000], "%s: mmap window of tensors/%s" % (label, name))


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {}
    for (cname, layout, ranks, size, dtype, bs, seed) in CONFIGS:
        refs[cname] = env.gen(os.path.join(store, cname), layout=layout,
                              ranks=ranks, size=size, dtype=dtype,
                              block_size=bs, seed=seed)

    # STORE as a directory of checkpoints
    with sm.Mount(env, store, name="store") as m:
        listed = sorted(os.listdir(m.mnt))
        ck.eq(listed, sorted(refs), "checkpoints listed at the mount root")
        for cname, ref in sorted(refs.items()):
            check_ckpt(env, ck, os.path.join(m.mnt, cname), ref,
                       os.path.join(store, cname), cname)
        ck.ok(m.alive(), "daemon alive after reading every checkpoint")

    # STORE as one checkpoint directory: the mount root is the checkpoint
    single = env.path("single")
    ref = env.gen(single, layout="mixed", ranks=2, size="2M", seed=21,
                  block_size="64K")
    with sm.Mount(env, single, name="single") as m:
        names = set(os.listdir(m.mnt))
        ck.ok({"tensors", "manifest.json", "model.safetensors"} <= names,
              "single-checkpoint mount root shows the checkpoint (got %s)" % sorted(names))
        check_ckpt(env, ck, m.mnt, ref, single, "single")
        ck.ok(m.alive(), "daemon alive after reading the single checkpoint")


if __name__ == "__main__":
    sys.exit(sm.main(run))
