"""make_hf_hub_fixtures - a Hugging Face hub cache written by huggingface_hub.

    PYTHON make_hf_hub_fixtures.py OUTDIR          # write
    PYTHON make_hf_hub_fixtures.py --check FIXDIR  # read back

PYTHON: a venv with huggingface_hub, safetensors, torch, xxhash.

The hub itself is not reached: huggingface_hub's own download path
(hf_hub_download -> _hf_hub_download_to_cache_dir) runs unchanged against
a local file source. Only the two calls that would go to the network are
replaced: the HEAD call (_get_metadata_or_catch_error: the etag, the
commit, the size, as the hub answers them: sha256 for LFS files, the git
blob sha1 for the others) and the GET (http_get: the bytes). So blobs/,
refs/, snapshots/REV/ and their relative symlinks into ../../blobs/ are
exactly what huggingface_hub writes for a user.

Writes OUTDIR/huggingface_hub-X.Y/hub/ (a cache root) holding

  models--shardfs-test--tiny-llama
      two snapshots: REV_A (model.safetensors, one file, config.json) and
      REV_B (refs/main: model-0000X-of-00002.safetensors + index,
      config.json: the same blob as REV_A's, one file in blobs/)
  models--tiny-bin
      no organization (like "gpt2"); refs/main: pytorch_model.bin
      (torch.save) + config.json

and OUTDIR/huggingface_hub-X.Y/expected.json:

  {"writer": "huggingface_hub 2.4.0 ...",
   "models": {"ORG/NAME": {"main": REV, "snapshots": {REV: {
       "tensors": {key: {"dtype", "shape", "nbytes", "xxh3"}},
       "files": {name: {"size", "xxh3"}}}}}}}

computed from the state dicts handed to the writers, never by reading the
files back. --check reads the cache with huggingface_hub's own
scan_cache_dir and try_to_load_from_cache, and each snapshot's weights
with safetensors' load_file / torch.load(weights_only=True), against
expected.json.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch
import xxhash

DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64"}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(t):
    b = tensor_bytes(t)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


def state_dict(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(8, 4, generator=g),
        "model.layers.0.mlp.up_proj.weight":
            torch.randn(6, 4, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight":
            torch.randn(4, 6, generator=g).to(torch.float16),
        "model.norm.weight": torch.ones(4),
        "lm_head.weight": torch.randn(8, 4, generator=g),
    }


def commit_hash(label):
    return hashlib.sha1(("shardfs hub fixture " + label).encode()).hexdigest()


class LocalHub:
    """Answers huggingface_hub's HEAD and GET from files in a directory:
    files[(repo_id, revision or commit)][filename] = local path."""

    def __init__(self):
        self.files = {}
        self.refs = {}  # (repo_id, revision) -> commit

    def add(self, repo_id, commit, name, path, branch=None):
        self.files.setdefault((repo_id, commit), {})[name] = path
        if branch:
            self.refs[(repo_id, branch)] = commit

    def head(self, *, repo_id, filename, revision, **_):
        commit = self.refs.get((repo_id, revision), revision)
        path = self.files[(repo_id, commit)][filename]
        with open(path, "rb") as f:
            data = f.read()
        lfs = filename.endswith((".safetensors", ".bin"))
        etag = (hashlib.sha256(data).hexdigest() if lfs else
                hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        return ("local://%s/%s/%s" % (repo_id, commit, filename), etag, commit,
                len(data), None, None)

    def get(self, url, temp_file, **_):
        repo_rev, filename = url[len("local://"):].rsplit("/", 1)
        repo_id, commit = repo_rev.rsplit("/", 1)
        with open(self.files[(repo_id, commit)][filename], "rb") as f:
            temp_file.write(f.read())


def write(out):
    import huggingface_hub
    import safetensors
    from huggingface_hub import file_download, hf_hub_download
    from safetensors.torch import save_file

    ver = ".".join(huggingface_hub.__version__.split(".")[:2])
    top = os.path.join(out, "huggingface_hub-" + ver)
    cache = os.path.join(top, "hub")
    if os.path.exists(top):
        shutil.rmtree(top)
    os.makedirs(cache)
    hub = LocalHub()
    file_download._get_metadata_or_catch_error = hub.head
    file_download.http_get = hub.get
    expected = {"writer": "huggingface_hub %s (hf_hub_download into a cache), "
                          "safetensors %s, torch %s" %
                          (huggingface_hub.__version__, safetensors.__version__,
                           torch.__version__.split("+")[0]),
                "models": {}}
    src = tempfile.mkdtemp()
    config = json.dumps({"model_type": "llama", "hidden_size": 4,
                         "vocab_size": 8}, indent=2).encode()

    def put(name, data):
        p = os.path.join(src, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def files_of(names):
        d = {}
        for n, p in names:
            with open(p, "rb") as f:
                b = f.read()
            d[n] = {"size": len(b), "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}
        return d

    # tiny-llama, REV_A: one model.safetensors
    repo = "shardfs-test/tiny-llama"
    rev_a, rev_b = commit_hash("tiny-llama a"), commit_hash("tiny-llama b")
    sd_a = state_dict(1)
    d = os.path.join(src, "a")
    os.makedirs(d)
    save_file(sd_a, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(config)
    for n in ("model.safetensors", "config.json"):
        hub.add(repo, rev_a, n, os.path.join(d, n))
    # REV_B (main): two shards and the index, as save_pretrained names them
    sd_b = state_dict(2)
    d = os.path.join(src, "b")
    os.makedirs(d)
    keys = sorted(sd_b)
    parts = [keys[:3], keys[3:]]
    weight_map, total = {}, 0
    for i, part in enumerate(parts):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
        save_file({k: sd_b[k] for k in part}, os.path.join(d, fn),
                  metadata={"format": "pt"})
        for k in part:
            weight_map[k] = fn
            total += sd_b[k].numel() * sd_b[k].element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                  f, indent=2, sort_keys=True)
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(config)
    names_b = [n for n in sorted(os.listdir(d))]
    for n in names_b:
        hub.add(repo, rev_b, n, os.path.join(d, n), branch="main")
    for n in ("model.safetensors", "config.json"):
        hf_hub_download(repo, n, revision=rev_a, cache_dir=cache)
    for n in names_b:
        hf_hub_download(repo, n, revision="main", cache_dir=cache)
    expected["models"][repo] = {"main": rev_b, "snapshots": {
        rev_a: {"tensors": {k: describe(v) for k, v in sd_a.items()},
                "files": files_of([("config.json", os.path.join(src, "a", "config.json"))])},
        rev_b: {"tensors": {k: describe(v) for k, v in sd_b.items()},
                "files": files_of([("config.json", os.path.join(d, "config.json"))])}}}

    # tiny-bin: no organization, pytorch_model.bin
    repo = "tiny-bin"
    rev = commit_hash("tiny-bin")
    sd = state_dict(3)
    d = os.path.join(src, "bin")
    os.makedirs(d)
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(config)
    for n in ("pytorch_model.bin", "config.json"):
        hub.add(repo, rev, n, os.path.join(d, n), branch="main")
        hf_hub_download(repo, n, revision="main", cache_dir=cache)
    expected["models"][repo] = {"main": rev, "snapshots": {
        rev: {"tensors": {k: describe(v) for k, v in sd.items()},
              "files": files_of([("config.json", os.path.join(d, "config.json"))])}}}

    shutil.rmtree(src)
    # huggingface_hub's own bookkeeping, not the cache's content
    shutil.rmtree(os.path.join(cache, ".locks"), ignore_errors=True)
    with open(os.path.join(top, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", top)
    return top


def check(top):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache
    from safetensors.torch import load_file

    cache = os.path.join(top, "hub")
    with open(os.path.join(top, "expected.json")) as f:
        exp = json.load(f)
    info = scan_cache_dir(cache)
    if info.warnings:
        raise SystemExit("scan_cache_dir: %s" % info.warnings)
    seen = {r.repo_id: r for r in info.repos}
    assert sorted(seen) == sorted(exp["models"]), (sorted(seen), exp["models"])
    bad = 0
    for repo, m in exp["models"].items():
        revs = {r.commit_hash: r for r in seen[repo].revisions}
        assert sorted(revs) == sorted(m["snapshots"]), repo
        assert "main" in revs[m["main"]].refs, (repo, revs[m["main"]].refs)
        for rev, s in m["snapshots"].items():
            names = {f.file_name for f in revs[rev].files}
            got = {}
            if "model.safetensors.index.json" in names:
                idx = try_to_load_from_cache(repo, "model.safetensors.index.json",
                                             cache_dir=cache, revision=rev)
                with open(idx) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
                for sh in shards:
                    got.update(load_file(try_to_load_from_cache(
                        repo, sh, cache_dir=cache, revision=rev)))
            elif "model.safetensors" in names:
                got = load_file(try_to_load_from_cache(
                    repo, "model.safetensors", cache_dir=cache, revision=rev))
            else:
                got = torch.load(try_to_load_from_cache(
                    repo, "pytorch_model.bin", cache_dir=cache, revision=rev),
                    weights_only=True)
            for k, e in s["tensors"].items():
                if k not in got or describe(got[k]) != e:
                    print("MISMATCH %s@%s %s" % (repo, rev, k))
                    bad += 1
            if sorted(got) != sorted(s["tensors"]):
                print("KEYS %s@%s" % (repo, rev))
                bad += 1
    if bad:
        raise SystemExit("%d mismatches" % bad)
    print("checked", top, ":", ", ".join(sorted(exp["models"])))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    elif len(sys.argv) == 2:
        check(write(sys.argv[1]))
    else:
        raise SystemExit(__doc__)
