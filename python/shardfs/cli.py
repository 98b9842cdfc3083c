"""shardfs.cli - the command line of the shardfs Python package.

Run as python3 -m shardfs, or as tools/shardfs_save.py:

  demo MOUNT CKPT [--rank R --world W --seed S --no-commit --check]
      save rank R's shards of a small random state dict (the same full
      tensors on every rank, from the seed), then commit; --check reads the
      committed tensors back and compares them with the full state dict.
  commit MOUNT CKPT     commit; print the reason on failure
  state MOUNT CKPT      print user.shardfs.state
  ls PATH               tensors of a mounted checkpoint or a safetensors
                        file: name, dtype, shape

Exit status 0, 1 on an error (printed), 2 on bad usage.
"""

import argparse
import json
import os
import sys

from . import open as sf_open
from .dtypes import np
from .writer import Shard, as_bytes, commit, save, state


def demo_state_dict(seed):
    """A small state dict, identical on every rank for the same seed."""
    rng = np().random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s, dtype=np().float32)  # noqa: E731
    bf16 = lambda *s: (f32(*s).view(np().uint32) >> 16).astype(np().uint16)  # noqa: E731
    return {
        "embed.weight": ("BF16", bf16(512, 64)),        # flat ranges (FSDP-style)
        "layers/0/attn.wq": ("BF16", bf16(64, 64)),     # dim-0 boxes (column-parallel)
        "layers/0/attn.wo": ("BF16", bf16(64, 64)),     # dim-1 boxes (row-parallel)
        "layers/0/mlp.w1": (None, f32(128, 64)),        # dim-0 boxes, F32
        "layers/0/norm": (None, f32(64)),               # replicated
        "step": (None, np().array([3000], dtype=np().int64)),  # replicated
    }


def demo_shards(sd, rank, world):
    """Rank `rank`'s pieces of the demo state dict, tensor-parallel style."""
    shards = []
    for name, (dt, full) in sorted(sd.items()):
        if name.startswith("embed"):
            raw = full.tobytes()      # cuts need not fall on elements
            cut = lambda r: len(raw) * r // world + (3 if 0 < r < world else 0)  # noqa: E731
            shards.append(Shard(name, raw[cut(rank):cut(rank + 1)], shape=full.shape,
                                flat=cut(rank), dtype=dt))
        elif name.endswith(("wq", "w1", "wo")):
            dim = 1 if name.endswith("wo") else 0
            n = full.shape[dim] // world
            piece = np().take(full, range(rank * n, full.shape[dim] if rank == world - 1
                                          else (rank + 1) * n), axis=dim)
            offs = [0, 0]
            offs[dim] = rank * n
            shards.append(Shard(name, piece, shape=full.shape, offsets=offs, dtype=dt))
        else:
            shards.append(Shard(name, full, dtype=dt))
    return shards


def demo_check(mount, ckpt, sd):
    """Read every committed tensor back; return the names that differ."""
    bad = []
    for name, (dt, full) in sorted(sd.items()):
        with open(os.path.join(mount, ckpt, "tensors", name), "rb") as f:
            if f.read() != as_bytes(full, dt)[2]:
                bad.append(name)
    return bad


def _ls(path):
    with sf_open(path) as ck:
        for name in ck.names():
            t = ck.tensor(name)
            print("%s\t%s\t%s" % (name, t.dtype_name, json.dumps(list(t.shape))))


def main(argv=None, prog=None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="save one rank's shards of a random state dict")
    for p in (d, sub.add_parser("commit"), sub.add_parser("state")):
        p.add_argument("mount")
        p.add_argument("ckpt")
    sub.add_parser("ls", help="list the tensors of a checkpoint or safetensors file"
                   ).add_argument("path")
    d.add_argument("--rank", type=int, default=0)
    d.add_argument("--world", type=int, default=1)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-commit", action="store_true")
    d.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "state":
            print(state(args.mount, args.ckpt))
        elif args.cmd == "commit":
            commit(args.mount, args.ckpt)
            print("committed %s" % os.path.join(args.mount, args.ckpt))
        elif args.cmd == "ls":
            _ls(args.path)
        else:
            if not 0 <= args.rank < args.world:
                ap.error("--rank must be in [0, --world)")
            sd = demo_state_dict(args.seed)
            shards = demo_shards(sd, args.rank, args.world)
            save(args.mount, args.ckpt, shards,
                 files={"config.json": json.dumps({"seed": args.seed, "world": args.world})}
                 if args.rank == 0 else None, commit=not args.no_commit)
            print("rank %d: saved %d shards of %d tensors%s" % (
                args.rank, len(shards), len(sd), "" if args.no_commit else ", committed"))
            if args.check and not args.no_commit:
                bad = demo_check(args.mount, args.ckpt, sd)
                if bad:
                    print("read back differs: %s" % ", ".join(bad), file=sys.stderr)
                    return 1
                print("read back: %d tensors equal" % len(sd))
    except (OSError, ValueError) as e:
        print("%s: %s" % (ap.prog, e), file=sys.stderr)
        return 1
    return 0
