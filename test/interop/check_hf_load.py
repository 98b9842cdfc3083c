"""check_hf_load - a mounted checkpoint loaded by the frameworks themselves.

    PYTHON check_hf_load.py MOUNTED_CKPT EXPECTED_JSON [--from-pretrained]

PYTHON has torch, safetensors and (for --from-pretrained) transformers:
/work/venvs/torch2/bin/python. Loads MOUNTED_CKPT/model.safetensors with
safetensors' load_file and, with --from-pretrained, the directory with
transformers' AutoModelForCausalLM.from_pretrained (config.json from the
mount's root files, weights from its model.safetensors), and compares every
tensor with EXPECTED_JSON (make_hf_fixtures.py's). One line per mismatch;
exit 1 on any.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_hf_fixtures import describe  # noqa: E402


def compare(label, exp, sd):
    bad = [k for k in sorted(set(exp) | set(sd))
           if k not in sd or exp.get(k) != describe(sd[k])]
    for k in bad:
        print("MISMATCH %s: %s" % (label, k))
    print("%s: %d tensors, %d mismatches" % (label, len(exp), len(bad)))
    return len(bad)


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__)
        return 2
    root, exp_path = args
    with open(exp_path) as f:
        exp = json.load(f)["tensors"]
    from safetensors.torch import load_file
    bad = compare("load_file(model.safetensors)", exp,
                  load_file(os.path.join(root, "model.safetensors")))
    if "--from-pretrained" in argv:
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(root, torch_dtype="auto")
        sd = m.state_dict()
        bad += compare("from_pretrained", exp, {k: sd[k] for k in exp if k in sd})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
