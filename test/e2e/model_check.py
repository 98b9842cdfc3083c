#!/usr/bin/python3
"""model_check.py - a real torch model through a shardfs mount, end to end.

1. Build a small transformer-like model (embedding, attention projections,
   MLP, RMSNorm and LayerNorm, lm_head) with BF16 and F32 parameters from a
   fixed seed, and its outputs on fixed inputs.
2. Shard its state dict over 4 ranks the way training frameworks do:
   column-parallel weights as dim-0 boxes, row-parallel weights as dim-1
   boxes, embedding and lm_head as FSDP-style flat byte ranges of uneven
   size, norms replicated on every rank. Write the checkpoint with a writer:
     --via native  the on-disk format of SPEC section 5 directly: payload
                   files in rank-NNNNN/, manifest.json (xxh3 block sums,
                   seed 0) written last by temp + fsync + rename;
     --via mount   SPEC section 4 through the daemon's write path with
                   tools/shardfs_save.py (mkdir, declare with xattrs, write
                   NAME@slice / pwrite, commit xattr), into an empty store.
3. Mount the store with tools/shardfs (waits are bounded; teardown always
   unmounts and kills the daemon), and in a FRESH process per mode load
   every weight from MNT/CKPT/model.safetensors - once with whole-file
   reads, once through mmap - into a freshly initialized model (different
   seed, checked to differ first), run it on the same inputs and hand back
   its outputs. The check: torch.equal with the original outputs, and every
   loaded tensor bitwise equal to the original parameter.

Exit 0 on success, 1 on a failure, 77 (skipped, with the reason) when torch,
/dev/fuse or fusermount3 is missing.
"""
import argparse
import json
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

WORLD = 4
CKPT = "step-100"
BLOCK_SIZE = 65536          # manifest block_size: several xxh3 sums per shard
MOUNT_TIMEOUT_S = 30.0
CHILD_TIMEOUT_S = 120.0
ST_DTYPES = {"BF16": "bfloat16", "F32": "float32"}
# the writer example the --via mount writer uses
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(77)


try:
    import torch
    import torch.nn.functional as F
except Exception as exc:  # the ctest must skip, not fail, without torch
    skip("torch is not importable (%s)" % exc)

# ---------------------------------------------------------------- the model

VOCAB, DIM, HEADS, FFN, LAYERS = 256, 64, 4, 128, 2


def linear(x, w):
    """x @ w.T in w's dtype, result as F32 (BF16 weights run in BF16)."""
    return F.linear(x.to(w.dtype), w).float()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        bf = torch.bfloat16
        self.attn_norm = torch.nn.Parameter(1 + 0.1 * torch.randn(DIM))  # RMSNorm, F32
        self.wq = torch.nn.Parameter(0.1 * torch.randn(DIM, DIM).to(bf))
        self.wk = torch.nn.Parameter(0.1 * torch.randn(DIM, DIM).to(bf))
        self.wv = torch.nn.Parameter(0.1 * torch.randn(DIM, DIM).to(bf))
        self.wo = torch.nn.Parameter(0.1 * torch.randn(DIM, DIM).to(bf))
        self.mlp_norm = torch.nn.LayerNorm(DIM)                          # F32 weight + bias
        with torch.no_grad():
            self.mlp_norm.weight.add_(0.1 * torch.randn(DIM))
            self.mlp_norm.bias.add_(0.1 * torch.randn(DIM))
        self.w1 = torch.nn.Parameter(0.1 * torch.randn(FFN, DIM))       # F32
        self.w2 = torch.nn.Parameter(0.1 * torch.randn(DIM, FFN).to(bf))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.attn_norm
        b, t, _ = h.shape
        q = linear(h, self.wq).view(b, t, HEADS, -1).transpose(1, 2)
        k = linear(h, self.wk).view(b, t, HEADS, -1).transpose(1, 2)
        v = linear(h, self.wv).view(b, t, HEADS, -1).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, DIM)
        x = x + linear(y, self.wo)
        return x + linear(F.gelu(linear(self.mlp_norm(x), self.w1)), self.w2)


class Model(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, DIM).to(torch.bfloat16))
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(DIM))
        self.lm_head = torch.nn.Parameter(0.1 * torch.randn(VOCAB, DIM))

    def forward(self, tokens):
        x = self.embed[tokens].float()
        for layer in self.layers:
            x = layer(x)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        return linear(x, self.lm_head)


def fixed_inputs():
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB, (3, 17), generator=g)


def run_model(model, tokens):
    torch.set_num_threads(1)  # same kernels, same order, in both processes
    with torch.no_grad():
        return model(tokens)


def st_name(dtype):
    return {torch.bfloat16: "BF16", torch.float32: "F32"}[dtype]


def tensor_bytes(t):
    """Row-major little-endian bytes of t (BF16 through an int16 view)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()

# ---------------------------------------------------------------- sharding


def role(name):
    """How a parameter is sharded, tensor-parallel style."""
    leaf = name.rsplit(".", 1)[-1]
    if name in ("embed", "lm_head"):
        return "flat"                       # FSDP-style byte ranges
    if leaf in ("wq", "wk", "wv", "w1"):
        return "col"                        # dim-0 boxes
    if leaf in ("wo", "w2"):
        return "row"                        # dim-1 boxes
    return "replicated"                     # norms: every rank the whole tensor


def shard_plan(name, t):
    """[(rank, kind, where, bytes)] covering t; kind "box" (offsets,
    lengths in elements) or "flat" (byte_offset)."""
    r = role(name)
    plan = []
    if r in ("col", "row"):
        dim = 0 if r == "col" else 1
        n = t.shape[dim] // WORLD
        for rank in range(WORLD):
            sl = t.narrow(dim, rank * n, n)
            offs = [0, 0]
            offs[dim] = rank * n
            plan.append((rank, "box", (offs, list(sl.shape)), tensor_bytes(sl)))
    elif r == "flat":
        data = tensor_bytes(t)
        # uneven cuts that do not fall on row boundaries (as FSDP pads/flattens)
        cuts = [0, len(data) * 3 // 10 + 6, len(data) // 2 + 2,
                len(data) * 9 // 10 - 4, len(data)]
        for rank in range(WORLD):
            plan.append((rank, "flat", cuts[rank], data[cuts[rank]:cuts[rank + 1]]))
    else:
        for rank in range(WORLD):
            plan.append((rank, "box", ([0] * t.dim(), list(t.shape)), tensor_bytes(t)))
    return plan


def xxh3_blocks(data, block_size):
    import xxhash
    return [xxhash.xxh3_64_hexdigest(data[i:i + block_size], seed=0)
            for i in range(0, len(data), block_size)]

# ---------------------------------------------------------------- writers


class NativeWriter:
    """Writes SPEC section 5 directly: rank-NNNNN/data-0.bin per rank,
    manifest.json last (temp, fsync, rename, fsync of the directory)."""

    def __init__(self, store, ckpt):
        self.dir = os.path.join(store, ckpt)
        self.ckpt = ckpt
        os.makedirs(self.dir)
        self.files = {}
        self.entries = {"tensors": {}, "files": {}}

    def _payload(self, rank):
        if rank not in self.files:
            rel = "rank-%05d/data-0.bin" % rank
            os.makedirs(os.path.join(self.dir, os.path.dirname(rel)), exist_ok=True)
            self.files[rank] = (rel, open(os.path.join(self.dir, rel), "wb"))
        return self.files[rank]

    def declare(self, name, dtype, shape, is_file=False):
        kind = "files" if is_file else "tensors"
        self.entries[kind][name] = {"dtype": dtype, "shape": list(shape), "shards": []}

    def _shard(self, rank, name, where, data, is_file=False):
        rel, f = self._payload(rank)
        shard = {"rank": rank}
        shard.update(where)
        shard.update({"file": rel, "file_offset": f.tell(), "nbytes": len(data),
                      "xxh3": xxh3_blocks(data, BLOCK_SIZE)})
        f.write(data)
        self.entries["files" if is_file else "tensors"][name]["shards"].append(shard)

    def write_box(self, rank, name, offsets, lengths, data):
        self._shard(rank, name, {"offsets": offsets, "lengths": lengths}, data)

    def write_flat(self, rank, name, byte_off, data):
        self._shard(rank, name, {"flat": [byte_off, len(data)]}, data)

    def write_file(self, name, data):
        self.declare(name, "U8", [len(data)], is_file=True)
        self._shard(0, name, {"offsets": [0], "lengths": [len(data)]}, data, is_file=True)

    def commit(self):
        for _, f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        manifest = {"format": "shardfs/1", "name": self.ckpt, "world_size": WORLD,
                    "block_size": BLOCK_SIZE}
        manifest.update(self.entries)
        tmp = os.path.join(self.dir, ".manifest.json.tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(self.dir, "manifest.json"))
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class MountWriter:
    """Writes through the daemon's write path (SPEC section 4) with the
    user-facing example, tools/shardfs_save.py. One daemon here plays every
    rank, so the replicated norms arrive 4 times (identical overlaps)."""

    def __init__(self, mnt, ckpt):
        import shardfs_save
        self.sfs = shardfs_save
        self.mnt, self.ckpt = mnt, ckpt
        self.decl = {}
        os.makedirs(os.path.join(mnt, ckpt, "tensors"), exist_ok=True)

    def declare(self, name, dtype, shape, is_file=False):
        self.decl[name] = (dtype, list(shape))
        self.sfs.declare(self.mnt, self.ckpt, name, dtype, shape)

    def write_box(self, rank, name, offsets, lengths, data):
        import numpy as np
        dtype, shape = self.decl[name]
        piece = np.frombuffer(data, dtype="<u%d" % self.sfs.ITEMSIZE[dtype]).reshape(lengths)
        self.sfs.write_shard(self.mnt, self.ckpt, self.sfs.Shard(
            name, piece, shape=shape, offsets=offsets, dtype=dtype))

    def write_flat(self, rank, name, byte_off, data):
        dtype, shape = self.decl[name]
        self.sfs.write_shard(self.mnt, self.ckpt, self.sfs.Shard(
            name, data, shape=shape, flat=byte_off, dtype=dtype))

    def write_file(self, name, data):
        self.sfs.write_file(self.mnt, self.ckpt, name, data)

    def commit(self):
        self.sfs.commit(self.mnt, self.ckpt)    # CommitError carries the reason


def write_checkpoint(writer, state):
    for name, t in state.items():
        writer.declare(name, st_name(t.dtype), t.shape)
    for name, t in state.items():
        for rank, kind, where, data in shard_plan(name, t):
            if kind == "box":
                writer.write_box(rank, name, where[0], where[1], data)
            else:
                writer.write_flat(rank, name, where, data)
    writer.write_file("config.json", json.dumps(
        {"vocab": VOCAB, "dim": DIM, "heads": HEADS, "ffn": FFN, "layers": LAYERS}).encode())
    writer.commit()

# ---------------------------------------------------------------- the mount


class Mount:
    """tools/shardfs -f STORE MNT, bounded waits, always torn down."""

    def __init__(self, shardfs, store, mnt, log):
        self.shardfs, self.store, self.mnt, self.log = shardfs, store, mnt, log
        self.proc = None

    def __enter__(self):
        self.logf = open(self.log, "wb")
        self.proc = subprocess.Popen([self.shardfs, "-f", self.store, self.mnt],
                                     stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError("shardfs exited %d before mounting:\n%s"
                                   % (self.proc.returncode, self.log_text()))
            if time.monotonic() > deadline:
                raise RuntimeError("no mount after %.0f s:\n%s"
                                   % (MOUNT_TIMEOUT_S, self.log_text()))
            time.sleep(0.05)
        return self

    def log_text(self):
        self.logf.flush()
        with open(self.log, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def __exit__(self, *exc):
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], timeout=10,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], timeout=10)
        self.logf.close()
        return False

# ---------------------------------------------------------------- the loader child


def load_safetensors(path, mode):
    """{name: tensor} from a safetensors file, parsed by hand: whole-file
    read() or mmap. The tensors own copies (the mapping is closed)."""
    with open(path, "rb") as f:
        if mode == "read":
            buf = bytearray(f.read())
        else:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        (n,) = struct.unpack_from("<Q", buf, 0)
        if n > 100 << 20 or 8 + n > len(buf):
            raise ValueError("bad header length %d" % n)
        header = json.loads(bytes(buf[8:8 + n]))
        header.pop("__metadata__", None)
        out = {}
        for name, e in header.items():
            dt = getattr(torch, ST_DTYPES[e["dtype"]])
            b, end = e["data_offsets"]
            count = (end - b) // torch.empty(0, dtype=dt).element_size()
            t = torch.frombuffer(buf, dtype=dt, count=count, offset=8 + n + b)
            out[name] = t.reshape(e["shape"]).clone()
        return out
    finally:
        if mode == "mmap":
            buf.close()


def child(args):
    model = Model(seed=999)                 # fresh weights, not the original
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loaded = load_safetensors(args.load, args.mode)
    names = sorted(model.state_dict())
    if sorted(loaded) != names:
        raise SystemExit("tensor names differ: %s vs %s" % (sorted(loaded), names))
    changed = sum(not torch.equal(before[k], loaded[k]) for k in names)
    model.load_state_dict(loaded, strict=True)
    for k, v in model.state_dict().items():
        assert v.dtype == loaded[k].dtype, k
    out = run_model(model, torch.load(args.inputs))
    torch.save({"outputs": out, "state": loaded, "changed": changed}, args.out)

# ---------------------------------------------------------------- the check


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="directory with the shardfs binary")
    ap.add_argument("--via", choices=["native", "mount"], default="native")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--load", help=argparse.SUPPRESS)   # child mode
    ap.add_argument("--mode", choices=["read", "mmap"], help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        child(args)
        return 0

    shardfs = os.path.join(args.bin or "", "shardfs")
    if not os.path.exists("/dev/fuse"):
        skip("/dev/fuse is missing")
    if not shutil.which("fusermount3"):
        skip("fusermount3 is missing")
    if not os.access(shardfs, os.X_OK):
        print("FAIL: no shardfs binary at %s (pass --bin BUILD/tools)" % shardfs)
        return 1

    model = Model(seed=0)
    tokens = fixed_inputs()
    ref = run_model(model, tokens)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    dtypes = sorted({st_name(v.dtype) for v in state.values()})
    roles = sorted({role(k) for k in state})
    print("model: %d tensors, dtypes %s, shardings %s, world %d"
          % (len(state), dtypes, roles, WORLD))

    work = tempfile.mkdtemp(prefix="sf_e2e.")
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    os.makedirs(store)
    os.makedirs(mnt)
    torch.save(tokens, os.path.join(work, "inputs.pt"))
    failures = []
    try:
        if args.via == "native":
            write_checkpoint(NativeWriter(store, CKPT), state)
        with Mount(shardfs, store, mnt, os.path.join(work, "shardfs.log")) as m:
            if args.via == "mount":
                try:
                    write_checkpoint(MountWriter(mnt, CKPT), state)
                except OSError as e:
                    print("daemon log tail:\n" + m.log_text())
                    raise SystemExit("FAIL: writing through the mount: %s" % e)
            st_path = os.path.join(mnt, CKPT, "model.safetensors")
            for name, t in state.items():   # the xattrs say what was declared
                p = os.path.join(mnt, CKPT, "tensors", name)
                dt = os.getxattr(p, "user.shardfs.dtype").decode()
                shape = json.loads(os.getxattr(p, "user.shardfs.shape"))
                if dt != st_name(t.dtype) or shape != list(t.shape):
                    failures.append("%s: xattrs say %s %s" % (name, dt, shape))
            for mode in ("read", "mmap"):
                out = os.path.join(work, "out-%s.pt" % mode)
                r = subprocess.run([sys.executable, os.path.abspath(__file__),
                                    "--load", st_path, "--mode", mode,
                                    "--inputs", os.path.join(work, "inputs.pt"),
                                    "--out", out],
                                   timeout=CHILD_TIMEOUT_S, capture_output=True)
                if r.returncode != 0:
                    failures.append("%s loader exited %d: %s" % (
                        mode, r.returncode, r.stderr.decode(errors="replace")[-2000:]))
                    continue
                got = torch.load(out)
                bad = [k for k in state if not torch.equal(got["state"][k], state[k])]
                if bad:
                    failures.append("%s: tensors differ: %s" % (mode, bad))
                if got["changed"] != len(state):
                    failures.append("%s: only %d of %d fresh tensors changed on load"
                                    % (mode, got["changed"], len(state)))
                if not torch.equal(got["outputs"], ref):
                    diff = (got["outputs"] - ref).abs().max().item()
                    failures.append("%s: outputs differ (max abs diff %g)" % (mode, diff))
                else:
                    print("ok   %-4s load of model.safetensors: %d tensors, outputs %s equal"
                          % (mode, len(state), tuple(ref.shape)))
            if failures:
                print("daemon log tail:\n" + m.log_text())
    finally:
        if args.keep:
            print("kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
