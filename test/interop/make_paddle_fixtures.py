"""make_paddle_fixtures - PaddlePaddle distributed checkpoints written by a
real paddle (paddle.distributed.save_state_dict).

    /work/venvs/paddle/bin/python make_paddle_fixtures.py OUTDIR

Writes OUTDIR/paddle-X.Y.Z/NAME/ (the checkpoint as paddle wrote it) and
OUTDIR/paddle-X.Y.Z/NAME.expected.json beside each, in the shape
test/interop/check_dcp_tree.py reads:

  {"paddle": version,
   "tensors": {key: {"dtype", "shape", "nbytes", "xxh3"}},
   "objects": {}}

computed from the numpy arrays handed to paddle (xxh3_64 of each whole
tensor's row-major bytes), never by reading the checkpoint back. Then
paddle's own load_state_dict reads every checkpoint back and each tensor is
compared with those arrays; any difference fails the run. Checkpoints:

  single     one process: F32, F16, BF16, F64, I64, I32, I8, U8, BOOL, a
             0-d tensor, a transposed view (saved in Fortran order), a
             sliced view, nested dicts; an empty tensor (paddle drops it)
  gens       one process, saved twice into one directory with unique_id 0
             and 1 (different tensors): two generations
  shard2     2 processes (paddle.distributed.launch, CPU): Shard(0) uneven
             5 x 3 -> 3/2, Shard(1) 4 x 6 and 3 x 5 (3/2), Shard(0) of
             1 row (rank 1 holds nothing), replicated tensors (F64, F16,
             BF16), a plain tensor
  replicas2  the same state with save_replicas=True (replica_id 0 and 1)
  flat4      4 processes: ShardedWeight chunks with is_flattened=True: a
             5 x 7 tensor as 4 flat ranges, a 4 x 6 tensor as 2 column
             boxes each saved as 2 flat ranges, a BF16 2 x 3 x 4 as 4
  safet      one process, safetensors=True (R_N.safetensors data files)

Values are seeded: a re-run writes the same tensors.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import xxhash

HERE = os.path.abspath(__file__)


def bf16_bits(a):
    """float32 array -> its bfloat16 bit patterns (uint16, truncated)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


# (numpy dtype of what paddle is given, paddle dtype) -> shardfs name; a
# uint16 array given to paddle.to_tensor becomes a bfloat16 tensor.
DT = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
      "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
      "uint8": "U8", "bool": "BOOL"}


class T:
    """A tensor as handed to paddle: its array and paddle dtype."""

    def __init__(self, arr, pdtype=None):
        self.arr = arr
        self.pdtype = pdtype or str(arr.dtype)


def describe(t):
    b = np.ascontiguousarray(t.arr).tobytes()
    return {"dtype": DT[t.pdtype], "shape": list(t.arr.shape), "nbytes": len(b),
            "xxh3": "%016x" % xxhash.xxh3_64_intdigest(b)}


def expect(path, items):
    import paddle
    exp = {"paddle": paddle.__version__, "tensors": {}, "objects": {}}
    for k, v in items.items():
        exp["tensors"][k] = describe(v)
    with open(path + ".expected.json", "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def to_paddle(t):
    import paddle
    return paddle.to_tensor(t.arr)  # uint16 -> bfloat16, as paddle does


def rng(seed):
    return np.random.default_rng(seed)


def single_state():
    g = rng(11)
    base = g.standard_normal((6, 5)).astype(np.float32)
    return {
        "model.embed.weight": T(g.standard_normal((16, 8)).astype(np.float32)),
        "model.norm.weight": T(g.standard_normal(8).astype(np.float16)),
        "model.head.weight": T(bf16_bits(g.standard_normal((4, 8))), "bfloat16"),
        "model.f64": T(g.standard_normal((3, 3))),
        "model.ids": T(g.integers(-2**40, 2**40, 7, dtype=np.int64)),
        "model.i32": T(g.integers(-2**31, 2**31 - 1, (2, 5), dtype=np.int32)),
        "model.i8": T(g.integers(-128, 127, (2, 3, 4), dtype=np.int8)),
        "model.u8": T(g.integers(0, 255, 10, dtype=np.uint8)),
        "model.mask": T(g.integers(0, 2, 9).astype(bool)),
        "scalar": T(np.array(3.25, dtype=np.float32)),
        "transposed": T(base.T),        # handed as a view: .T of a tensor
        "sliced": T(base[2:5, 1:4]),    # and a slice of one
        "optim": {"lr_t": T(np.array([0.5], dtype=np.float32)),
                  "state": {"0": T(np.arange(4, dtype=np.float32))}},
        "empty": T(np.zeros((0, 4), dtype=np.float32)),
    }


def flat(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def paddle_single_state(sd):
    """The dict handed to save_state_dict: views stay views."""
    import paddle
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = paddle_single_state(v)
        elif k == "transposed":
            out[k] = paddle.to_tensor(v.arr.T).T       # a strided view in paddle
        elif k == "sliced":
            base = paddle.to_tensor(single_state()["transposed"].arr.T)
            out[k] = base[2:5, 1:4]
        else:
            out[k] = to_paddle(v)
    return out


def gens_states():
    g = rng(12)
    a = {"w": T(g.standard_normal((3, 4)).astype(np.float32)),
         "b": T(np.arange(5, dtype=np.int64))}
    b = {"w": T(g.standard_normal((2, 2)).astype(np.float32)),
         "c": T(g.integers(0, 9, 6, dtype=np.int32))}
    return a, b


def shard_state():
    g = rng(13)
    return {"rows": T(g.standard_normal((5, 3)).astype(np.float32)),
            "cols": T(np.arange(24, dtype=np.int64).reshape(4, 6) * 7 - 50),
            "cols5": T(g.standard_normal((3, 5)).astype(np.float32)),
            "one": T(np.array([[1.5, -2.0, 3.0]], dtype=np.float32)),
            "rep": T(g.standard_normal(4)),
            "rep_f16": T(g.standard_normal((2, 3)).astype(np.float16)),
            "rep_bf16": T(bf16_bits(g.standard_normal((3, 2))), "bfloat16"),
            "plain": T(np.arange(5, dtype=np.int32))}


SHARD_DIMS = {"rows": 0, "cols": 1, "cols5": 1, "one": 0}


def flat_state():
    g = rng(14)
    return {"w": T(g.standard_normal((5, 7)).astype(np.float32)),
            "u": T(g.integers(-99, 99, (4, 6), dtype=np.int32)),
            "v": T(bf16_bits(g.standard_normal((2, 3, 4))), "bfloat16")}


W_CUTS = [0, 9, 17, 30, 35]
U_CUTS = [0, 5, 12]
V_CUTS = [0, 5, 13, 20, 24]


def flat_chunks(rank):
    """rank's ShardedWeight pieces: key -> (global_offset, local_shape,
    flat range, the flattened box's elements in it)."""
    st = flat_state()
    w, u, v = st["w"].arr, st["u"].arr, st["v"].arr
    box = rank // 2
    ub = np.ascontiguousarray(u[:, 3 * box:3 * box + 3]).reshape(-1)
    uc = (U_CUTS[rank % 2], U_CUTS[rank % 2 + 1])
    return {"w": ((0, 0), (5, 7), (W_CUTS[rank], W_CUTS[rank + 1]),
                  w.reshape(-1)[W_CUTS[rank]:W_CUTS[rank + 1]]),
            "u": ((0, 3 * box), (4, 3), uc, ub[uc[0]:uc[1]]),
            "v": ((0, 0, 0), (2, 3, 4), (V_CUTS[rank], V_CUTS[rank + 1]),
                  v.reshape(-1)[V_CUTS[rank]:V_CUTS[rank + 1]])}


# ------------------------------------------------------------ checks

def same(got, t):
    a = np.ascontiguousarray(np.array(got))
    if t.pdtype == "bfloat16":
        a = a.view(np.uint16)
    want = np.ascontiguousarray(t.arr)
    return a.shape == want.shape and a.tobytes() == want.tobytes()


def load_back(path, items, missing=(), **kw):
    """paddle's load_state_dict into zeros of each expected tensor; every
    tensor must come back equal to what was handed to paddle."""
    import paddle
    import paddle.distributed as dist
    sd = {k: paddle.zeros(list(t.arr.shape), dtype=t.pdtype) for k, t in items.items()}
    dist.load_state_dict(sd, path, **kw)
    bad = [k for k, t in items.items() if not same(sd[k], t)]
    if bad:
        raise SystemExit("%s: paddle reads back other values for %s" % (path, bad))
    for k in missing:
        sd2 = {k: paddle.zeros([0, 4], dtype="float32")}
        try:
            dist.load_state_dict(sd2, path)
        except Exception:  # noqa: BLE001 - whatever paddle says, it is not there
            pass
    print("%s: paddle's load_state_dict gives back all %d tensors" % (path, len(items)))


# ------------------------------------------------------------ writers

def single(out):
    import paddle.distributed as dist
    sd = single_state()
    path = os.path.join(out, "single")
    shutil.rmtree(path, ignore_errors=True)
    dist.save_state_dict(paddle_single_state(sd), path)
    items = flat(sd)
    del items["empty"]  # paddle does not save a tensor with no elements:
    import paddle
    md = paddle.load(os.path.join(path, "0.metadata"))
    if "empty" in md.state_dict_metadata:
        raise SystemExit("%s: paddle now saves the empty tensor: expect it" % path)
    expect(path, items)
    load_back(path, items)


def gens(out):
    import paddle.distributed as dist
    a, b = gens_states()
    path = os.path.join(out, "gens")
    shutil.rmtree(path, ignore_errors=True)
    dist.save_state_dict({k: to_paddle(v) for k, v in a.items()}, path, unique_id=0)
    dist.save_state_dict({k: to_paddle(v) for k, v in b.items()}, path, unique_id=1)
    expect(path, b)
    # paddle 3.3.1's load_state_dict refuses a directory with two metadata
    # files unless told which ("Only support one metadata file now")
    load_back(path, b, unique_id=1)


def safet(out):
    import paddle.distributed as dist
    sd = {k: v for k, v in flat(single_state()).items()
          if k not in ("empty", "transposed", "sliced")}
    path = os.path.join(out, "safet")
    shutil.rmtree(path, ignore_errors=True)
    dist.save_state_dict({k: to_paddle(v) for k, v in sd.items()}, path,
                         safetensors=True)
    expect(path, sd)
    import paddle
    back = {k: paddle.zeros(list(t.arr.shape), dtype=t.pdtype) for k, t in sd.items()}
    dist.load_state_dict(back, path, safetensors=True)
    bad = [k for k, t in sd.items() if not same(back[k], t)]
    if bad:
        raise SystemExit("%s: paddle reads back other values for %s" % (path, bad))
    print("%s: paddle's load_state_dict gives back all %d tensors" % (path, len(sd)))


def worker(kind, path):
    import paddle
    import paddle.distributed as dist
    dist.init_parallel_env()
    rank = dist.get_rank()
    if kind == "shard2":
        from paddle.distributed import ProcessMesh, Replicate, Shard
        mesh = ProcessMesh([0, 1], dim_names=["x"])
        sd = {}
        for k, t in shard_state().items():
            if k in SHARD_DIMS:
                sd[k] = dist.shard_tensor(to_paddle(t), mesh, [Shard(SHARD_DIMS[k])])
            elif k.startswith("rep"):
                sd[k] = dist.shard_tensor(to_paddle(t), mesh, [Replicate()])
            else:
                sd[k] = to_paddle(t)
        dist.save_state_dict(sd, path)
        dist.save_state_dict(sd, path.replace("shard2", "replicas2"), save_replicas=True)
    else:
        from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight
        full = flat_state()
        sd = {}
        for k, (off, shape, (s, e), piece) in flat_chunks(rank).items():
            sd[k] = ShardedWeight(k, to_paddle(T(piece.copy(), full[k].pdtype)),
                                  shape, full[k].arr.shape, off,
                                  is_flattened=True, flattened_range=slice(s, e))
        dist.save_state_dict(sd, path)
        dist.barrier()
        # paddle's own load, into the same flattened layout
        back = {}
        for k, (off, shape, (s, e), piece) in flat_chunks(rank).items():
            z = paddle.zeros([e - s], dtype=full[k].pdtype)
            back[k] = ShardedWeight(k, z, shape, full[k].arr.shape, off,
                                    is_flattened=True, flattened_range=slice(s, e))
        dist.load_state_dict(back, path)
        for k, (off, shape, rng_, piece) in flat_chunks(rank).items():
            if not same(back[k].local_tensor, T(piece, full[k].pdtype)):
                raise SystemExit("rank %d: paddle reads back other values for %s" % (rank, k))
        print("rank %d: paddle's load_state_dict gives back its flat pieces" % rank)
    dist.barrier()


def multi(out, kind, nproc):
    path = os.path.join(out, kind)
    shutil.rmtree(path, ignore_errors=True)
    if kind == "shard2":
        shutil.rmtree(os.path.join(out, "replicas2"), ignore_errors=True)
    logs = tempfile.mkdtemp()
    try:
        r = subprocess.run([sys.executable, "-m", "paddle.distributed.launch",
                            "--nproc_per_node", str(nproc), "--log_dir", logs,
                            HERE, "--worker", kind, path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            for f in sorted(os.listdir(logs)):
                with open(os.path.join(logs, f), errors="replace") as fh:
                    sys.stderr.write(fh.read()[-3000:])
            raise SystemExit("%s: paddle.distributed.launch failed" % kind)
        for f in sorted(os.listdir(logs)):
            with open(os.path.join(logs, f), errors="replace") as fh:
                for line in fh:
                    if "gives back" in line:
                        print(kind, line.strip())
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    if kind == "shard2":
        expect(path, shard_state())
        load_back(path, shard_state())
        rp = os.path.join(out, "replicas2")
        expect(rp, shard_state())
        load_back(rp, shard_state())
    else:
        expect(path, flat_state())


def main(argv):
    if len(argv) == 4 and argv[1] == "--worker":
        return worker(argv[2], argv[3])
    if len(argv) != 2:
        print(__doc__)
        return 2
    import paddle
    out = os.path.join(argv[1], "paddle-%s" % paddle.__version__)
    os.makedirs(out, exist_ok=True)
    single(out)
    gens(out)
    safet(out)
    multi(out, "shard2", 2)
    multi(out, "flat4", 4)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
