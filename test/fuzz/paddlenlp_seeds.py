"""paddlenlp_seeds - seeds for fuzz_paddlenlp from the unified checkpoints
paddlenlp wrote.

    python3 test/fuzz/paddlenlp_seeds.py test/fuzz/corpus/paddlenlp

(the hybrid-parallel fixtures' seeds go to test/fuzz/corpus/paddlenlp_hp,
in fuzz_paddlenlp_hp.c's form: a layout byte, then the parts)

For each committed fixture (test/fixtures/paddlenlp/paddlenlp-*/NAME): the
parts fuzz_paddlenlp.c names, in its order, each as a 4-byte
little-endian length and the file's bytes (an empty part where the
fixture has no such file); of the sharding V2 one also the mount test's
two variants whose slices lie (a gap, a slice past its range: keys renamed
in place in tensor rank 0, stage 0, sharding rank 1's file). Stdlib only.
"""
import glob
import os
import struct
import sys

PARTS = ["model.safetensors.index.json", "optimizer.safetensors.index.json",
         "master_weights.safetensors.index.json", "config.json",
         "model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors",
         "master_weights-00001-of-00001.safetensors"]
# fuzz_paddlenlp_hp.c's layouts (tp2; tp2 pp2 sharding2; the same with
# save_sharded_model's model files)
HP = [["config.json", "model_state.tp00.pdparams", "model_state.tp01.pdparams",
       "optimizer.tp00.pdopt", "optimizer.tp01.pdopt"],
      ["config.json", "model_meta.json"] +
      ["model_state.tp%02d_pp%02d.pdparams" % (t, p) for t in (0, 1) for p in (0, 1)] +
      ["optimizer.tp%02d_pp%02d_shard%02d.pdopt" % (t, p, z)
       for t in (0, 1) for p in (0, 1) for z in (0, 1)],
      ["config.json", "model_meta.json"] +
      ["model_state.tp%02d_pp%02d_shard%02d.pdparams" % (t, p, z)
       for t in (0, 1) for p in (0, 1) for z in (0, 1)] +
      ["optimizer.tp%02d_pp%02d_shard%02d.pdopt" % (t, p, z)
       for t in (0, 1) for p in (0, 1) for z in (0, 1)]]
TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for d in sorted(glob.glob(os.path.join(TOP, "test", "fixtures", "paddlenlp",
                                       "paddlenlp-*", "*", ""))):
    d = d.rstrip("/")
    name = "%s-%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d))
    if not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        lay = 1 if os.path.exists(os.path.join(d, "model_meta.json")) else 0
        if os.path.exists(os.path.join(d, "model_state.tp00_pp00_shard00.pdparams")):
            lay = 2
        variants = [(name, None, None)]
        if name.endswith("-tp2pp2sh2v2"):  # test_paddlenlp.py's make_hostile_v2
            variants += [(name + "-gap", "linear_60.w_0_fp32_master_0_moment1_0",
                          "linear_60.w_0_fp32_master_0_moment1_9"),
                         (name + "-beyond", "linear_61.w_0_fp32_master_0_moment2_0",
                          "linear_59.w_0_fp32_master_0_moment2_0")]
        for vname, old, new in variants:
            blob = bytes([lay])
            for p in HP[lay]:
                with open(os.path.join(d, p), "rb") as f:
                    b = f.read()
                if old and p == "optimizer.tp00_pp00_shard01.pdopt":
                    b = b.replace(old.encode(), new.encode())
                blob += struct.pack("<I", len(b)) + b
            os.makedirs(out + "_hp", exist_ok=True)
            with open(os.path.join(out + "_hp", vname), "wb") as f:
                f.write(blob)
            print("seed", out + "_hp/" + vname, len(blob), "bytes")
        continue
    blob = b""
    for p in PARTS:
        b = b""
        if os.path.exists(os.path.join(d, p)):
            with open(os.path.join(d, p), "rb") as f:
                b = f.read()
        blob += struct.pack("<I", len(b)) + b
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    print("seed", name, len(blob), "bytes")
