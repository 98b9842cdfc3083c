"""test_colossal - ColossalAI's distributed checkpoint IO (PR 6181,
gather_dtensor=False) mounted whole (issue 28 (1), SPEC 7).

The store holds the checkpoints the PR's own writer made
(test/fixtures/colossal/colossal-pr6181, by
test/interop/make_colossal_fixtures.py; committed): tensor parallel 2,
safetensors and .bin, sharded (several shards per writer) and not
(`file` holding the save-time directory), pipeline stages 0 and 1
merged by name, a vocabulary padded for tensor
parallelism (writer 1 stores more rows than its lengths), buffers with no
meta entry. Checked through one mount: every tensor byte for byte against
the unsplit state dict (NAME.safetensors) through tensors/,
model.safetensors and npy/, the views, the format xattr, a root file, and
read-only.

Hostile variants, made at test time from the real files: a meta `file`
whose base name is a symlink leading out of the checkpoint, and one
naming a path elsewhere (../../etc/passwd: its base name is no file
here); lengths longer than what a writer stores; offsets + lengths past
global_shape; offsets that make two writers overlap; lengths that leave
a gap; writers that disagree on global_shape; a buffer whose bytes differ
between writers; a meta entry naming a buffer's shard file (no such
tensor there); a .bin whose pickle names another global (posix.system:
the checkpoint is left out). Each wrong tensor is left out with a line
naming why; nothing wrong is served: every tensor still shown equals the
reference. The store is byte-for-byte unchanged at the end. On copies,
shardctl index + verify: every replica equals the copy served.
"""

import glob
import json
import os
import shutil
import sys

import sfmount as sm
from test_dcp import check_readonly, check_views
from test_dtensor import check_case as dt_check_case
from test_dtensor import st_read

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "colossal")
META1 = "pytorch_model-meta-dist-00001"


def meta_path(d, w):
    p = glob.glob(os.path.join(d, "pytorch_model-meta-dist-%05d.*json" % w))
    return p[0]


def edit_meta(d, w, fn):
    p = meta_path(d, w)
    with open(p) as f:
        m = json.load(f)
    fn(m["metadata"])
    with open(p, "w") as f:
        json.dump(m, f, indent=4)


def check_case(env, ck, root, name, ref, left_out=()):
    """Every reference tensor but left_out, byte for byte (test_dtensor's
    check, with this format's xattr)."""
    dt_check_case(env, ck, root, name, ref, left_out, fmt="colossalai-dist 1.0")


def make_hostile(store, st, bin_sharded):
    out = {}

    def copy(name, src):
        d = os.path.join(store, name)
        shutil.copytree(src, d, symlinks=True)
        out[name] = d
        return d

    # writer 1's embed.weight from a symlink that leads out of the checkpoint
    d = copy("h-link", st)
    first = os.path.basename(sorted(glob.glob(os.path.join(d, "model-dist-00001-shard-*")))[0])
    os.symlink(os.path.join("..", os.path.basename(st), first),
               os.path.join(d, "evil.safetensors"))
    edit_meta(d, 1, lambda m: m["embed.weight"].update(file="/save/time/evil.safetensors"))
    # a path out of the checkpoint: its base name is no file here
    d = copy("h-path", st)
    edit_meta(d, 1, lambda m: m["embed.weight"].update(file="../../etc/passwd"))
    # sizes that lie
    d = copy("h-lengths", st)  # writer 1 stores 16 rows of up.weight
    edit_meta(d, 1, lambda m: m["up.weight"].update(lengths=[20, 8]))
    d = copy("h-past", st)
    edit_meta(d, 1, lambda m: m["up.weight"].update(offsets=[24, 0]))
    d = copy("h-overlap", st)
    edit_meta(d, 1, lambda m: m["up.weight"].update(offsets=[8, 0]))
    d = copy("h-gap", st)
    edit_meta(d, 1, lambda m: m["up.weight"].update(lengths=[8, 8]))
    d = copy("h-global", st)
    edit_meta(d, 1, lambda m: m["down.bias"].update(global_shape=[9]))
    # writer 1's pos_ids differs from writer 0's
    d = copy("h-buffer", st)
    p = [f for f in sorted(glob.glob(os.path.join(d, "model-dist-00001-shard-*")))
         if "pos_ids" in st_read(f)][0]
    hdr = st_read(p)["pos_ids"][0]
    with open(p, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(8 + n + hdr["data_offsets"][0])
        f.write(b"\x55")
    # a meta entry naming a file that does not hold the parameter
    d = copy("h-file", st)
    edit_meta(d, 0, lambda m: m["norm.weight"].update(
        file=os.path.basename(p).replace("-00001-", "-00000-")))
    # a pickle naming another global
    d = copy("h-global-pickle", bin_sharded)
    sm.rewrite_pickle(sorted(glob.glob(os.path.join(d, "pytorch_model-dist-00001-shard-*")))[0],
                      b"ctorch._utils\n_rebuild_tensor_v2\n", b"cposix\nsystem\n")
    return out


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases = []
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "colossal-*"))):
        for meta in sorted(glob.glob(os.path.join(vdir, "*.json"))):
            src = meta[:-len(".json")]
            name = "%s-%s" % (os.path.basename(vdir), os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name))
            with open(meta) as f:
                cases.append((name, src, json.load(f)))
    ck.ok(len(cases) >= 5, "colossal fixtures found in %s" % FIXTURES)
    st = [c[1] for c in cases if c[1].endswith("/st-sharded")]
    ck.ok(any(c[2].get("pp", 1) > 1 for c in cases), "a pipeline-parallel fixture")
    bs = [c[1] for c in cases if c[1].endswith("/bin-sharded")]
    first = cases[0][0]
    with open(os.path.join(store, first, "config.json"), "w") as f:
        f.write('{"hidden_size": 8}\n')
    hostile = {}
    if st and bs:
        shutil.copytree(st[-1], os.path.join(store, "st-sharded-src"))
        hostile = make_hostile(store, os.path.join(store, "st-sharded-src"), bs[-1])
    ref = st_read(st[-1] + ".safetensors") if st else {}

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, src, _ in cases:
            root = os.path.join(mnt, name)
            if ck.ok(name in listed, "%s is mounted" % name):
                check_case(env, ck, root, name, st_read(src + ".safetensors"))
                check_views(env, ck, root, name)
        log = m.log_text()
        ck.eq(sm.read_file(os.path.join(mnt, first, "config.json")),
              b'{"hidden_size": 8}\n', "a root file beside the writers' files")
        check_readonly(env, ck, mnt, first)
        if not hostile:
            return
        ck.ok("h-global-pickle" not in listed, "a pickle naming posix.system: left out")
        ck.ok("posix.system" in log and "not allowed" in log,
              "the log names the refused global")
        expect = {
            "h-link": ("embed.weight", "leads out of the checkpoint"),
            "h-path": ("embed.weight", "writer 1: its file \"passwd\" is missing"),
            "h-lengths": ("up.weight", "writer 1 stores 16 elements along dimension 0, its lengths say 20"),
            "h-past": ("up.weight", "writer 1: offsets + lengths (24 + 16) past global_shape (32)"),
            "h-overlap": ("up.weight", "overlap"),
            "h-gap": ("up.weight", "not covered"),
            "h-global": ("down.bias", "disagree on its global_shape"),
            "h-buffer": ("pos_ids", "a buffer (no meta entry) that writers 0 and 1 hold differently"),
            "h-file": ("norm.weight", "does not hold it"),
        }
        for h, (key, why) in sorted(expect.items()):
            if ck.ok(h in listed, "%s: shown" % h):
                check_case(env, ck, os.path.join(mnt, h), h, ref, [key])
                line = [ln for ln in log.splitlines() if '"%s": "%s" left out' % (h, key) in ln]
                ck.ok(line and why in line[0], "%s: %s left out, the log says %r: %r"
                      % (h, key, why, line))
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")

    # shardctl index + verify: every replica (a replicated parameter every
    # writer holds whole) equals the copy served
    vstore = env.path("vstore")
    os.makedirs(vstore)
    for name, src, info in cases:
        d = os.path.join(vstore, name)
        shutil.copytree(src, d)
        rc, outv = sm.index_then_verify(env, ck, d, name)
        ck.eq(rc, 0, "%s: verify passes: %s" % (name, outv))
        if info["tp"] > 1:  # replicated parameters: every tp writer's copy
            ck.ok("replicas equal" in outv and " 0 replicas" not in outv,
                  "%s: verify compared its replicas: %s" % (name, outv))


if __name__ == "__main__":
    sys.exit(sm.main(test))
