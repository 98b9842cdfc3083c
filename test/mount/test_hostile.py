#!/usr/bin/python3
"""Mount test (j): hostile and malformed manifests in a store next to a good
checkpoint. Each broken checkpoint (a copy of a valid one with one thing
wrong in manifest.json) must be absent from the mount with a log line
naming it; the good checkpoint mounts and reads byte-for-byte; the daemon
keeps running."""

import copy
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def first_tensor(m, want_box=False):
    for name in sorted(m["tensors"]):
        t = m["tensors"][name]
        if t["shape"] and t["shards"] and (not want_box or "offsets" in t["shards"][0]):
            return name, t
    raise RuntimeError("no suitable tensor in the manifest")


def rename_tensor(m, new):
    name, t = first_tensor(m)
    m["tensors"][new] = m["tensors"].pop(name)
    return m


def mut_dtype(m):
    first_tensor(m)[1]["dtype"] = "F128"
    return m


def mut_shape_overflow(m):
    first_tensor(m)[1]["shape"] = [1 << 40, 1 << 40, 1 << 40]
    return m


def mut_shard_outside(m):
    name, t = first_tensor(m, want_box=True)
    s = t["shards"][0]
    s["offsets"] = [o + d for o, d in zip(s["offsets"], t["shape"])]
    return m


def mut_flat_outside(m):
    for t in m["tensors"].values():
        for s in t["shards"]:
            if "flat" in s:
                s["flat"][0] += 1 << 60
                return m
    return mut_shard_outside(m)


def mut_dotdot_file(m):
    s = first_tensor(m)[1]["shards"][0]
    s["file"] = "../good/" + s["file"]         # a real file, outside the checkpoint
    return m


def mut_abs_file(m, good_dir):
    s = first_tensor(m)[1]["shards"][0]
    s["file"] = os.path.join(good_dir, s["file"])
    return m


def mut_world(m):
    m["world_size"] = -1
    return m


def mut_block(m):
    m["block_size"] = 0
    return m


def mut_format(m):
    m["format"] = "shardfs/99"
    return m


def mut_xxh3(m):
    s = first_tensor(m)[1]["shards"][0]
    s["xxh3"] = s["xxh3"][:-1] if len(s["xxh3"]) > 1 else []
    return m


def mut_nbytes(m):
    s = first_tensor(m)[1]["shards"][0]
    s["nbytes"] = s["nbytes"] + 1
    return m


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "good"), layout="mixed", ranks=2, size="1M",
                  seed=71, block_size="64K")
    base = env.path("base")
    env.gen(base, layout="mixed", ranks=2, size="1M", seed=72, block_size="64K", ref=False)
    with open(os.path.join(base, "manifest.json")) as f:
        base_text = f.read()
    base_man = json.loads(base_text)
    good_dir = os.path.join(store, "good")

    texts = {
        "bad-json": base_text[:len(base_text) // 2],
        "empty-manifest": "",
        "not-object": "[]",
        "deep-nesting": "[" * 100000 + "]" * 100000,
        "trailing-junk": base_text + "}{",
    }
    muts = {
        "unknown-dtype": mut_dtype,
        "shape-overflow": mut_shape_overflow,
        "shard-outside": mut_shard_outside,
        "flat-outside": mut_flat_outside,
        "dotdot-file": mut_dotdot_file,
        "abs-file": lambda m: mut_abs_file(m, good_dir),
        "ctrl-name": lambda m: rename_tensor(m, "ctrl\u0001name"),
        "nul-name": lambda m: rename_tensor(m, "nul\u0000name"),
        "dotdot-name": lambda m: rename_tensor(m, "../escape"),
        "abs-name": lambda m: rename_tensor(m, "/etc/passwd"),
        "newline-name": lambda m: rename_tensor(m, "new\nline"),
        "negative-world": mut_world,
        "zero-block": mut_block,
        "wrong-format": mut_format,
        "short-xxh3": mut_xxh3,
        "wrong-nbytes": mut_nbytes,
    }
    for name, fn in muts.items():
        texts[name] = json.dumps(fn(copy.deepcopy(base_man)))
    for name, text in texts.items():
        d = os.path.join(store, name)
        shutil.copytree(base, d)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            f.write(text)

    with sm.Mount(env, store, name="hostile") as m:
        listed = sorted(os.listdir(m.mnt))
        ck.eq(listed, ["good"], "only the good checkpoint is mounted")
        log = m.log_lines()
        for name in sorted(texts):
            ck.ok(not os.path.exists(os.path.join(m.mnt, name)),
                  "broken checkpoint %s is absent" % name)
            ck.ok(any(name in l for l in log),
                  "a log line names the broken checkpoint %s" % name)
        root = os.path.join(m.mnt, "good")
        for name in sorted(ref.tensors):
            try:
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, name)), ref.tensor_bytes(name),
                            "good: tensors/%s" % name)
            except OSError as e:
                ck.ok(False, "good: read tensors/%s: %s" % (name, e))
        ck.ok(m.alive(), "daemon alive next to hostile manifests")


if __name__ == "__main__":
    sys.exit(sm.main(run))
