"""test_deepspeed - DeepSpeed ZeRO checkpoints mounted as they lie (issue
27 (1), SPEC 7).

The store holds the checkpoints deepspeed 0.19.8 wrote
(test/fixtures/deepspeed/deepspeed-*, made by
test/interop/make_deepspeed_fixtures.py; committed): ZeRO 1, 2 (two tags
beside `latest`) and 3 on 2 ranks, ZeRO 3 on 3 ranks, ZeRO 2 with tied
weights (shared_params: out.weight shown as zero_to_fp32 gives it),
ZeRO 2 and 3 in fp16 (a DynamicLossScaler; ZeRO 2 with two tags),
ZeRO 2 and 3 with frozen parameters (served as stored, 16-bit, as
zero_to_fp32 gives them), ZeRO 2 with 2 tensor-parallel ranks (each mp rank under mp_rank_0T/,
against its own gathered weights and moments), the ZeRO-2 one converted
by ds_to_universal (its tensors must equal
zero_to_fp32's of the original), each in the HF
Trainer's layout (NAME/latest + NAME/global_stepN/), and one tag directory
on its own (bare); zero2-2r's global_step1 (beside the global_step2
latest names) as zero2-2r@global_step1, against zero_to_fp32's of that
tag (zero2-2r@global_step1.fp32.safetensors). Checked through one mount: every tensors/NAME
byte for byte against zero_to_fp32's own output (NAME.fp32.safetensors),
optimizer/exp_avg/NAME and optimizer/exp_avg_sq/NAME against DeepSpeed's
safe_get_full_optimizer_state (NAME.optim.safetensors), the
model.safetensors view's entries against zero_to_fp32's, module/NAME
(stage 1/2: the bf16 weights) against torch.load's (NAME.module.safetensors), the format and verified xattrs, the other
views (npy/, slices), a root file beside latest, read-only.

manifest.json's "deepspeed" key against torch.load's values of the
non-tensor entries (NAME.objects.json: step counts, ds_config, the loss
scaler, param groups, ...); objects/KEY (ds_objects.py) against
torch.load's values of the archives, through torch.load.

Hostile variants, made at test time from the real files: a pickle naming
another global (posix.system) in an optimizer archive, and in the model
states where its OrderedDicts were (each checkpoint left out with a line
naming it), a parameter whose shape claims more
elements than the partitions hold (that parameter alone left out), a
parameter name with '/..' (left out), `latest` naming a path out of the
checkpoint (left out), an optimizer archive that is a symlink out (left
out), a global_step1 that is a symlink to a tag directory outside (not
listed, not reachable as DIR@global_step1; DIR still shown), `latest`
naming ../ lists no DIR@TAG either; client state past objects/' caps
(h-objects, ds_objects.py); in the universal one, a fp32.pt linked out and a parameter
directory "a@b" (each left out alone). The store is byte-for-byte
unchanged at the end.
"""

import glob
import json
import os
import shutil
import struct
import sys

import ds_objects
import sfmount as sm
from test_dcp import check_readonly, check_views

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "deepspeed")


def st_read(path):
    """{name: (header entry, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack_from("<Q", b, 0)
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v, b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def tag_dir(ckpt):
    with open(os.path.join(ckpt, "latest")) as f:
        return os.path.join(ckpt, f.read().strip())


def patch_pickle(path, old, new, nth=1):
    """Replace the nth occurrence of old in the archive's data.pkl by new
    (same length: the stored entry is patched in place)."""
    assert len(old) == len(new)
    with open(path, "rb") as f:
        b = bytearray(f.read())
    i = -1
    for _ in range(nth):
        i = b.index(old, i + 1)
    b[i:i + len(old)] = new
    with open(path, "wb") as f:
        f.write(b)


def make_hostile(store, src2):
    """Variants of the ZeRO-2 checkpoint src2 (real files, changed)."""
    out = {}
    # a global outside the allowlist in rank 1's optimizer archive
    d = os.path.join(store, "h-global")
    shutil.copytree(src2, d)
    opt = glob.glob(os.path.join(tag_dir(d), "*rank_1_*optim_states.pt"))[0]
    sm.rewrite_pickle(opt, b"cdeepspeed.runtime.fp16.loss_scaler\nLossScaler\n",
                   b"cposix\nsystem\n")
    out["global"] = d
    # the model states' OrderedDicts (module, frozen_param_shapes: the
    # non-tensor entries manifest.json shows) named as posix.system
    d = os.path.join(store, "h-global-ms")
    shutil.copytree(src2, d)
    sm.rewrite_pickle(os.path.join(tag_dir(d), "mp_rank_00_model_states.pt"),
                   b"ccollections\nOrderedDict\n", b"cposix\nsystem\n")
    out["global-ms"] = d
    # fc2.bias (the last parameter, 5 elements) claims 99: past the
    # partitions' end
    d = os.path.join(store, "h-short")
    shutil.copytree(src2, d)
    ms = os.path.join(tag_dir(d), "mp_rank_00_model_states.pt")
    with open(ms, "rb") as f:
        b = f.read()
    shapes = b.index(b"param_shapes")
    at = b.index(b"fc2.bias", shapes)
    k5 = b.index(b"K\x05\x85", at)
    patch_pickle(ms, b[at:k5 + 3], b[at:k5] + b"K\x63\x85", nth=1)
    out["short"] = d
    # a parameter named "/../bias" (fc1.bias renamed, same length)
    d = os.path.join(store, "h-dotdot")
    shutil.copytree(src2, d)
    ms = os.path.join(tag_dir(d), "mp_rank_00_model_states.pt")
    with open(ms, "rb") as f:
        b = f.read()
    n = b[:b.index(b"param_shapes")].count(b"fc1.bias")
    patch_pickle(ms, b"fc1.bias", b"/../bias", nth=n + 1)
    out["dotdot"] = d
    # latest names a directory out of the checkpoint
    d = os.path.join(store, "h-latest")
    shutil.copytree(src2, d)
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("../h-short/global_step2")
    out["latest"] = d
    # rank 1's optimizer states a symlink to a file outside the checkpoint
    d = os.path.join(store, "h-symlink")
    shutil.copytree(src2, d)
    opt = glob.glob(os.path.join(tag_dir(d), "*rank_1_*optim_states.pt"))[0]
    outside = os.path.join(os.path.dirname(store), "outside-optim.pt")
    shutil.copyfile(opt, outside)
    os.remove(opt)
    os.symlink(outside, opt)
    out["symlink"] = d
    # global_step1 (not the tag latest names) a symlink to a directory
    # outside the store holding the real files
    d = os.path.join(store, "h-tagsym")
    shutil.copytree(src2, d)
    outside = os.path.join(os.path.dirname(store), "outside-tag")
    shutil.copytree(os.path.join(d, "global_step1"), outside)
    shutil.rmtree(os.path.join(d, "global_step1"))
    os.symlink(outside, os.path.join(d, "global_step1"))
    out["tagsym"] = d
    return out


def make_hostile_universal(store, src):
    """The universal checkpoint with zero/scale/fp32.pt a symlink out and a
    parameter directory named "a@b" (no tensor name)."""
    d = os.path.join(store, "h-universal")
    shutil.copytree(src, d)
    with open(os.path.join(d, "latest_universal")) as f:
        zero = os.path.join(d, f.read().strip(), "zero")
    fp = os.path.join(zero, "scale", "fp32.pt")
    outside = os.path.join(os.path.dirname(store), "outside-fp32.pt")
    shutil.copyfile(fp, outside)
    os.remove(fp)
    os.symlink(outside, fp)
    shutil.copytree(os.path.join(zero, "fc1.bias"), os.path.join(zero, "a@b"))
    return d


def check_case(env, ck, root, name, fx, stage):
    fp32 = st_read(fx + ".fp32.safetensors")
    optim = st_read(fx + ".optim.safetensors")
    ck.ok(len(fp32) >= 8 and len(optim) >= 12, "%s: references found" % name)
    ck.eq(os.getxattr(root, "user.shardfs.format").decode(),
          "deepspeed universal" if stage == "universal" else
          "deepspeed zero-%d 0.19.8" % stage, "%s: format xattr" % name)
    ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "no",
          "%s: verified xattr" % name)
    for k, (h, data) in sorted(fp32.items()):
        p = sm.tensor_path(root, k)
        ck.eq(sm.read_file(p) if os.path.exists(p) else None, data,
              "%s: tensors/%s is zero_to_fp32's" % (name, k))
        ck.eq(os.getxattr(p, "user.shardfs.dtype").decode()
              if os.path.exists(p) else None, h["dtype"],
              "%s: %s dtype" % (name, k))
    for k, (h, data) in sorted(optim.items()):
        if k.startswith("mp_rank_"):  # tensor parallel: per mp rank
            pre, rest = k.split("/", 1)
            p = sm.tensor_path(root, pre + "/optimizer/" + rest)
        else:
            p = sm.tensor_path(root, "optimizer/" + k)
        ck.eq(sm.read_file(p) if os.path.exists(p) else None, data,
              "%s: tensors/optimizer/%s is DeepSpeed's" % (name, k))
    buf = sm.read_file(os.path.join(root, "model.safetensors"))
    hdr, base = sm.parse_safetensors(buf)
    for k, (h, data) in sorted(fp32.items()):
        e = hdr.get(k)
        ck.eq(buf[base + e["data_offsets"][0]:base + e["data_offsets"][1]]
              if e else None, data, "%s: model.safetensors %s" % (name, k))
    mod = os.path.join(root, "tensors", "module")
    if stage == "universal":
        ck.ok(not os.path.exists(mod), "%s: no module/ (universal)" % name)
    elif stage <= 2:
        module = st_read(fx + ".module.safetensors")
        ck.eq(sorted(module), sorted(k for k in fp32 if k != "counts"),
              "%s: a module reference per parameter" % name)
        for k, (h, data) in sorted(module.items()):
            if k.startswith("mp_rank_"):  # tensor parallel: per mp rank
                pre, rest = k.split("/", 1)
                p = os.path.join(root, "tensors", pre, "module", rest)
            else:
                p = os.path.join(mod, k)
            ck.eq((os.getxattr(p, "user.shardfs.dtype").decode(),
                   json.loads(os.getxattr(p, "user.shardfs.shape")),
                   sm.read_file(p)) if os.path.exists(p) else None,
                  (h["dtype"], h["shape"], data),
                  "%s: module/%s is torch.load's (%s)" % (name, k, h["dtype"]))
    else:
        ck.ok(not os.path.exists(mod), "%s: no module/ (ZeRO-3 stores none)" % name)
    check_views(env, ck, root, name)


def norm_obj(v):
    """manifest.json's rendering of a value, in the reference's shape
    (NAME.objects.json: torch.load's values; tensors by dtype and shape;
    an int enum as its int; another object's class and attributes)."""
    if isinstance(v, dict):
        if "tensor" in v and set(v) == {"tensor", "shape"}:
            return {"tensor": v["tensor"], "shape": v["shape"]}
        if "class" in v:
            if "args" in v and "state" not in v:
                return norm_obj(v["args"][0])
            return {"class": v["class"], "value": norm_obj(v.get("state"))}
        return {k: norm_obj(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm_obj(x) for x in v]
    return v


TORCH_DT = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16",
            "torch.int64": "I64"}


def norm_ref(v):
    if isinstance(v, dict):
        if "tensor" in v and set(v) == {"tensor", "shape"}:
            return {"tensor": TORCH_DT.get(v["tensor"], v["tensor"]), "shape": v["shape"]}
        return {k: norm_ref(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm_ref(x) for x in v]
    return v


def check_objects(ck, root, name, fx):
    """manifest.json's "deepspeed": every non-tensor entry of the model
    states and rank 0's optimizer states as torch.load gives it."""
    ref_path = fx + ".objects.json"
    if not os.path.exists(ref_path):
        return
    with open(ref_path) as f:
        ref = json.load(f)
    with open(os.path.join(root, "manifest.json")) as f:
        got = json.load(f).get("deepspeed")
    if not ck.ok(isinstance(got, dict), "%s: manifest.json has \"deepspeed\"" % name):
        return
    for part in ("model_states", "optim_states"):
        ck.eq(norm_obj(got.get(part)), norm_ref(ref[part]),
              "%s: manifest.json deepspeed.%s is torch.load's" % (name, part))


def check_other_tag(ck, mnt, listed, name, fx, tag):
    """NAME@TAG: the tag beside the one latest names, shown as a checkpoint
    of its own, byte for byte zero_to_fp32's of that tag."""
    shown = name + "@" + tag
    ref = fx + "@" + tag + ".fp32.safetensors"
    if not ck.ok(os.path.exists(ref), "%s: reference %s" % (shown, ref)):
        return
    if not ck.ok(shown in listed, "%s is listed beside %s" % (shown, name)):
        return
    root = os.path.join(mnt, shown)
    fp32 = st_read(ref)
    latest = st_read(fx + ".fp32.safetensors")
    ck.ok(any(fp32[k][1] != latest[k][1] for k in fp32),
          "%s: its reference differs from latest's" % shown)
    ck.ok(os.getxattr(root, "user.shardfs.format").decode().startswith("deepspeed zero-"),
          "%s: format xattr" % shown)
    for k, (h, data) in sorted(fp32.items()):
        p = sm.tensor_path(root, k)
        ck.eq(sm.read_file(p) if os.path.exists(p) else None, data,
              "%s: tensors/%s is zero_to_fp32's of %s" % (shown, k, tag))
    buf = sm.read_file(os.path.join(root, "model.safetensors"))
    hdr, base = sm.parse_safetensors(buf)
    ck.eq(sorted(hdr), sorted(sm.parse_safetensors(sm.read_file(
        os.path.join(mnt, name, "model.safetensors")))[0]),
          "%s: the same entries as %s" % (shown, name))
    for k, (h, data) in sorted(fp32.items()):
        e = hdr.get(k)
        ck.eq(buf[base + e["data_offsets"][0]:base + e["data_offsets"][1]]
              if e else None, data, "%s: model.safetensors %s" % (shown, k))


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases = []
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "deepspeed-*"))):
        for meta in sorted(glob.glob(os.path.join(vdir, "*.json"))):
            if meta.endswith(".objects.json"):
                continue  # a reference, not a case
            src = meta[:-len(".json")]
            with open(meta) as f:
                info = json.load(f)
            name = os.path.basename(src)
            shutil.copytree(src, os.path.join(store, name))
            if "universal_of" in info:  # ds_to_universal of another case:
                # the same tensors, that case's references
                cases.append((name, os.path.join(vdir, info["universal_of"]),
                              "universal"))
            else:
                cases.append((name, src, info["stage"]))
    ck.ok(len(cases) >= 6, "deepspeed fixtures found in %s" % FIXTURES)
    src3 = [c for c in cases if c[0] == "zero3-2r"]
    src2 = [c for c in cases if c[0] == "zero2-2r"]
    if src3:  # a tag directory on its own
        shutil.copytree(tag_dir(src3[0][1]), os.path.join(store, "bare3"))
        cases.append(("bare3", src3[0][1], 3))
    uni = [c for c in cases if c[0] == "universal-zero2"]
    if uni:  # a universal tag directory on its own
        u = os.path.join(store, "universal-zero2")
        with open(os.path.join(u, "latest_universal")) as f:
            shutil.copytree(os.path.join(u, f.read().strip()),
                            os.path.join(store, "bare-universal"))
        cases.append(("bare-universal", uni[0][1], "universal"))
    first = cases[0][0]
    with open(os.path.join(store, first, "config.json"), "w") as f:
        f.write('{"hidden_size": 7}\n')
    hostile = make_hostile(store, src2[0][1]) if src2 else {}
    h_objects = src2 and ds_objects.make_hostile_objects(store, src2[0][1])
    if uni:
        make_hostile_universal(store, os.path.join(store, "universal-zero2"))

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        for name, src, stage in cases:
            root = os.path.join(mnt, name)
            if ck.ok(name in listed, "%s is mounted" % name):
                check_case(env, ck, root, name, src, stage)
                if stage != "universal" and name == os.path.basename(src):
                    check_objects(ck, root, name, src)
                    if "tp" not in name:  # mp rank 0 only: the same
                        ds_objects.check(ck, root, name, tag_dir(src))
        ck.eq(sm.read_file(os.path.join(mnt, first, "config.json")),
              b'{"hidden_size": 7}\n', "a root file beside latest")
        check_readonly(env, ck, mnt, cases[0][0])
        log = m.log_text()
        ck.ok('"global_step2" shown (latest names it); 1 other directory beside it, a store lists each tag as NAME@TAG'
              in log, "zero2-2r: one info line says where global_step1 is shown")
        tags = []  # (NAME, TAG) of every NAME@TAG reference
        for name, src, stage in cases:
            if name == os.path.basename(src):
                for ref in sorted(glob.glob(glob.escape(src) + "@*.fp32.safetensors")):
                    tags.append((name, ref[len(src) + 1:-len(".fp32.safetensors")]))
        ck.ok(("zero2-2r", "global_step1") in tags, "zero2-2r@global_step1's reference found")
        for name, tag in tags:
            check_other_tag(ck, mnt, listed, name, dict((c[0], c[1]) for c in cases)[name], tag)
        ck.eq(sorted(n for n in listed if "@" in n),
              sorted(["%s@%s" % t for t in tags] +
                     ["%s@global_step1" % h for h in
                      ("h-short", "h-dotdot", "h-global", "h-global-ms", "h-symlink") +
                      (("h-objects",) if h_objects else ())]),
              "the other tags listed: zero2-2r's and its copies' (not h-latest's, not h-tagsym's link)")
        ck.ok("h-latest@global_step1" not in listed,
              "latest naming ../: no DIR@TAG listed either")
        ck.ok("h-tagsym" in listed and "h-tagsym@global_step1" not in listed,
              "a tag directory that is a symlink out: not listed, latest's still shown")
        for bad in ("h-tagsym@global_step1", "h-latest@global_step1",
                    "zero2-2r@global_step2", "zero2-2r@..", "zero2-2r@nothere",
                    "@global_step1"):
            try:
                os.stat(os.path.join(mnt, bad))
                ck.ok(False, "%s: not reachable by its name" % bad)
            except FileNotFoundError:
                ck.ok(True, "%s: not reachable by its name" % bad)
        # hostile
        ck.ok("h-global" not in listed, "a pickle naming posix.system: left out")
        ck.ok("posix.system" in log and "not allowed" in log,
              "the log names the refused global")
        ck.ok("h-global-ms" not in listed,
              "model states whose OrderedDicts name posix.system: left out")
        ck.ok(any('"h-global-ms" left out' in ln and "mp_rank_00_model_states.pt" in ln
                  and "posix.system is not allowed" in ln for ln in log.splitlines()),
              "the log says why h-global-ms is left out (the global, the file)")
        if h_objects:
            ds_objects.check_hostile(ck, mnt, listed, log)
        ck.ok("h-latest" not in listed, "latest naming ../: left out")
        ck.ok("latest names" in log, "the log says latest names no directory of it")
        if ck.ok("h-short" in listed, "a short partition leaves one tensor out"):
            t = os.path.join(mnt, "h-short", "tensors")
            ck.ok(not os.path.exists(os.path.join(t, "fc2.bias")),
                  "h-short: fc2.bias (99 elements claimed) left out")
            ck.ok(not os.path.exists(os.path.join(t, "optimizer", "exp_avg", "fc2.bias")),
                  "h-short: its exp_avg left out")
            ck.ok("fewer elements" in log, "h-short: the log says why")
            ref = st_read(src2[0][1] + ".fp32.safetensors")
            ck.eq(sm.read_file(os.path.join(t, "fc2.weight")), ref["fc2.weight"][1],
                  "h-short: the other tensors still served")
        if ck.ok("h-dotdot" in listed, "a name with /.. leaves that tensor out"):
            names = []
            for dp, _, fns in os.walk(os.path.join(mnt, "h-dotdot", "tensors")):
                names += [os.path.join(dp, f) for f in fns]
            ck.ok(not any("bias" == os.path.basename(n) for n in names),
                  "h-dotdot: no tensor from /../bias")
            ck.ok(os.path.exists(os.path.join(mnt, "h-dotdot", "tensors", "fc1.weight")),
                  "h-dotdot: the others shown")
        ck.ok("h-symlink" not in listed, "an optimizer archive linked out: left out")
        if ck.ok("h-universal" in listed, "universal with a link out: shown"):
            t = os.path.join(mnt, "h-universal", "tensors")
            ck.ok(not os.path.exists(os.path.join(t, "scale")),
                  "h-universal: scale (fp32.pt linked out) left out")
            ck.ok(os.path.exists(os.path.join(t, "optimizer", "exp_avg", "scale")),
                  "h-universal: scale's moments still shown")
            ck.ok(not any("a@b" in n for n in os.listdir(t)),
                  "h-universal: a@b left out")
            ck.ok('"a@b" left out' in m.log_text(), "h-universal: the log says so")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")
    if src2:
        check_live_latest(env, ck, src2[0][1])


def wait_for(pred, secs=10):
    import time
    end = time.time() + secs
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def check_live_latest(env, ck, src):
    """While mounted, `latest` is rewritten to name global_step1 (as a
    save names its new tag): within seconds DIR shows global_step1's
    weights and DIR@global_step2 replaces DIR@global_step1."""
    store = env.path("store-live")
    os.makedirs(store)
    d = os.path.join(store, "ck")
    shutil.copytree(src, d)
    step1 = st_read(src + "@global_step1.fp32.safetensors")
    step2 = st_read(src + ".fp32.safetensors")
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        w = sm.tensor_path(os.path.join(m.mnt, "ck"), "fc2.weight")
        ck.eq(sm.read_file(w), step2["fc2.weight"][1], "live: ck is global_step2")
        ck.eq(sorted(os.listdir(m.mnt)), ["ck", "ck@global_step1"], "live: the tags listed")
        with open(os.path.join(d, "latest.tmp"), "w") as f:
            f.write("global_step1")
        os.replace(os.path.join(d, "latest.tmp"), os.path.join(d, "latest"))
        ck.ok(wait_for(lambda: sorted(os.listdir(m.mnt)) == ["ck", "ck@global_step2"]),
              "live: a new latest lists ck@global_step2 instead (got %s)" % os.listdir(m.mnt))
        ck.ok(wait_for(lambda: os.path.exists(w) and
                       sm.read_file(w) == step1["fc2.weight"][1]),
              "live: ck is global_step1's now")


if __name__ == "__main__":
    sys.exit(sm.main(test))
