"""make_hf_fixtures - Hugging Face style weights written by the real frameworks.

    /work/venvs/torch2/bin/python make_hf_fixtures.py OUTDIR   # transformers 5.x + torch DCP
    /work/venvs/hf4/bin/python make_hf_fixtures.py OUTDIR      # transformers 4.x

Writes OUTDIR/<framework>-X.Y/NAME/ (as the framework wrote it) and
OUTDIR/<framework>-X.Y/NAME.expected.json beside each, in the shape
check_dcp_tree.py reads:

  {"writer": "transformers 5.24.0" or "torch 2.15.0",
   "tensors": {key: {"dtype", "shape", "nbytes", "xxh3"}},
   "objects": {}}

computed from the state dict handed to the framework (xxh3_64 of each
tensor's row-major bytes), never by reading the files back.

transformers 5.x (directory transformers-5.24):
  llama-st      save_pretrained of a tiny random Llama in BF16 with a small
                max_shard_size: model-0000X-of-0000Y.safetensors + index
  llama-single  the same model saved unsharded: one model.safetensors
transformers 4.x (directory transformers-4.46):
  llama-bin     safe_serialization=False, sharded: pytorch_model-0000X-of-
                0000Y.bin + pytorch_model.bin.index.json; F32, tied input
                and output embeddings (one storage under two keys) and
                q_proj/k_proj of layer 0 as views of one fused buffer (a
                storage shared with a storage offset)
  llama-st      the same model (untied), F16, sharded safetensors
  bin-single    a smaller model saved unsharded: one pytorch_model.bin
torch 2.x DCP HuggingFaceStorageWriter (directory torch-2.15):
  dcp-hf-one    one process, fqn_to_index_mapping over 2 files: model-0000X-
                of-00002.safetensors + model.safetensors.index.json
  dcp-hf-dist2  2 gloo processes, DTensors Shard(0)/Shard(1), uneven,
                save_distributed=True: one shard-0000R-model-00001-of-00001
                .safetensors per rank, no index (offsets in __metadata__)
  dcp-hf-cons2  the same with enable_consolidation=True, less the I64
                tensor (torch 2.15's consolidation calls torch.finfo on every
                dtype and fails on integers): the consolidated
                model-00001-of-00001.safetensors + index, and sharded/

Values are seeded: a re-run writes the same tensors.

    /work/venvs/torch2/bin/python make_hf_fixtures.py --check FIXDIR

loads every FIXDIR/*/NAME with the frameworks' own readers (safetensors'
load_file, torch.load(weights_only=True) per the index; DCP's
HuggingFaceStorageReader for the per-rank files) and compares each tensor
with NAME.expected.json: the files and their expected values agree.
"""

import json
import os
import shutil
import sys
import tempfile

import torch
import xxhash

DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
      torch.bool: "BOOL"}


def short_ver(v):
    return ".".join(v.split("+")[0].split(".")[:2])


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(t):
    b = tensor_bytes(t)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


def expect(path, writer, sd):
    doc = {"writer": writer,
           "tensors": {k: describe(v) for k, v in sorted(sd.items())},
           "objects": {}}
    with open(path + ".expected.json", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)


# ------------------------------------------------------------ transformers

def tiny_llama(tie, layers=2, hidden=32, vocab=128):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                      intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # random values everywhere (norms start at 1)
        for p in model.parameters():
            p.copy_(torch.randn(p.shape))
    return model


def snapshot(model):
    """The state dict handed to save_pretrained: copies of its tensors as
    they are now (what torch/safetensors is given to write)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def hf5(out):
    import transformers
    ver = "transformers-%s" % short_ver(transformers.__version__)
    writer = "transformers %s" % transformers.__version__
    model = tiny_llama(tie=False).to(torch.bfloat16)
    sd = snapshot(model)
    for name, shard in (("llama-st", "20KB"), ("llama-single", None)):
        path = os.path.join(out, ver, name)
        fresh(path)
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(path, **kw)
        expect(path, writer, sd)
        print("wrote", path, sorted(os.listdir(path)))


def fuse_qk(model):
    """q_proj and k_proj of layer 0 become views of one buffer, as a fused
    QKV projection would hold them: the second has a storage offset."""
    attn = model.model.layers[0].self_attn
    q, k = attn.q_proj.weight, attn.k_proj.weight
    buf = torch.cat([q.detach().reshape(-1), k.detach().reshape(-1)])
    q.data = buf[:q.numel()].view(q.shape)
    k.data = buf[q.numel():].view(k.shape)


def hf4(out):
    import transformers
    ver = "transformers-%s" % short_ver(transformers.__version__)
    writer = "transformers %s" % transformers.__version__
    # .bin, sharded: tied embeddings and a fused buffer share storages
    model = tiny_llama(tie=True)
    fuse_qk(model)
    sd = snapshot(model)
    path = os.path.join(out, ver, "llama-bin")
    fresh(path)
    model.save_pretrained(path, max_shard_size="30KB", safe_serialization=False)
    expect(path, writer, sd)
    print("wrote", path, sorted(os.listdir(path)))
    # safetensors, sharded, F16
    model = tiny_llama(tie=False).to(torch.float16)
    sd = snapshot(model)
    path = os.path.join(out, ver, "llama-st")
    fresh(path)
    model.save_pretrained(path, max_shard_size="20KB", safe_serialization=True)
    expect(path, writer, sd)
    print("wrote", path, sorted(os.listdir(path)))
    # .bin, unsharded
    model = tiny_llama(tie=False, layers=1, hidden=16, vocab=64)
    sd = snapshot(model)
    path = os.path.join(out, ver, "bin-single")
    fresh(path)
    model.save_pretrained(path, safe_serialization=False)
    expect(path, writer, sd)
    print("wrote", path, sorted(os.listdir(path)))


# ------------------------------------------------------------ torch DCP

def dcp_state():
    g = torch.Generator().manual_seed(99)
    return {
        "emb.weight": torch.randn(37, 8, generator=g),                       # F32
        "layer.w": torch.randn(6, 10, generator=g).to(torch.bfloat16),      # BF16
        "layer.b": torch.randn(10, generator=g).to(torch.float16),          # F16
        "pos": torch.randint(-10**12, 10**12, (5, 3), generator=g),          # I64
        "proj.weight": torch.randn(9, 7, generator=g).to(torch.float16),    # F16
    }


def dcp_one(path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    sd = dcp_state()
    fqn = {k: (1 if i % 2 == 0 else 2) for i, k in enumerate(sorted(sd))}
    dcp.save({k: v.clone() for k, v in sd.items()}, no_dist=True,
             storage_writer=HuggingFaceStorageWriter(path, fqn_to_index_mapping=fqn))
    return sd


def dcp_worker(rank, world, initfile, path, consolidate):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group("gloo", init_method="file://" + initfile,
                            rank=rank, world_size=world)
    try:
        full = dcp_state()
        mesh = init_device_mesh("cpu", (world,))
        sd = {"emb.weight": distribute_tensor(full["emb.weight"], mesh, [Shard(0)]),
              "layer.w": distribute_tensor(full["layer.w"], mesh, [Shard(1)]),
              "layer.b": distribute_tensor(full["layer.b"], mesh, [Shard(0)]),
              "pos": full["pos"].clone(),               # replicated: one rank writes it
              "proj.weight": distribute_tensor(full["proj.weight"], mesh, [Shard(0)])}
        if consolidate:
            del sd["pos"]  # torch 2.15's consolidation fails on integer dtypes
        w = HuggingFaceStorageWriter(path, save_distributed=True,
                                     enable_consolidation=consolidate)
        dcp.save(sd, storage_writer=w)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def dcp_multi(path, consolidate):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(dcp_worker, args=(2, os.path.join(tmp, "init"), path, consolidate),
                 nprocs=2, join=True)
    sd = dcp_state()
    if consolidate:
        del sd["pos"]
    return sd


def dcp(out):
    ver = "torch-%s" % short_ver(torch.__version__)
    writer = "torch %s" % torch.__version__
    for name, fn in (("dcp-hf-one", dcp_one),
                     ("dcp-hf-dist2", lambda p: dcp_multi(p, False)),
                     ("dcp-hf-cons2", lambda p: dcp_multi(p, True))):
        path = os.path.join(out, ver, name)
        fresh(path)
        sd = fn(path)
        expect(path, writer, sd)
        print("wrote", path, sorted(os.listdir(path)))


# ------------------------------------------------------------ --check

def framework_load(path):
    """The state dict the frameworks' own readers give for path."""
    names = sorted(os.listdir(path))
    if any(n.startswith("shard-") for n in names) and not any(
            n.endswith(".index.json") for n in names):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        reader = HuggingFaceStorageReader(path)
        md = reader.read_metadata()
        sd = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
              for k, m in md.state_dict_metadata.items()}
        dcp.load(sd, storage_reader=HuggingFaceStorageReader(path), no_dist=True)
        return sd
    from safetensors.torch import load_file
    index = [n for n in names if n.endswith(".index.json")]
    if index:
        with open(os.path.join(path, index[0])) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = [n for n in ("model.safetensors", "pytorch_model.bin") if n in names][:1]
    sd = {}
    for fn in files:
        p = os.path.join(path, fn)
        sd.update(load_file(p) if fn.endswith(".safetensors")
                  else torch.load(p, map_location="cpu", weights_only=True))
    return sd


def check(fixdir):
    bad = 0
    for vdir in sorted(os.listdir(fixdir)):
        for fn in sorted(os.listdir(os.path.join(fixdir, vdir))):
            if not fn.endswith(".expected.json"):
                continue
            path = os.path.join(fixdir, vdir, fn[:-len(".expected.json")])
            with open(path + ".expected.json") as f:
                exp = json.load(f)["tensors"]
            got = {k: describe(v) for k, v in framework_load(path).items()}
            diff = sorted(k for k in set(exp) | set(got) if exp.get(k) != got.get(k))
            bad += bool(diff)
            print("%s: %d tensors, %s" % (path, len(exp),
                                          "agree" if not diff else "DIFFER: %s" % diff[:5]))
    return 1 if bad else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        return check(sys.argv[2])
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = os.path.abspath(sys.argv[1])
    import transformers
    if int(transformers.__version__.split(".")[0]) >= 5:
        hf5(out)
        dcp(out)
    else:
        hf4(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
