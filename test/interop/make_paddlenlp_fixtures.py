"""make_paddlenlp_fixtures - PaddleNLP unified checkpoints written by
PaddleNLP's own code, with what shardfs must show for each.

    PYTHON make_paddlenlp_fixtures.py OUTDIR

PYTHON: a venv with paddlepaddle 3.3.1 (CPU) and paddlenlp 2.8.1 (pins:
../shared notes; tools/interop.sh's paddlenlp venv). With paddlenlp
3.0.0b4 on PYTHONPATH instead (installed --no-deps beside that venv:
test/fixtures/paddlenlp/README.md) it makes only the models 2.8.1 lacks:
qwen2tp2, qwen2tp2fusedtied (tied embeddings: lm_head.weight the
embedding's parameter, its states under the last name, as paddlenlp
names them) and mistraltp2, as tp2 below. Writes
OUTDIR/paddlenlp-VERSION/NAME/ and NAME.expected.json (check_dcp_tree.py's
shape: every tensor's name as shardfs shows it, dtype, shape, bytes and
xxh3 of the array handed to the writer).

What runs: a tiny LlamaForCausalLM (paddlenlp's own, from a LlamaConfig of
2 layers, hidden 16, vocabulary 64) in bfloat16 with AdamW
multi_precision (fp32 master weights; paddle 3.3.1 has no bf16 matmul or
adamw kernel on CPU, so the optimizer makes its state as its first step
would, _create_accumulators, and the moments get values by set_value), then paddlenlp's own
save_single_card_checkpoint and save_single_card_optimizer (the unified
checkpoint of a one-card run: model-00001-of-00001.safetensors,
optimizer-*, master_weights-* and their three indexes, config.json),
exactly as Trainer._save calls them with unified_checkpoint on one card.
The ground truth is the model's state_dict and the optimizer's state_dict
(renamed as paddlenlp names them: PARAM/STATE, master weights by PARAM)
taken before the save: the bytes the writer got.

- bf16:   the unified checkpoint of the bf16 model (U16 in the files,
          config.json dtype bfloat16: shown as BF16)
- fp32:   the same model in float32 after one real AdamW step (no master
          weights: the optimizer index says "master_weights": false)

and hybrid-parallel checkpoints (make_hybrid; the trainer's tensor-parallel
layers do not run on CPU, so paddlenlp's own split functions cut the state
and paddle.save writes each piece under the trainer's file names):

- tp2:        tensor parallel 2
- tp2pp2sh2:  tensor parallel 2 x pipeline 2 x sharding stage 1 (V1) 2,
              fused QKV and [gate, up]
- tp2pp2sh2v2: the same with sharding stage 1 V2 (split_param): each
              sharding rank's .pdopt holds 1-D slices of the flattened,
              padded parameter buffer; the slice bounds are computed by
              paddle's own build_reduce_scatter_buffer (ShardingGradView:
              _index, _padded_size, _param_begin/_param_end, with the GPU
              alignment of 256 bytes: the code refuses a CPU place, so its
              device type is set to "gpu"; nothing runs on a GPU) over the
              groups of paddle's own assign_group_by_size, the states cut by
              paddlenlp's own reshard/sharding_v2 pad_tensor and
              slice_tensor, and put back together by its merge_tensors
- tp2pp2sh2sm: tp2pp2sh2 in float32 saved with save_sharded_model: each
              sharding rank's model_state.tpXX_ppYY_shardZZ.pdparams holds
              the parameters V1 gives it (sharding_io.filter_sharded_params);
              no master weights (float32), so none are dropped
- tp2pp2sh2smbf16: the same in bfloat16: every parameter has a master
              weight, so exclude_paramters_in_state_dict leaves each model
              file without parameters (paddlenlp's loader casts the master
              weights back); states and master weights are named by
              model_meta.json's structure_name_mapping
- mixtraltp2: a bf16 MixtralForCausalLM (2 experts) at tensor parallel 2:
              every expert's w1/w3 cut by columns, w2 by rows
- qwentp2:    a bf16 QWenForCausalLM (Qwen 1) at tensor parallel 2: the
              fused [q, k, v] c_attn weight and bias cut three ways
"""

import importlib.metadata
import json
import os
import shutil
import sys

import numpy as np
import xxhash

import paddle
import paddlenlp
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

try:
    from paddlenlp.trainer.plugins import unified_checkpoint as uc
except ImportError:  # paddlenlp 3: a package (only its hybrid fixtures made)
    from paddlenlp.trainer.unified_checkpoint import utils as uc


def xxh3(b):
    return "%016x" % xxhash.xxh3_64_intdigest(b)


NPDT = {"float32": "F32", "float16": "F16", "uint16": "BF16", "float64": "F64",
        "int64": "I64", "int32": "I32"}


def entry(arr, bf16):
    a = np.ascontiguousarray(arr)
    dt = NPDT[str(a.dtype)]
    if dt == "BF16" and not bf16:
        dt = "U16"
    return {"dtype": dt, "shape": list(a.shape), "nbytes": a.nbytes,
            "xxh3": xxh3(a.tobytes())}


def to_np(t):
    return t.cpu().numpy() if isinstance(t, paddle.Tensor) else np.asarray(t)


class Args:
    """What save_single_card_* read of TrainingArguments (nothing)."""


def make(out, dtype):
    paddle.seed(7)
    np.random.seed(7)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=32,
                      dtype=dtype)
    paddle.set_default_dtype(dtype)
    model = LlamaForCausalLM(cfg)
    paddle.set_default_dtype("float32")
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(),
                                 multi_precision=(dtype != "float32"))
    if dtype == "float32":  # one real step
        ids = paddle.to_tensor(np.random.randint(0, 64, size=(2, 8)), dtype="int64")
        loss = model(input_ids=ids, labels=ids)[0]
        loss.backward()
        opt.step()
        opt.clear_grad()
    else:
        # paddle 3.3.1 has no bfloat16 matmul or adamw kernel on CPU: the
        # optimizer makes its own state (fp32 master weights cast from the
        # bf16 parameters, moments, beta powers) as its first step would,
        # and the moments get values (set_value) so that every tensor's
        # bytes are its own
        opt._create_accumulators(paddle.static.default_main_program().global_block(),
                                 model.parameters())
        rs = np.random.RandomState(11)
        for acc, per in sorted(opt._accumulators.items()):
            if not acc.startswith("moment"):
                continue
            for _, t in sorted(per.items()):
                v = rs.standard_normal(t.shape).astype("float32")
                t.set_value(np.abs(v) if acc.startswith("moment2") else v)

    bf16 = dtype == "bfloat16"
    exp = {"paddle": paddle.__version__, "paddlenlp": importlib.metadata.version("paddlenlp"),
           "objects": {}, "tensors": {}}
    sd = model.state_dict()
    for k, v in sd.items():
        exp["tensors"][k] = entry(to_np(v), bf16)
    st2 = {v.name: k for k, v in sd.items()}
    osd = opt.state_dict()
    for k, v in osd.items():
        if k in ("master_weights", "LR_Scheduler"):
            continue
        static, typ = uc.generate_base_static_name(k)
        exp["tensors"]["optimizer/%s/%s" % (typ, st2[static])] = entry(to_np(v), bf16)
    for k, v in osd.get("master_weights", {}).items():
        exp["tensors"]["master_weights/" + st2[k]] = entry(to_np(v), bf16)

    if os.path.exists(out):
        shutil.rmtree(out)
    uc.save_single_card_checkpoint(Args(), model, out)
    uc.save_single_card_optimizer(Args(), model, opt, out)
    readback(out, exp, bf16)
    return exp


def readback(out, exp, bf16):
    """Every file through paddlenlp's own reader (model_utils.load_state_dict,
    as its unified-checkpoint loader reads each file) equals what was
    handed to the writer, and every expected tensor is found once."""
    from paddlenlp.transformers.model_utils import load_state_dict
    seen = set()
    for ix, shown in (("model", lambda k: k),
                      ("optimizer", lambda k: "optimizer/%s/%s" % (k.rsplit("/", 1)[1],
                                                                  k.rsplit("/", 1)[0])),
                      ("master_weights", lambda k: "master_weights/" + k)):
        p = os.path.join(out, ix + ".safetensors.index.json")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            wm = json.load(f)["weight_map"]
        for fn in sorted(set(wm.values())):
            sd = load_state_dict(os.path.join(out, fn))
            for k, v in sd.items():
                name = shown(k)
                assert wm[k] == fn and entry(to_np(v), bf16) == exp["tensors"][name], name
                seen.add(name)
    assert seen == set(exp["tensors"]), sorted(set(exp["tensors"]) ^ seen)


# --- hybrid parallel: model_state.tpXX_ppYY.pdparams, optimizer.tpXX_ppYY_shardZZ.pdopt ---

def suffix(tp, pp, shard, T, P, Z):
    """TrainingArguments.weight_name_suffix / optimizer_name_suffix: only
    the degrees > 1 appear."""
    parts = []
    if T > 1:
        parts.append("tp%02d" % tp)
    if P > 1:
        parts.append("pp%02d" % pp)
    if shard is not None and Z > 1:
        parts.append("shard%02d" % shard)
    return "_".join(parts)


def stage_of(key, L, P):
    """The pipeline stage that holds key: embeddings on the first, norm and
    lm_head on the last, layers evenly (as PaddleNLP's LlamaForCausalLMPipe
    splits a uniform stack)."""
    if P == 1:
        return 0
    if ".layers." in key:
        return int(key.split(".layers.")[1].split(".")[0]) * P // L
    return 0 if "embed_tokens" in key else P - 1


def v2_slices(keys, local, Z):
    """Sharding V2 (DygraphShardingOptimizerV2): {key: {z: (begin, end)}}
    of each parameter's padded flat range that sharding rank z holds, as
    paddle's own build_reduce_scatter_buffer lays the comm buffers out
    (parameters in the optimizer's order, stably sorted by dtype, grouped
    by assign_group_by_size at the default 256 MB), relative to the
    parameter's start; and {key: padded_size}."""
    import paddle.distributed.fleet.utils.tensor_fusion_helper as tfh
    tfh.__current_device_type__ = "gpu"  # its alignment; refuses "cpu"
    ps = []
    for k in keys:
        p = paddle.create_parameter(list(local[k].shape), dtype="bfloat16",
                                    default_initializer=paddle.nn.initializer.Constant(0.0))
        p.name = k
        ps.append(p)
    ps.sort(key=lambda x: str(x.dtype))
    out, padded = {}, {}
    for _, params in tfh.assign_group_by_size(ps, 256 * 1024 * 1024).items():
        for z in range(Z):
            views = tfh.build_reduce_scatter_buffer(params, Z, z)[0]
            for k, v in views.items():
                padded[k] = int(v._padded_size)
                if v._param_begin < v._param_end:
                    out.setdefault(k, {})[z] = (int(v._param_begin) - int(v._index),
                                                int(v._param_end) - int(v._index))
    return out, padded


def model_of(kind):
    """The (config, model) classes of kind and the prefix of its base
    model's names (its _get_tensor_parallel_mappings keys lack it)."""
    if kind == "llama":
        return LlamaConfig, LlamaForCausalLM, "llama."
    import paddlenlp.transformers as pt
    if kind == "qwen":  # Qwen 1: its mappings' keys carry the "qwen." prefix
        return pt.QWenConfig, pt.QWenForCausalLM, ""
    name = {"qwen2": "Qwen2", "mistral": "Mistral", "mixtral": "Mixtral"}[kind]
    return getattr(pt, name + "Config"), getattr(pt, name + "ForCausalLM"), kind + "."


def make_hybrid(out, T, P, Z, fuse, v2=False, vocab=64, sharded_model=False,
                dtype="bfloat16", kind="llama", **extra):
    """The full model split as PaddleNLP's own split functions split it for
    T tensor-parallel ranks, P pipeline stages and Z sharding (stage 1, V1,
    or V2 with v2) ranks, each piece saved with paddle.save under the
    trainer's names. (V2 uses vocabulary 288: the first stage's buffer then
    holds 25 units of 256 elements, and the boundary of the two sharding
    ranks' slices falls mid-row in layer 0's fused [gate, up] weight.)"""
    paddle.seed(5)
    Config, Model, prefix = model_of(kind)
    kw = dict(vocab_size=vocab, hidden_size=16, intermediate_size=24,
              num_hidden_layers=2 * P, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=32,
              dtype=dtype, fuse_attention_qkv=fuse, fuse_attention_ffn=fuse)
    kw.update(extra)
    cfg = Config(**kw)
    paddle.set_default_dtype(dtype)
    model = Model(cfg)
    paddle.set_default_dtype("float32")
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(),
                                 multi_precision=True)
    opt._create_accumulators(paddle.static.default_main_program().global_block(),
                             model.parameters())
    rs = np.random.RandomState(13)
    for acc, per in sorted(opt._accumulators.items()):
        if acc.startswith("moment"):
            for _, t in sorted(per.items()):
                t.set_value(rs.standard_normal(t.shape).astype("float32"))
    sd = {k: to_np(v) for k, v in model.state_dict().items()}
    static = {k: v.name for k, v in model.state_dict().items()}
    st2 = {v: k for k, v in static.items()}
    osd = opt.state_dict()
    states = {}  # struct -> {STATE: array}
    for k, v in osd.items():
        if k in ("master_weights", "LR_Scheduler"):
            continue
        sname, typ = uc.generate_base_static_name(k)
        states.setdefault(st2[sname], {})[typ] = (k, to_np(v))
    master = {st2[k]: to_np(v) for k, v in osd.get("master_weights", {}).items()}

    exp = {"paddle": paddle.__version__, "paddlenlp": importlib.metadata.version("paddlenlp"),
           "objects": {}, "tensors": {}}
    for k, a in sd.items():
        if not (sharded_model and k in master):  # not saved: see below
            exp["tensors"][k] = entry(a, True)
    for k, per in states.items():
        for typ, (_, a) in per.items():
            exp["tensors"]["optimizer/%s/%s" % (typ, k)] = entry(a, True)
    for k, a in master.items():
        exp["tensors"]["master_weights/" + k] = entry(a, True)

    def split(key, a, r):
        cfg.tensor_parallel_degree = T
        cfg.tensor_parallel_rank = r
        fns = Model._get_tensor_parallel_mappings(cfg, is_split=True)
        kk = key[len(prefix):] if key.startswith(prefix) else key
        return (fns[kk](a) if kk in fns and a.ndim > 0 and a.size > 1 else a), kk in fns

    def merged(key, pieces):
        cfg.tensor_parallel_degree = T
        cfg.tensor_parallel_rank = 0
        fns = Model._get_tensor_parallel_mappings(cfg, is_split=False)
        kk = key[len(prefix):] if key.startswith(prefix) else key
        return fns[kk](pieces) if kk in fns else pieces[0]

    # V1's partition: parameters by size, largest first, to the least full rank
    order = sorted(sd, key=lambda k: -int(np.prod(sd[k].shape)))
    owner, sizes = {}, [0] * Z
    for k in order:
        z = sizes.index(min(sizes))
        owner[k] = z
        sizes[z] += int(np.prod(sd[k].shape))

    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    L = cfg.num_hidden_layers
    metas = {}
    for r in range(T):
        for s in range(P):
            keys = [k for k in sd if stage_of(k, L, P) == s]
            msd = {}
            for k in keys:
                t = paddle.to_tensor(split(k, sd[k], r)[0])
                t.name = static[k]
                msd[k] = t
            if sharded_model:
                # save_sharded_model: sharding_io's filter_sharded_params (V1:
                # the parameters param2rank gives rank z), then, with bf16,
                # exclude_paramters_in_state_dict drops every parameter that
                # has a master weight (the loader casts those back)
                for z in range(Z):
                    zsd = {k: t for k, t in msd.items()
                           if owner[k] == z and k not in master}
                    paddle.save(zsd, os.path.join(
                        out, "model_state.%s.pdparams" % suffix(r, s, z, T, P, Z)))
            else:
                sfx = suffix(r, s, None, T, P, Z)
                paddle.save(msd, os.path.join(out, "model_state.%s.pdparams" % sfx))
            if v2:
                from paddlenlp.trainer.utils.reshard import sharding_v2
                local = {k: split(k, sd[k], r)[0] for k in keys}
                sl, padded = v2_slices(keys, local, Z)
                osaves = [{} for _ in range(Z)]
                mws = [{} for _ in range(Z)]

                def cut(k, a, name, into):
                    whole = paddle.to_tensor(a)
                    pieces = []
                    for z, (b, e) in sorted(sl[k].items()):
                        t = sharding_v2.slice_tensor(
                            sharding_v2.pad_tensor(k, whole, padded[k]), b, e)
                        t.name = name
                        into[z][name if into is osaves else static[k]] = t
                        pieces.append(t)
                    back = sharding_v2.merge_tensors(k, pieces, list(a.shape))
                    assert back.numpy().tobytes() == a.tobytes(), (k, name)

                for k in keys:
                    for typ, (okey, a) in states[k].items():
                        if a.size > 1:
                            cut(k, split(k, a, r)[0], okey, osaves)
                        else:  # beta powers: on every rank with a slice
                            for z in sl[k]:
                                osaves[z][okey] = paddle.to_tensor(a)
                                osaves[z][okey].name = okey
                    cut(k, split(k, master[k], r)[0], static[k] + "_fp32_master_0", mws)
                for z in range(Z):
                    osaves[z]["master_weights"] = mws[z]
                    paddle.save(osaves[z], os.path.join(
                        out, "optimizer.%s.pdopt" % suffix(r, s, z, T, P, Z)))
                metas["tp%02d_pp%02d" % (r, s)] = {
                    "param2rank": {},
                    "structure_name_mapping": {k: static[k] for k in keys},
                    "sharding_strategy": "ShardingV2", "enable_overlap": False}
                continue
            for z in range(Z):
                osave, mw = {}, {}
                for k in keys:
                    if owner[k] != z:
                        continue
                    # a tied weight's states under its last name (as paddlenlp
                    # names them: {static: struct} over the state dict)
                    for typ, (okey, a) in states.get(k, {}).items():
                        osave[okey] = paddle.to_tensor(split(k, a, r)[0] if a.size > 1 else a)
                        osave[okey].name = okey  # as the optimizer names them
                    if k in master:
                        mw[static[k]] = paddle.to_tensor(split(k, master[k], r)[0])
                        mw[static[k]].name = static[k] + "_fp32_master_0"
                if mw or not sharded_model:
                    osave["master_weights"] = mw
                paddle.save(osave, os.path.join(out, "optimizer.%s.pdopt" % suffix(r, s, z, T, P, Z)))
            metas["tp%02d_pp%02d" % (r, s)] = {
                "param2rank": {static[k]: owner[k] for k in keys},
                "structure_name_mapping": {k: static[k] for k in keys},
                "sharding_strategy": "ShardingV1", "enable_overlap": False}
    # what sharding_io.save_distributed_model_meta writes (rank 0; only
    # with sharding stage 1)
    with open(os.path.join(out, "model_meta.json"), "w") if Z > 1 else open(os.devnull, "w") as f:
        json.dump({"parallel_config": {"pp_degree": P, "mp_degree": T, "sharding_degree": Z,
                                       "vpp_degree": 1},
                   "sharding_metas": metas}, f, indent=4)
    cfg.tensor_parallel_degree = T
    cfg.tensor_parallel_rank = 0
    cfg.save_pretrained(out)
    # the ground truth is what PaddleNLP's own merge functions give back
    for k, a in sd.items():
        pieces = [split(k, a, r)[0] for r in range(T)]
        m = merged(k, pieces)
        assert np.asarray(m).tobytes() == a.tobytes(), k
    return exp


def main():
    top = os.path.join(sys.argv[1], "paddlenlp-" + importlib.metadata.version("paddlenlp"))
    os.makedirs(top, exist_ok=True)
    import paddlenlp.transformers as pt
    if hasattr(pt, "Qwen2ForCausalLM"):
        # paddlenlp 3 (qwen2 and mistral are not in 2.8.1): only the models
        # 2.8.1 lacks, tensor parallel 2 (2.8.1 writes the Llama ones)
        for name, kind, fuse, kw in (
                ("qwen2tp2", "qwen2", False, {"num_key_value_heads": 2}),
                ("qwen2tp2fusedtied", "qwen2", True,
                 {"num_key_value_heads": 2, "tie_word_embeddings": True}),
                ("mistraltp2", "mistral", False, {"num_key_value_heads": 1})):
            d = os.path.join(top, name)
            exp = make_hybrid(d, 2, 1, 1, fuse, kind=kind, **kw)
            with open(d + ".expected.json", "w") as f:
                json.dump(exp, f, indent=1, sort_keys=True)
            print("%s: %d tensors, files %s" % (name, len(exp["tensors"]),
                                                  sorted(os.listdir(d))))
        return
    for name, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        d = os.path.join(top, name)
        exp = make(d, dtype)
        with open(d + ".expected.json", "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
        print("%s: %d tensors, files %s" % (name, len(exp["tensors"]),
                                              sorted(os.listdir(d))))
    for name, T, P, Z, fuse, v2 in (("tp2", 2, 1, 1, False, False),
                                    ("tp2pp2sh2", 2, 2, 2, True, False),
                                    ("tp2pp2sh2v2", 2, 2, 2, True, True),
                                    ("tp2pp2sh2sm", 2, 2, 2, True, False),
                                    ("tp2pp2sh2smbf16", 2, 2, 2, True, False)):
        d = os.path.join(top, name)
        sm = "sm" in name
        exp = make_hybrid(d, T, P, Z, fuse, v2, 288 if v2 else 64, sharded_model=sm,
                          dtype="float32" if name.endswith("sm") else "bfloat16")
        with open(d + ".expected.json", "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
        print("%s: %d tensors, files %s" % (name, len(exp["tensors"]),
                                              sorted(os.listdir(d))))
    # Mixtral (2 experts, each cut by tensor parallelism; not expert parallel)
    d = os.path.join(top, "mixtraltp2")
    exp = make_hybrid(d, 2, 1, 1, False, kind="mixtral", num_key_value_heads=2,
                      num_local_experts=2, num_experts_per_tok=1)
    with open(d + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
    print("mixtraltp2: %d tensors, files %s" % (len(exp["tensors"]), sorted(os.listdir(d))))
    # Qwen 1 (c_attn: fused [q, k, v] cut three ways)
    d = os.path.join(top, "qwentp2")
    exp = make_hybrid(d, 2, 1, 1, False, kind="qwen", kv_channels=4, seq_length=32)
    with open(d + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
    print("qwentp2: %d tensors, files %s" % (len(exp["tensors"]), sorted(os.listdir(d))))


if __name__ == "__main__":
    main()
