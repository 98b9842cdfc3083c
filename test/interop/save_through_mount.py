#!/usr/bin/python3
"""save_through_mount - current frameworks saving through a shardfs mount
and loading back through it (issue 26, SPEC 8; `tools/test.sh --interop`).

    /usr/bin/python3 save_through_mount.py --bin BUILD/tools \\
        --framework torch|hf|paddle|megatron --py VENV/bin/python [--mpi]

The harness (Debian's python, test/mount/sfmount.py) mounts a fresh, empty
store (one daemon; with --mpi two daemons under mpirun, each with its own
node-local store, rank r saving through mount r and loading through the
other), runs the framework's own save in processes of the venv's python
(this file again, `--worker`), waits until the mount shows the save
complete with `user.shardfs.verified` = yes, and has the framework load it
back through the mount into fresh objects, compared byte for byte with the
state it saved (kept in memory):

  torch     torch 2.x `dcp.save` / `dcp.load` (checkpoint_id=) from 2 gloo
            processes: an FSDP2 (fully_shard) model + AdamW after a step,
            through get_state_dict / set_state_dict, and a DTensor Shard(0)
  hf        transformers `save_pretrained` (safetensors, sharded with an
            index) / `from_pretrained` of a tiny Llama
  paddle    `paddle.distributed.save_state_dict` / `load_state_dict` from 2
            CPU processes (paddle.distributed.launch): Shard(0), Shard(1)
            and Replicate tensors; loaded back in one process into whole
            tensors (paddle 3.3's multi-process load reshards through
            .cuda(), which a CPU box lacks)
  megatron  Megatron-Core `dist_checkpointing.save` / `load` from 2 gloo
            processes: ShardedTensors split by rows and by columns, a
            replicated one, and a common object

Exit 0 when everything held, 1 on a failure, 77 when FUSE (or mpirun for
--mpi) is absent. Every mount is unmounted and every daemon reaped.
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "step-7"
FORMATS = {"torch": "torch-dcp", "hf": "hf", "paddle": "paddle-dcp",
           "megatron": "megatron-torch_dist"}
WAIT_S = 30.0


def xattr(path, name):
    try:
        return os.getxattr(path, name).decode()
    except OSError as e:
        return "error %d" % e.errno


def wait_verified(path, bound=WAIT_S):
    """(state, verified) of path once committed and verified, or as they
    are after bound seconds."""
    t0 = time.monotonic()
    while True:
        st, v = xattr(path, "user.shardfs.state"), xattr(path, "user.shardfs.verified")
        if (st == "committed" and v == "yes") or time.monotonic() - t0 > bound:
            return st, v
        time.sleep(0.1)


# ------------------------------------------------------------ workers

def tbytes(t):
    """Raw bytes of a tensor (DTensor: its local part)."""
    import torch
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def compare(label, want, got):
    """want, got: {key: bytes or object}; prints and returns mismatches."""
    bad = sorted(k for k in want if k not in got or got[k] != want[k])
    extra = sorted(k for k in got if k not in want)
    for k in bad[:10]:
        print("FAIL %s: %s differs after the load through the mount" % (label, k))
    if extra:
        print("FAIL %s: loaded keys not saved: %s" % (label, extra[:10]))
    if not bad and not extra:
        print("OK %s: %d entries byte-exact" % (label, len(want)))
    return len(bad) + len(extra)


def flat_bytes(sd):
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    flat, _ = flatten_state_dict(sd)
    return {k: tbytes(v) if isinstance(v, torch.Tensor) else v for k, v in flat.items()}


def w_torch(rank, world, init, save, load):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    def build(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(),
                                torch.nn.Linear(300, 17))
        fully_shard(m, mesh=mesh)
        o = torch.optim.AdamW(m.parameters(), lr=0.01)
        torch.manual_seed(seed + 1)
        m(torch.randn(8, 64)).square().sum().backward()
        o.step()
        o.zero_grad()
        return m, o

    torch.manual_seed(99)
    big = torch.randn(1000, 1031)  # a few MiB: several 4 MiB blocks per file
    model, opt = build(1)
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd,
          "extra": {"big": distribute_tensor(big, mesh, [Shard(0)]), "step": 7}}
    want = flat_bytes(sd)
    dcp.save(sd, checkpoint_id=save)
    dist.barrier()
    if rank == 0:
        print("saved: state %s, verified %s" % wait_verified(save))
    dist.barrier()
    print("to load: state %s, verified %s" % wait_verified(load))  # each mount seals
    model2, opt2 = build(2)  # other values, the same structure
    msd2, osd2 = get_state_dict(model2, opt2)
    sd2 = {"model": msd2, "optim": osd2,
           "extra": {"big": distribute_tensor(torch.zeros_like(big), mesh, [Shard(0)]),
                     "step": 0}}
    dcp.load(sd2, checkpoint_id=load)
    set_state_dict(model2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
    msd3, osd3 = get_state_dict(model2, opt2)
    got = flat_bytes({"model": msd3, "optim": osd3, "extra": sd2["extra"]})
    n = compare("torch rank %d (dcp.load into a fresh FSDP2 model + AdamW)" % rank, want, got)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if n else 0


def w_hf(save, load):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    m = LlamaForCausalLM(cfg)
    want = {k: tbytes(v) for k, v in m.state_dict().items()}
    m.save_pretrained(save, max_shard_size="100KB")
    print("files: %s" % sorted(os.listdir(save)))
    print("saved: state %s, verified %s" % wait_verified(save))
    print("to load: state %s, verified %s" % wait_verified(load))
    back = LlamaForCausalLM.from_pretrained(load)
    got = {k: tbytes(v) for k, v in back.state_dict().items()}
    return 1 if compare("hf (from_pretrained)", want, got) else 0


def paddle_full():
    import numpy as np
    g = np.random.default_rng(11)
    return {"rows": g.standard_normal((600, 700)).astype(np.float32),
            "cols": (np.arange(48, dtype=np.int64).reshape(6, 8) * 7 - 50),
            "rep": g.standard_normal((5, 3)).astype(np.float32),
            "plain": np.arange(5, dtype=np.int32)}


def w_paddle(save, load):
    """A rank of paddle.distributed.launch: its part of the save; rank 0
    waits for the mount to show it verified."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import ProcessMesh, Replicate, Shard

    dist.init_parallel_env()
    rank = dist.get_rank()
    mesh = ProcessMesh([0, 1], dim_names=["x"])
    place = {"rows": [Shard(0)], "cols": [Shard(1)], "rep": [Replicate()]}
    sd = {}
    for k, a in paddle_full().items():
        t = paddle.to_tensor(a)
        sd[k] = dist.shard_tensor(t, mesh, place[k]) if k in place else t
    dist.save_state_dict(sd, save)
    dist.barrier()
    if rank == 0:
        print("saved: state %s, verified %s" % wait_verified(save))
    dist.barrier()
    print("to load: state %s, verified %s" % wait_verified(load))  # each mount seals
    return 0


def w_paddle_load(load):
    """One process: load_state_dict into whole tensors (paddle 3.3's
    multi-process load reshards through .cuda(): not on a CPU box)."""
    import numpy as np
    import paddle
    import paddle.distributed as dist
    full = paddle_full()
    print("to load: state %s, verified %s" % wait_verified(load))
    back = {k: paddle.zeros(list(a.shape), dtype=str(a.dtype)) for k, a in full.items()}
    dist.load_state_dict(back, load)
    want = {k: np.ascontiguousarray(a).tobytes() for k, a in full.items()}
    got = {k: np.ascontiguousarray(v.numpy()).tobytes() for k, v in back.items()}
    return 1 if compare("paddle (load_state_dict, whole tensors)", want, got) else 0


def w_megatron(rank, world, init, save, load):
    sys.path.insert(0, HERE)
    import make_megatron017_fixtures as m17  # CPU shims, megatron imported
    import torch
    import torch.distributed as dist
    mdc, ST = m17.mdc, m17.ShardedTensor

    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    torch.manual_seed(5)
    rows, cols = torch.randn(1024, 513), torch.randn(40, 64)
    rep = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    r0, c0 = 1024 // world, 64 // world

    def ssd(zero):
        f = torch.zeros_like if zero else (lambda t: t.clone())
        return {"rows": ST.from_rank_offsets("rows", f(rows[rank * r0:(rank + 1) * r0]),
                                             (0, rank, world)),
                "cols": ST.from_rank_offsets("cols", f(cols[:, rank * c0:(rank + 1) * c0]),
                                             (1, rank, world)),
                "rep": ST.from_rank_offsets("rep", f(rep), replica_id=rank),
                "common": {"iteration": 7, "args": "tiny"}}

    sd = ssd(False)
    want = {k: tbytes(v.data) if k != "common" else v for k, v in sd.items()}
    if rank == 0:
        os.makedirs(save, exist_ok=True)
    dist.barrier()
    mdc.save(sd, save)
    dist.barrier()
    if rank == 0:
        print("files: %s" % sorted(os.listdir(save)))
        print("saved: state %s, verified %s" % wait_verified(save))
    dist.barrier()
    print("to load: state %s, verified %s" % wait_verified(load))  # each mount seals
    back = mdc.load(ssd(True), load)
    got = {k: tbytes(v) if k != "common" else v for k, v in back.items()}
    n = compare("megatron rank %d (dist_checkpointing.load)" % rank, want, got)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if n else 0


def worker(argv):
    fw = argv[0]
    if fw == "hf":
        return w_hf(argv[1], argv[2])
    if fw == "paddle":
        return w_paddle(argv[1], argv[2])
    if fw == "paddle-load":
        return w_paddle_load(argv[1])
    rank, world, init, save, load = int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5]
    return (w_torch if fw == "torch" else w_megatron)(rank, world, init, save, load)


# ------------------------------------------------------------ harness

def run_workers(env, ck, fw, py, saves, loads):
    """The framework's save + load: 2 processes (hf: 1); True when all
    exited 0. saves[r], loads[r]: rank r's paths."""
    if fw == "hf":
        cmds = [[py, __file__, "--worker", "hf", saves[0], loads[0]]]
    elif fw == "paddle":
        # one save and load path for both (paddle's launch starts the ranks)
        cmds = [[py, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                 "--log_dir", env.path("paddle-logs"), __file__, "--worker", "paddle",
                 saves[0], loads[0]],
                [py, __file__, "--worker", "paddle-load", loads[0]]]
    else:
        init = env.path("pg-init")
        cmds = [[py, __file__, "--worker", fw, str(r), "2", init, saves[r], loads[r]]
                for r in range(2)]
    def start(c):
        return subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    # paddle: the load (one process) once the launched save returned
    procs = [start(c) for c in cmds] if fw != "paddle" else [start(cmds[0])]
    ok = True
    while procs:
        p = procs.pop(0)
        try:
            out, _ = p.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        text = out.decode(errors="replace")
        if fw == "paddle" and os.path.isdir(env.path("paddle-logs")):
            for f in sorted(os.listdir(env.path("paddle-logs"))):
                text += "\n" + open(os.path.join(env.path("paddle-logs"), f),
                                    errors="replace").read()
        lines = [ln for ln in text.splitlines()
                 if ln.startswith(("OK ", "FAIL ", "saved:", "to load:", "files:"))]
        print("\n".join(lines))
        ck.ok(not [ln for ln in lines if ln.startswith("FAIL ")],
              "%s: the load through the mount gives back what was saved" % fw)
        if not ck.eq(p.returncode, 0, "%s: the framework's save and load exited 0" % fw):
            print(text[-4000:])
        ok = ok and p.returncode == 0
        if fw == "paddle" and len(cmds) > 1 and ok:
            procs.append(start(cmds.pop()))
    return ok


def check_saved(ck, fw, roots, stores):
    for root in roots:
        st, v = wait_verified(root, 5.0)
        ck.eq(st, "committed", "%s: %s complete" % (fw, root))
        ck.eq(v, "yes", "%s: %s verified" % (fw, root))
        ck.ok(xattr(root, "user.shardfs.format").startswith(FORMATS[fw]),
              "%s: %s sealed as %s (%s)" % (fw, root, FORMATS[fw],
                                           xattr(root, "user.shardfs.format")))
    held = set()
    for s in stores:
        d = os.path.join(s, NAME)
        if os.path.isdir(d):
            held |= {f for f in os.listdir(d) if not f.startswith((".shardfs", "shardfs"))}
    shown = set(os.listdir(roots[0]))
    ck.ok(held and held <= shown,
          "%s: the framework's files are in the store(s) under their names and shown at the root: %s (shown %s)" % (
              fw, sorted(held), sorted(shown)))


def run(env, ck, fw, py, mpi):
    sys.path.insert(0, os.path.join(HERE, "..", "mount"))
    sys.path.insert(0, os.path.join(HERE, "..", "mpi"))
    if mpi:
        import sfmpi
        pattern = env.path("store%r")
        for r in range(2):
            os.makedirs(sfmpi.expand(pattern, r))
        with sfmpi.Cluster(env, pattern, nranks=2, name=fw) as c:
            roots = [os.path.join(c.mnt(r), NAME) for r in range(2)]
            if fw in ("hf", "paddle"):  # one process (tree) through mount 0
                saves, loads = roots[:1], roots[1:]
            else:
                saves, loads = roots, roots[::-1]
            if run_workers(env, ck, fw, py, saves, loads):
                check_saved(ck, fw, roots, [c.store(r) for r in range(2)])
        return
    import sfmount as sm
    store = env.path("store")
    os.makedirs(store)
    with sm.Mount(env, store, name=fw) as m:
        root = os.path.join(m.mnt, NAME)
        if run_workers(env, ck, fw, py, [root, root], [root, root]):
            check_saved(ck, fw, [root], [store])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", required=True, choices=["torch", "hf", "paddle", "megatron"])
    ap.add_argument("--py", required=True, help="the venv's python")
    ap.add_argument("--mpi", action="store_true")
    args, rest = ap.parse_known_args()
    sys.path.insert(0, os.path.join(HERE, "..", "mount"))
    sys.path.insert(0, os.path.join(HERE, "..", "mpi"))
    if args.mpi:
        import sfmpi
        sfmpi.preflight()
    import sfmount as sm
    return sm.main(lambda env, ck: run(env, ck, args.framework, args.py, args.mpi), rest)


if __name__ == "__main__":
    sys.exit(main())
