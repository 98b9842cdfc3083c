"""test_megatron017 - Megatron-Core 0.17 checkpoints mounted as they lie
(issue 27 part 3, SPEC 7).

The store holds the checkpoints a real megatron-core 0.17.1 wrote from a
GPT model and its DistributedOptimizer, TP 2 x DP 2 (test/fixtures/
megatron-0.17/, made by test/interop/make_megatron017_fixtures.py):
`gpt_tp2dp2` (0.17's defaults: the optimizer state `dp_reshardable`, one
tensor per grad-buffer bucket; layers stacked) and `gpt_tp2dp2_singleton`
(`singleton_local_shards`: one key per layer, the gated fc1 saved as
KEY_w and KEY_v), and hostile variants made from those real files by
same-length byte substitutions in .metadata (every occurrence):
- `h-lone-w`: layer 0's fc1 weight_v renamed weight_x: weight_w has no
  partner and both are shown as stored (layer 1's pair is still joined);
- `h-state`: a bucket's `.exp_avg_sq` renamed `.exp_avg.sq` (no STATE
  megatron writes): that tensor keeps its stored name, the others are
  shown under optimizer/;
- `h-short`: rank 3's .distcp cut short: the mount refuses to serve what
  is not there (reads of the tensors it held fail with EIO, or they are
  left out), never bytes from elsewhere.

Checked through one mount: every tensor's bytes against the xxh3 of what
megatron's own `dist_checkpointing.load` gave for the unsplit state dict
(check_dcp_tree.py; the buckets under optimizer/STATE/..., the singleton
pairs joined into KEY), objects/ loaded back by torch.load, views, the
format xattr, manifest.json, metadata.json and common.pt as stored; one
log line per checkpoint says the optimizer state is shown per bucket and
why no per-parameter view exists, one the singleton pairs joined; the
joined fc1 of layer i equals layer i of the stacked checkpoint's fc1
(both from the same run); each hostile variant as described. The store is
unchanged at the end.
"""

import glob
import json
import os
import shutil
import sys

import sfmount as sm
import test_dcp as td
import test_megatron as tm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "megatron-0.17")
FC1 = "decoder.layers.%s.mlp.linear_fc1.weight"
BUCKET = "dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0"


def patch_metadata(d, old, new):
    """Every occurrence of old in d/.metadata replaced by new (same length)."""
    assert len(old) == len(new)
    p = os.path.join(d, ".metadata")
    with open(p, "rb") as f:
        data = f.read()
    assert old in data, old
    with open(p, "wb") as f:
        f.write(data.replace(old, new))


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases = []
    for exp in sorted(glob.glob(os.path.join(FIXTURES, "mcore-*", "*.expected.json"))):
        src = exp[:-len(".expected.json")]
        name = os.path.basename(src)
        shutil.copytree(src, os.path.join(store, name))
        with open(exp) as f:
            cases.append((name, exp, json.load(f)))
    names = [n for n, _, _ in cases]
    if not ck.ok({"gpt_tp2dp2", "gpt_tp2dp2_singleton"} <= set(names),
                 "the megatron-core 0.17 fixtures found in %s" % FIXTURES):
        return
    ck.ok(all(e["megatron_core"].startswith("0.17") for _, _, e in cases),
          "written by megatron-core 0.17")
    single = os.path.join(store, "gpt_tp2dp2_singleton")
    stacked = os.path.join(store, "gpt_tp2dp2")
    d = shutil.copytree(single, os.path.join(store, "h-lone-w"))
    patch_metadata(d, (FC1 % 0 + "_v").encode(), (FC1 % 0 + "_x").encode())
    d = shutil.copytree(stacked, os.path.join(store, "h-state"))
    patch_metadata(d, b".bucket_idx_0.exp_avg_sq", b".bucket_idx_0.exp_avg.sq")
    d = shutil.copytree(stacked, os.path.join(store, "h-short"))
    with open(os.path.join(d, "__3_0.distcp"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, exp_path, exp in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            tm.check_tree(ck, root, exp_path, name)
            ck.eq(os.getxattr(root, "user.shardfs.format").decode(), exp["format"],
                  "%s: format xattr" % name)
            td.check_views(env, ck, root, name)
            man = sm.manifest_of(root)
            ck.eq(sorted(man.get("tensors", {})), sorted(exp["tensors"]),
                  "%s: manifest.json lists every tensor" % name)
            tm.check_root(ck, root, os.path.join(store, name), exp, name)
            for st in ("param", "exp_avg", "exp_avg_sq"):
                ck.ok(os.path.isfile(sm.tensor_path(root, "optimizer/%s/%s" % (st, BUCKET))),
                      "%s: optimizer/%s/%s shown" % (name, st, BUCKET))
        log = m.log_text()
        for name in names:
            ck.eq(len(tm.log_lines(log, '"%s"' % name, "dp_reshardable",
                                   "not in the files")), 1,
                  "%s: one log line says the optimizer state is shown per bucket" % name)
        ck.eq(len(tm.log_lines(log, '"gpt_tp2dp2_singleton"', "singleton_local_shards")), 1,
              "one log line says the singleton pairs were joined")
        # the joined fc1 of layer i = layer i of the stacked fc1
        whole = sm.read_file(sm.tensor_path(os.path.join(mnt, "gpt_tp2dp2"),
                                            "decoder.layers.mlp.linear_fc1.weight"))
        for i in range(2):
            got = sm.read_file(sm.tensor_path(os.path.join(mnt, "gpt_tp2dp2_singleton"),
                                              FC1 % i))
            n = len(got)
            ck.bytes_eq(got, whole[i * n:(i + 1) * n],
                        "joined fc1 of layer %d = the stacked checkpoint's layer %d" % (i, i))
        # h-lone-w: layer 0 as stored, layer 1 joined
        root = os.path.join(mnt, "h-lone-w")
        if ck.ok("h-lone-w" in listed, "h-lone-w is mounted"):
            joined = sm.read_file(sm.tensor_path(os.path.join(mnt, "gpt_tp2dp2_singleton"),
                                                 FC1 % 0))
            ck.ok(not os.path.exists(sm.tensor_path(root, FC1 % 0)),
                  "h-lone-w: no layer-0 fc1 joined from a lone weight_w")
            parts = [sm.read_file(sm.tensor_path(root, FC1 % 0 + s)) for s in ("_w", "_x")]
            ck.bytes_eq(parts[0] + parts[1], joined,
                        "h-lone-w: weight_w and weight_x shown as stored")
            ck.bytes_eq(sm.read_file(sm.tensor_path(root, FC1 % 1)),
                        sm.read_file(sm.tensor_path(os.path.join(mnt, "gpt_tp2dp2_singleton"),
                                                    FC1 % 1)),
                        "h-lone-w: layer 1's pair still joined")
        # h-state: the renamed bucket keeps its stored name
        root = os.path.join(mnt, "h-state")
        if ck.ok("h-state" in listed, "h-state is mounted"):
            stored = "optimizer.distributed.%s.exp_avg.sq" % BUCKET
            good = sm.tensor_path(os.path.join(mnt, "gpt_tp2dp2"),
                                  "optimizer/exp_avg_sq/" + BUCKET)
            ck.bytes_eq(sm.read_file(sm.tensor_path(root, stored)), sm.read_file(good),
                        "h-state: an unknown STATE is shown under its stored name")
            ck.ok(os.path.isfile(sm.tensor_path(root, "optimizer/exp_avg/" + BUCKET)),
                  "h-state: the other buckets are under optimizer/")
        # h-short: what rank 3 held is never served from elsewhere
        root = os.path.join(mnt, "h-short")
        if "h-short" in listed:
            good_root = os.path.join(mnt, "gpt_tp2dp2")
            served = failed = 0
            for t in sorted(json.load(open(cases[names.index("gpt_tp2dp2")][1]))["tensors"]):
                p = sm.tensor_path(root, t)
                if not os.path.exists(p):
                    failed += 1
                    continue
                try:
                    data = sm.read_file(p)
                except OSError as e:
                    ck.eq(sm.errname(e), "EIO", "h-short: %s fails with EIO" % t)
                    failed += 1
                    continue
                served += 1
                ck.bytes_eq(data, sm.read_file(sm.tensor_path(good_root, t)),
                            "h-short: %s served is the real bytes" % t)
            ck.ok(failed > 0 and served > 0,
                  "h-short: the tensors rank 3 held fail (%d), the others are "
                  "served (%d)" % (failed, served))
        else:
            ck.ok(tm.log_lines(log, "h-short"), "h-short: left out with a log line")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount")


if __name__ == "__main__":
    sys.exit(sm.main(test))
