"""test_manifest_index - a foreign checkpoint's manifest.json survives
`shardctl index` (issue 25 (1)).

The mount synthesizes manifest.json for every format other than
shardfs/1 once per open: the finished model, the checksums an index
attached, and what the format shows besides (HF's "hf" block: the index's
and the safetensors files' metadata). Indexing used to dump it a second
time without the "hf" block.

On copies of every committed fixture the real frameworks wrote
(test/fixtures/: torch DCP, Megatron-Core torch_dist, PaddlePaddle, PaddleNLP,
Hugging Face safetensors and .bin, DCP's HF writer), each checkpoint's
manifest.json is read through a mount, every checkpoint is indexed with
`shardctl index`, and manifest.json is read again through a new mount.
The two must differ only by the "xxh3" keys the index adds to shards (same
keys in the same order, same values, same "hf" block), and the second must
carry checksums. shardfs/1 serves its own manifest as stored and is not
part of this test.
"""

import glob
import json
import os
import shutil
import sys

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.environ.get("SHARDFS_FIXTURES") or os.path.join(TOP, "test", "fixtures")
FAMILIES = ("dcp", "megatron", "megatron-0.17", "paddle", "hf", "paddlenlp")  # test/fixtures/<family>/<version>/


def collect(store):
    """Copy every committed fixture checkpoint (a directory beside its
    .expected.json) into store; {name: family}."""
    out = {}
    for fam in FAMILIES:
        for exp in sorted(glob.glob(os.path.join(FIXTURES, fam, "*", "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            if not os.path.isdir(src):
                continue
            name = "%s-%s-%s" % (fam, os.path.basename(os.path.dirname(src)),
                                 os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            out[name] = fam
    return out


def pairs(text):
    """JSON text with every object as its list of (key, value) pairs, in
    order: two equal results are the same JSON up to whitespace."""
    return json.loads(text, object_pairs_hook=list)


def strip_sums(v, found):
    """v without any "xxh3" key of an object; found[0] counts them."""
    if isinstance(v, list) and all(isinstance(p, tuple) and len(p) == 2 for p in v) and v:
        out = []
        for k, x in v:
            if k == "xxh3":
                found[0] += 1
                continue
            out.append((k, strip_sums(x, found)))
        return out
    if isinstance(v, list):
        return [strip_sums(x, found) for x in v]
    return v


def sums_of(text):
    """(uncoded non-empty shards, those of them with "xxh3") of a
    manifest.json."""
    top = json.loads(text)
    plain = summed = 0
    for sec in ("tensors", "files", "objects"):
        for e in top.get(sec, {}).values():
            for s in e["shards"]:
                if "codec" in s or s["nbytes"] == 0:
                    continue
                plain += 1
                summed += "xxh3" in s
    return plain, summed


def shown(env, store, names, tag):
    """{name: manifest.json text} of every checkpoint the mount shows."""
    out = {}
    with sm.Mount(env, store, ["--log-level", "info"], name=tag) as m:
        for n in names:
            p = os.path.join(m.mnt, n, "manifest.json")
            if os.path.exists(p):
                with open(p, "rb") as f:
                    out[n] = f.read().decode()
    return out


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    fam_of = collect(store)
    names = sorted(fam_of)
    before = shown(env, store, names, "before")
    for n in names:
        if n not in before:
            print("not shown by the mount, left out: %s" % n)
    fmt_of = {n: dict(pairs(t)).get("format", "") for n, t in before.items()}
    for want in ("torch-dcp", "megatron-torch_dist", "paddle-dcp", "hf-safetensors",
                 "hf-bin", "paddlenlp-unified", "paddlenlp-hybrid"):
        ck.ok(any(f.split(" ")[0] == want for f in fmt_of.values()),
              "a %s fixture mounted (of %s): %s" % (want, FIXTURES, sorted(set(fmt_of.values()))))
    hf_blocks = [n for n in before if "hf" in dict(pairs(before[n]))]
    ck.ok(len(hf_blocks) >= 2, "HF manifests with an \"hf\" block: %s" % hf_blocks)

    for n in sorted(before):
        r = env.shardctl_run("index", os.path.join(store, n), check=False)
        ck.eq(r.returncode, 0, "shardctl index %s: %s" % (n, r.stderr.decode(errors="replace")))

    after = shown(env, store, sorted(before), "after")
    for n in sorted(before):
        if not ck.ok(n in after, "%s: shown after indexing" % n):
            continue
        a = strip_sums(pairs(after[n]), [0])
        b = strip_sums(pairs(before[n]), [0])
        plain_b, summed_b = sums_of(before[n])
        plain_a, summed_a = sums_of(after[n])
        ck.eq(summed_b, 0, "%s: no checksums of non-empty shards before indexing" % n)
        ck.eq(summed_a, plain_a, "%s: every uncoded non-empty shard has its checksums "
              "after indexing" % n)
        if not ck.ok(a == b, "%s: manifest.json after indexing is the one before "
                     "plus \"xxh3\" keys" % n):
            ka = [k for k, _ in pairs(after[n])]
            kb = [k for k, _ in pairs(before[n])]
            print("  %s: top-level keys before %s, after %s" % (n, kb, ka))


if __name__ == "__main__":
    sys.exit(sm.main(test))
