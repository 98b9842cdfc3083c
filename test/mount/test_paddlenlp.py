"""test_paddlenlp - PaddleNLP unified and hybrid-parallel checkpoints
mounted as they lie (issue 28 (2) (3), SPEC 7).

The store holds the unified checkpoints paddlenlp 2.8.1 (paddle 3.3.1)
wrote with its own save_single_card_checkpoint / save_single_card_optimizer
(test/fixtures/paddlenlp/paddlenlp-*, made by
test/interop/make_paddlenlp_fixtures.py; committed): a bfloat16 Llama with
fp32 master weights (its bf16 tensors stored as U16) and the same model in
float32 (no master weights); and the hybrid-parallel checkpoints made
from a bf16 Llama by PaddleNLP's own split functions
(_get_tensor_parallel_mappings) and paddle.save under the trainer's names:
tensor parallel 2 (model_state.tpXX.pdparams, optimizer.tpXX.pdopt with
master_weights), and tensor parallel 2 x pipeline 2 x sharding stage 1 (V1)
2 with fused QKV and [gate, up] (model_state.tpXX_ppYY.pdparams,
optimizer.tpXX_ppYY_shardZZ.pdopt, model_meta.json), the same with
sharding V2 (1-D slices of the padded buffers, laid out by paddle's own
build_reduce_scatter_buffer), and the V1 one in float32 saved with
save_sharded_model (model_state.tpXX_ppYY_shardZZ.pdparams: each sharding
rank's parameters) and in bfloat16 (the model files then hold no
parameter; states and master weights named by model_meta.json), each against the unsplit state dict (which
PaddleNLP's merge functions give back); and, from paddlenlp 3.0.0b4's
split functions (2.8.1 has neither model), tensor parallel 2 of a Qwen2
(GQA, q/k/v biases; fused and tied: lm_head cut by rows, its states
under lm_head.weight) and of a Mistral (k/v replicated), and from 2.8.1's of a Mixtral (every
expert cut) and a Qwen 1 (fused [q, k, v] cut three ways), each joined by its model_type's rules.

Checked through one mount: every tensor (model weights by name,
optimizer/STATE/PARAM, master_weights/PARAM) byte for byte against the
xxh3 of the array paddlenlp was handed, with its dtype (BF16 where
config.json says bfloat16) and shape (test/interop/check_dcp_tree.py);
model.safetensors, npy/ and slices against tensors/; the format,
manifest.json and its "paddlenlp" block; config.json and the scheduler as
root files; every change fails with EROFS.

Hostile variants, made at test time from the real files: an index that
sends a file's tensors out of the checkpoint (`../`), an optimizer file
that is a symlink out, an index that puts a tensor in a file that lacks
it, a safetensors header whose shape lies (the file left out), a master
weights index with a duplicate key (the checkpoint left out), config.json
gone (U16 stays U16, bytes the same), a save still being written (a
numbered optimizer file of 2 with only 1 there: not shown as a unified
checkpoint; the Hugging Face adapter shows its complete model weights,
U16), and the model alone (likewise the Hugging Face adapter's). Nothing wrong or from outside is
served. Of the tensor-parallel checkpoint: a pickle naming builtins.print
(left out, the log names it), a norm whose rank-1 shape lies (left out),
rank 1's q_proj under another name (a gap: it, its states and master
weight left out), rank 1's optimizer file a symlink out (its states and
master weights left out), rank 1's model file missing (not shown), a
model_type whose cuts are not known (gpt: left out). Of the sharding V2
checkpoint: a straddling slice renamed away (a gap) and a slice claimed
for a parameter another rank holds whole (past its range): those states
left out, the log says why. Of the save_sharded_model one: a sharding
rank's model file missing (not shown: still being written); of the bf16
one (whose model files hold no parameter: every one has a master weight,
and model_meta.json alone names the states) model_meta.json cut short:
nothing shown, the log says why. The store is
byte-for-byte unchanged at the end.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys

import xxhash

import sfmount as sm
from test_dcp import check_readonly, check_views

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEROP = os.path.join(TOP, "test", "interop")
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "paddlenlp")
PY = "/usr/bin/python3"
MODEL = "model-00001-of-00001.safetensors"
OPT = "optimizer-00001-of-00001.safetensors"
MW = "master_weights-00001-of-00001.safetensors"


def check_tree(ck, root, exp, label):
    r = subprocess.run([PY, os.path.join(INTEROP, "check_dcp_tree.py"), root, exp],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    ck.eq(r.returncode, 0, "%s: check_dcp_tree: %s%s" % (
        label, r.stdout.decode(errors="replace")[-3000:],
        r.stderr.decode(errors="replace")[-2000:]))


def edit_json(path, fn):
    with open(path) as f:
        j = json.load(f)
    fn(j)
    with open(path, "w") as f:
        json.dump(j, f, indent=2)


def st_rewrite_header(path, fn):
    """The safetensors file's header JSON changed by fn, the data kept."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack_from("<Q", b, 0)
    h = json.loads(b[8:8 + n])
    fn(h)
    nh = json.dumps(h).encode()
    nh += b" " * ((8 - len(nh) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(nh)) + nh + b[8 + n:])


def st_names(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    return sorted(k for k in h if k != "__metadata__")


def patch_after(path, key, old, new):
    """In the pickle at path, the first run old (same length as new) after
    the string key, replaced in place."""
    with open(path, "rb") as f:
        b = bytearray(f.read())
    k = bytes([0x8c, len(key)]) + key.encode()
    i = b.index(k) + len(k)
    j = b.index(old, i)
    b[j:j + len(old)] = new
    with open(path, "wb") as f:
        f.write(b)


def make_hostile_hp(store, src, outside):
    """Variants of the tp2 hybrid checkpoint: {name: (left-out names, or
    None when the checkpoint is left out)}."""
    out = {}
    q = "llama.layers.0.self_attn.q_proj.weight"
    norm = "llama.layers.1.input_layernorm.weight"

    def copy(name):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        return d

    d = copy("hp-global")  # paddle's tensor wrapper naming builtins.print
    patch_after(os.path.join(d, "optimizer.tp01.pdopt"), "builtins", b"\x8c\x05tuple",
                b"\x8c\x05print")
    out["hp-global"] = None
    d = copy("hp-shape")  # rank 1's norm: 16 elements claimed as 17
    patch_after(os.path.join(d, "model_state.tp01.pdparams"), norm, b"K\x10\x85",
                b"K\x11\x85")
    out["hp-shape"] = [norm]
    d = copy("hp-gap")  # rank 1's q_proj under another name (its one
    # string, the name table's key a memo of it): a gap
    with open(os.path.join(d, "model_state.tp01.pdparams"), "rb") as f:
        b = f.read()
    b = b.replace(b"\x8c\x26" + q.encode(), b"\x8c\x26" + q[:-1].encode() + b"X", 1)
    with open(os.path.join(d, "model_state.tp01.pdparams"), "wb") as f:
        f.write(b)
    out["hp-gap"] = "/" + q  # the weight, its states and master weight
    d = copy("hp-link")  # rank 1's optimizer file a symlink out
    shutil.copy(os.path.join(src, "optimizer.tp01.pdopt"), os.path.join(outside, "o.pdopt"))
    os.unlink(os.path.join(d, "optimizer.tp01.pdopt"))
    os.symlink(os.path.join(outside, "o.pdopt"), os.path.join(d, "optimizer.tp01.pdopt"))
    out["hp-link"] = "optimizer"
    d = copy("hp-missing")  # rank 1's model file not there yet
    os.unlink(os.path.join(d, "model_state.tp01.pdparams"))
    out["hp-missing"] = None
    d = copy("hp-gpt")  # a model_type whose cuts shardfs does not know
    edit_json(os.path.join(d, "config.json"), lambda j: j.update(model_type="gpt"))
    out["hp-gpt"] = None
    return out


def make_hostile_v2(store, src):
    """Variants of the sharding V2 checkpoint whose slices lie, each key
    renamed in place (every occurrence, same length) in tensor rank 0,
    stage 0, sharding rank 1's file: {name: left-out names}."""
    out = {}
    f1 = "optimizer.tp00_pp00_shard01.pdopt"
    L0 = "llama.layers.0."

    def rename(name, old, new):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        with open(os.path.join(d, f1), "rb") as f:
            b = f.read()
        assert b.count(old.encode()) == 2, old
        with open(os.path.join(d, f1), "wb") as f:
            f.write(b.replace(old.encode(), new.encode()))

    # [gate, up]'s moment1 straddles ranks 0 and 1: rank 1's slice gone (a gap)
    rename("v2-gap", "linear_60.w_0_fp32_master_0_moment1_0",
           "linear_60.w_0_fp32_master_0_moment1_9")
    out["v2-gap"] = ["optimizer/moment1_0/" + L0 + "mlp.gate_up_fused_proj.weight"]
    # down_proj's moment2 slice claimed for o_proj, which rank 0 holds
    # whole: o_proj's slices run past its buffer range, down_proj has none
    rename("v2-beyond", "linear_61.w_0_fp32_master_0_moment2_0",
           "linear_59.w_0_fp32_master_0_moment2_0")
    out["v2-beyond"] = ["optimizer/moment2_0/" + L0 + "self_attn.o_proj.weight",
                        "optimizer/moment2_0/" + L0 + "mlp.down_proj.weight"]
    return out


def make_hostile(store, src, outside):
    """{name: (expected names left out, why)} of the variants of src."""
    out = {}

    def copy(name):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        return d

    os.makedirs(outside, exist_ok=True)
    shutil.copy(os.path.join(src, MODEL), os.path.join(outside, MODEL))
    shutil.copy(os.path.join(src, OPT), os.path.join(outside, OPT))

    d = copy("h-out")  # the model index sends every weight out
    edit_json(os.path.join(d, "model.safetensors.index.json"),
              lambda j: j["weight_map"].update(
                  {k: "../outside/" + MODEL for k in j["weight_map"]}))
    out["h-out"] = st_names(os.path.join(src, MODEL))

    d = copy("h-link")  # the optimizer file a symlink out
    os.unlink(os.path.join(d, OPT))
    os.symlink(os.path.join(outside, OPT), os.path.join(d, OPT))
    out["h-link"] = ["optimizer/%s/%s" % (k.rsplit("/", 1)[1], k.rsplit("/", 1)[0])
                     for k in st_names(os.path.join(src, OPT))]

    d = copy("h-missing")  # a master weight put in the optimizer's file
    victim = st_names(os.path.join(src, MW))[0]
    edit_json(os.path.join(d, "master_weights.safetensors.index.json"),
              lambda j: j["weight_map"].update({victim: OPT}))
    out["h-missing"] = ["master_weights/" + victim]

    d = copy("h-shape")  # a header whose shape lies: the file left out
    first = st_names(os.path.join(src, MW))[0]

    def grow(h):
        h[first]["shape"] = [s * 2 for s in h[first]["shape"]]
    st_rewrite_header(os.path.join(d, MW), grow)
    out["h-shape"] = ["master_weights/" + k for k in st_names(os.path.join(src, MW))]

    d = copy("h-dup")  # an index JSON with a key twice: the checkpoint out
    p = os.path.join(d, "master_weights.safetensors.index.json")
    with open(p) as f:
        t = f.read()
    i = t.index('"weight_map": {') + len('"weight_map": {')
    with open(p, "w") as f:
        f.write(t[:i] + '"%s": "%s", ' % (victim, MW) + t[i:])
    out["h-dup"] = None

    d = copy("h-noconfig")  # no config.json: U16 stays U16
    os.unlink(os.path.join(d, "config.json"))
    out["h-noconfig"] = []

    d = copy("h-writing")  # optimizer-00001-of-00002 without its 2nd file
    os.rename(os.path.join(d, OPT), os.path.join(d, "optimizer-00001-of-00002.safetensors"))
    out["h-writing"] = []

    d = copy("h-modelonly")  # the model alone: Hugging Face weights
    for n in os.listdir(d):
        if n.startswith(("optimizer", "master_weights")):
            os.unlink(os.path.join(d, n))
    out["h-modelonly"] = []
    return out


def check_bytes(ck, root, exp, name, left_out, dtype_of=None):
    """Every expected tensor but left_out: bytes (xxh3), dtype, shape; the
    left-out ones absent; nothing else in tensors/."""
    shown = set()
    for dp, _, fns in os.walk(os.path.join(root, "tensors")):
        for f in fns:
            shown.add(os.path.relpath(os.path.join(dp, f), os.path.join(root, "tensors")))
    want = {k: v for k, v in exp["tensors"].items() if k not in left_out}
    ck.eq(sorted(shown), sorted(want), "%s: the tensors shown" % name)
    for k, e in sorted(want.items()):
        p = sm.tensor_path(root, k)
        if not ck.ok(os.path.exists(p), "%s: %s shown" % (name, k)):
            continue
        raw = sm.read_file(p)
        ck.eq((len(raw), "%016x" % xxhash.xxh3_64_intdigest(raw)),
              (e["nbytes"], e["xxh3"]), "%s: %s bytes" % (name, k))
        dt = dtype_of(e["dtype"]) if dtype_of else e["dtype"]
        ck.eq((os.getxattr(p, "user.shardfs.dtype").decode(),
               json.loads(os.getxattr(p, "user.shardfs.shape"))),
              (dt, e["shape"]), "%s: %s dtype and shape" % (name, k))


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    outside = os.path.join(store, "..", "outside")
    cases = []
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "paddlenlp-*"))):
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            name = "%s-%s" % (os.path.basename(vdir), os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name))
            cases.append((name, src, exp))
    ck.ok(len(cases) >= 2, "paddlenlp fixtures found in %s" % FIXTURES)
    bf16 = [c for c in cases if c[0].endswith("-bf16")]
    hostile = make_hostile(store, bf16[-1][1], os.path.abspath(outside)) if bf16 else {}
    tp2 = [c for c in cases if c[0].endswith("-tp2")]
    hostile_hp = make_hostile_hp(store, tp2[-1][1], os.path.abspath(outside)) if tp2 else {}
    if tp2:
        with open(tp2[-1][2]) as f:
            exph = json.load(f)
    smc = [c for c in cases if c[0].endswith("-tp2pp2sh2sm")]
    if smc:  # save_sharded_model: one sharding rank's model file not there yet
        shutil.copytree(smc[-1][1], os.path.join(store, "sm-missing"))
        os.unlink(os.path.join(store, "sm-missing", "model_state.tp01_pp01_shard01.pdparams"))
    smb = [c for c in cases if c[0].endswith("-tp2pp2sh2smbf16")]
    if smb:  # bf16: only model_meta.json names the states; here it is cut short
        shutil.copytree(smb[-1][1], os.path.join(store, "smbf16-badmeta"))
        with open(os.path.join(store, "smbf16-badmeta", "model_meta.json"), "r+") as f:
            f.truncate(100)
        with open(smb[-1][2]) as f:
            expsmb = json.load(f)
    v2 = [c for c in cases if c[0].endswith("-tp2pp2sh2v2")]
    hostile_v2 = make_hostile_v2(store, v2[-1][1]) if v2 else {}
    if v2:
        with open(v2[-1][2]) as f:
            expv2 = json.load(f)
    with open(bf16[-1][2]) as f:
        expb = json.load(f)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, src, exp in cases:
            root = os.path.join(mnt, name)
            if not ck.ok(name in listed, "%s is mounted" % name):
                continue
            check_tree(ck, root, exp, name)
            check_views(env, ck, root, name)
            with open(exp) as f:
                e = json.load(f)
            hybrid = os.path.exists(os.path.join(src, "config.json")) and \
                not os.path.exists(os.path.join(src, "model.safetensors.index.json"))
            want_fmt = "paddlenlp-unified"
            if hybrid:
                with open(os.path.join(src, "config.json")) as f:
                    tpd = json.load(f).get("tensor_parallel_degree", 1)
                pp = 2 if "pp2sh2" in name else 1
                want_fmt = "paddlenlp-hybrid tp%d pp%d sharding%d" % (tpd, pp, pp)
            ck.eq(os.getxattr(root, "user.shardfs.format").decode(), want_fmt,
                  "%s: format xattr" % name)
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
                  "%s: verified xattr" % name)
            man = sm.manifest_of(root)
            ck.eq(man.get("format"), want_fmt, "%s: manifest format" % name)
            ck.eq(sorted(man.get("tensors", {})), sorted(e["tensors"]),
                  "%s: manifest.json lists every tensor" % name)
            if not hybrid:
                ck.eq(man.get("paddlenlp"), {"u16_as_bf16": name.endswith("-bf16"),
                                             "optimizer": True,
                                             "master_weights": name.endswith("-bf16")},
                      "%s: manifest.json's paddlenlp block" % name)
            else:
                ck.ok(all(sh.get("file", "").endswith((".pdparams", ".pdopt"))
                          for t in man.get("tensors", {}).values() for sh in t["shards"]),
                      "%s: shards point into the trainer's files" % name)
            ck.eq(sorted(os.listdir(root)) and
                  sm.read_file(os.path.join(root, "config.json")),
                  open(os.path.join(src, "config.json"), "rb").read(),
                  "%s: config.json a root file" % name)
            ck.ok(any(k.startswith("optimizer/moment1_0/") for k in e["tensors"]),
                  "%s: optimizer states expected" % name)
        if bf16:
            ck.ok(any(v["dtype"] == "BF16" for v in expb["tensors"].values()) and
                  any(k.startswith("master_weights/") for k in expb["tensors"]),
                  "bf16: BF16 weights and master weights expected")
            check_readonly(env, ck, mnt, bf16[-1][0])
        log = m.log_text()
        for h, left in sorted(hostile.items()):
            root = os.path.join(mnt, h)
            if left is None:
                ck.ok(h not in listed, "%s: not shown" % h)
                continue
            if not ck.ok(h in listed, "%s: shown" % h):
                continue
            if h in ("h-noconfig", "h-modelonly", "h-writing"):
                want = expb if h == "h-noconfig" else {"tensors": {
                    k: v for k, v in expb["tensors"].items()
                    if not k.startswith(("optimizer/", "master_weights/"))}}
                check_bytes(ck, root, want, h, [],
                            lambda d: "U16" if d == "BF16" else d)
                ck.eq(os.getxattr(root, "user.shardfs.format").decode(),
                      "paddlenlp-unified" if h == "h-noconfig" else "hf-safetensors",
                      "%s: format" % h)
                continue
            check_bytes(ck, root, expb, h, left)
            check_views(env, ck, root, h)
        ck.ok('"h-dup" left out: master_weights.safetensors.index.json: index JSON: duplicate object key'
              in log, "h-dup: the log names the index")
        ck.ok('"h-out": model file "../outside/%s" is not a plain file name inside the checkpoint' % MODEL
              in log, "h-out: the log names the file out of the checkpoint")
        ck.ok('"h-link": optimizer file "%s" leads out of the checkpoint' % OPT in log,
              "h-link: the log says the symlink leads out")
        ck.ok('"h-missing": "master_weights/' in log and "which does not hold it" in log,
              "h-missing: the log says why")
        ck.ok('master_weights file "%s" does not decode' % MW in log,
              "h-shape: the log says the file does not decode")
        for h, left in sorted(hostile_hp.items()):
            root = os.path.join(mnt, h)
            if left is None:
                ck.ok(h not in listed, "%s: left out" % h)
                continue
            if not ck.ok(h in listed, "%s: shown" % h):
                continue
            if left == "optimizer":  # master weights live in it too
                left = [k for k in exph["tensors"]
                        if k.startswith(("optimizer/", "master_weights/"))]
            elif isinstance(left, str):
                left = [k for k in exph["tensors"] if ("/" + k).endswith(left)]
            check_bytes(ck, root, exph, h, left)
        if hostile_hp:
            ck.ok('"hp-global" left out: "optimizer.tp01.pdopt": ' in log and
                  "builtins.print" in log, "hp-global: the log names the global")
            ck.ok('"hp-shape": "%s" left out: its pieces on tensor ranks 0 and 1 differ' %
                  "llama.layers.1.input_layernorm.weight" in log, "hp-shape: the log says why")
            ck.ok('"hp-gap": "llama.layers.0.self_attn.q_proj.weight" left out: tensor rank 1 holds no piece of it'
                  in log, "hp-gap: the log says why")
            ck.ok('"hp-link": "optimizer.tp01.pdopt" leads out of the checkpoint' in log,
                  "hp-link: the log says the symlink leads out")
            ck.ok('"hp-gpt" left out: tensor parallel over 2 ranks: how PaddleNLP cuts model_type gpt is not known'
                  in log, "hp-gpt: the log says why")
        if smc:
            ck.ok("sm-missing" not in listed, "sm-missing: not shown")
        if smb and ck.ok("smbf16-badmeta" in listed, "smbf16-badmeta: shown"):
            check_bytes(ck, os.path.join(mnt, "smbf16-badmeta"), expsmb, "smbf16-badmeta",
                        list(expsmb["tensors"]))
            ck.ok('checkpoint "smbf16-badmeta": model_meta.json: ' in log and
                  "the model files alone name the optimizer's states" in log,
                  "smbf16-badmeta: the log says model_meta.json is malformed")
        for h, left in sorted(hostile_v2.items()):
            root = os.path.join(mnt, h)
            if ck.ok(h in listed, "%s: shown" % h):
                check_bytes(ck, root, expv2, h, left)
        if hostile_v2:
            ck.ok('"v2-gap": "optimizer/moment1_0/llama.layers.0.mlp.gate_up_fused_proj.weight" left out: '
                  'sharding V2 slices on tensor rank 0: its slices do not add up to its padded size' in log,
                  "v2-gap: the log says why")
            ck.ok('"v2-beyond": "optimizer/moment2_0/llama.layers.0.self_attn.o_proj.weight" left out: '
                  'sharding V2 slices on tensor rank 0: its slices run beyond its padded buffer range' in log,
                  "v2-beyond: the log says why")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")


if __name__ == "__main__":
    sys.exit(sm.main(test))
