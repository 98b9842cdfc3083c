"""make_paddlenlp_fixtures - PaddleNLP unified checkpoints written by
PaddleNLP's own code, with what shardfs must show for each.

    PYTHON make_paddlenlp_fixtures.py OUTDIR

PYTHON: a venv with paddlepaddle 3.3.1 (CPU) and paddlenlp 2.8.1 (pins:
../shared notes; tools/interop.sh's paddlenlp venv). Writes
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
from paddlenlp.trainer.plugins import unified_checkpoint as uc
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM


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


def main():
    top = os.path.join(sys.argv[1], "paddlenlp-" + importlib.metadata.version("paddlenlp"))
    os.makedirs(top, exist_ok=True)
    for name, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        d = os.path.join(top, name)
        exp = make(d, dtype)
        with open(d + ".expected.json", "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
        print("%s: %d tensors, files %s" % (name, len(exp["tensors"]),
                                              sorted(os.listdir(d))))


if __name__ == "__main__":
    main()
