"""make_megatron_hostile - hostile .metadata variants of a real Megatron-Core
torch_dist checkpoint, for test/mount/test_megatron.py.

    /work/venvs/torch2/bin/python make_megatron_hostile.py CKPT OUTDIR

CKPT is the committed megatron-core 0.15.3 `distopt` fixture (flattened
ranges: .metadata is megatron's MCoreMetadata with mcore_data). Each
variant is CKPT's .metadata unpickled with torch and megatron-core's own
classes (0.16.1 keeps MCoreMetadata as a stub class so old files load),
changed in one way, and pickled back (protocol 4, as torch writes it):
what a broken or hostile writer could leave that torch still reads.
Writes OUTDIR/NAME.metadata for each and OUTDIR/variants.json:
{NAME: {"what": text, "left_out": [tensor keys] or null (the whole
checkpoint is left out)}}.

  shape-indivisible  exp_avg of the embedding says its real shape is
                     (32, 17): 17 is not 1 block of 16
  shape-not-a-shape  exp_avg_sq of the embedding: the shape is a string
  shape-axes         exp_avg of the qkv weight: 2 axes for a tensor stored
                     with 3 + 1
  shape-elements     exp_avg of output_layer.bias: (64,): blocks of 32 are
                     not stored as 16
  plain-reshaped     the model's own embedding weight (not flattened) gets
                     a real shape: it is not stored reformulated
  mcore-not-dict     mcore_data is a list: the checkpoint is refused
  entry-not-dict     one mcore_data entry is an int: the checkpoint is
                     refused
  evil-global        an mcore_data entry holds os.system: the pickle reader
                     refuses the global, the checkpoint is left out
"""

import json
import os
import pickle
import sys

import torch  # noqa: F401  (the classes .metadata names)
import megatron.core.dist_checkpointing.strategies.torch  # noqa: F401


EXP = "optimizer.state.exp_avg."
EXP_SQ = "optimizer.state.exp_avg_sq."
EMB = "embedding.word_embeddings.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
BIAS = "output_layer.bias"


def main():
    ckpt, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    src = os.path.join(ckpt, ".metadata")

    def load():
        with open(src, "rb") as f:
            return pickle.load(f)  # a committed fixture megatron wrote

    def orig(key, shape):
        def change(md):
            md.mcore_data[key] = {"nd_reformulated_orig_global_shape": shape}
        return change

    def entry_int(md):
        md.mcore_data[EXP + EMB] = 5

    variants = {
        "shape-indivisible": ("exp_avg of the embedding: real shape (32, 17)",
                              orig(EXP + EMB, (32, 17)), [EXP + EMB]),
        "shape-not-a-shape": ("exp_avg_sq of the embedding: the shape is a string",
                              orig(EXP_SQ + EMB, "32x16"), [EXP_SQ + EMB]),
        "shape-axes": ("exp_avg of the qkv weight: 2 axes for 3 + 1 stored",
                       orig(EXP + QKV, (3, 768)), [EXP + QKV]),
        "shape-elements": ("exp_avg of output_layer.bias: (64,)",
                           orig(EXP + BIAS, (64,)), [EXP + BIAS]),
        "plain-reshaped": ("the model's embedding weight gets a real shape",
                           orig(EMB, (32, 16)), [EMB]),
        "mcore-not-dict": ("mcore_data is a list",
                           lambda md: setattr(md, "mcore_data", [1, 2]), None),
        "entry-not-dict": ("an mcore_data entry is an int", entry_int, None),
        "evil-global": ("an mcore_data entry holds os.system",
                        orig(EXP + EMB, os.system), None),
    }
    info = {}
    for name, (what, change, left_out) in sorted(variants.items()):
        md = load()
        change(md)
        with open(os.path.join(out, name + ".metadata"), "wb") as f:
            pickle.dump(md, f, protocol=4)
        info[name] = {"what": what, "left_out": left_out}
    with open(os.path.join(out, "variants.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", len(info), "variants to", out)


if __name__ == "__main__":
    main()
