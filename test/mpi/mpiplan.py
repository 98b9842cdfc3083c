"""mpiplan - what the MPI write-side tests share: an unsharded reference
built tensor by tensor (RefBuilder), per-rank plans of file calls
(Plan), one mpiwriter.py process per rank running them at once
(run_writers), `shardctl commit` on several ranks at once (commit_all)
and a checkpoint's user.shardfs.state through one rank's mount (state).

Every wait is bounded (WRITER_WAIT_S, COMMIT_WAIT_S); a process that
overruns is killed and reported as a failure. Standard library + numpy
only (run with /usr/bin/python3).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

COMMIT_WAIT_S = 60      # bound on one `shardctl commit` process
WRITER_WAIT_S = 120     # bound on one writer process
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpiwriter.py")


class RefBuilder:
    """Writes an unsharded reference in the `shardctl gen --ref` layout
    (index.json, tensors/NAME, files/NAME) so sm.Ref can load it."""

    def __init__(self, env, name):
        self.dir = env.path("ref-" + name)
        self.name = name
        self.rng = np.random.default_rng(env.rng.randrange(1 << 30))
        self.index = {"name": name, "tensors": {}, "files": {}}

    def tensor(self, name, dtype, shape):
        n = sm.DTYPES[dtype][0] * int(np.prod(shape, dtype=np.int64))
        p = os.path.join(self.dir, "tensors", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(self.rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        self.index["tensors"][name] = {"dtype": dtype, "shape": list(shape)}
        return p

    def file(self, name, data):
        p = os.path.join(self.dir, "files", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        self.index["files"][name] = {"size": len(data)}
        return p

    def done(self):
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            json.dump(self.index, f)
        return sm.Ref(self.dir)


class Plan:
    """Per-rank op lists for mpiwriter.py."""

    def __init__(self, rb):
        self.rb = rb
        self.ops = {r: [] for r in range(sfmpi.NRANKS)}
        self.srcs = {}

    def tensor(self, name, dtype, shape):
        self.srcs[name] = (self.rb.tensor(name, dtype, shape), dtype, shape)

    def declare(self, r, name, dtype=None, shape=None):
        _, dt, sh = self.srcs[name]
        self.ops[r].append({"op": "declare", "name": name,
                            "dtype": dtype or dt, "shape": shape or sh})

    def box(self, r, name, box, xor=0, declare=True):
        src, dt, sh = self.srcs[name]
        if declare:
            self.declare(r, name)
        full = [list(b) if b else [0, d] for b, d in zip(box, sh)]
        self.ops[r].append({"op": "box", "name": name, "src": src,
                            "itemsize": sm.DTYPES[dt][0], "shape": sh,
                            "box": full, "xor": xor})

    def flat(self, r, name, runs, chunk=1000, declare=True):
        src, _, _ = self.srcs[name]
        if declare:
            self.declare(r, name)
        self.ops[r].append({"op": "flat", "name": name, "src": src,
                            "runs": runs, "chunk": chunk})

    def file(self, r, name, data):
        self.ops[r].append({"op": "file", "name": name,
                            "src": self.rb.file(name, data)})


def run_writers(env, ck, c, ckpt, plan, label, ranks=None):
    """One writer process per rank (every rank, or those in ranks), all at
    once; True if all succeeded."""
    procs = []
    ranks = list(range(sfmpi.NRANKS)) if ranks is None else list(ranks)
    for r in ranks:
        pf = env.path("plan-%s-%d.json" % (ckpt, r))
        with open(pf, "w") as f:
            json.dump({"root": os.path.join(c.mnt(r), ckpt),
                       "ops": plan.ops[r]}, f)
        procs.append(subprocess.Popen(["/usr/bin/python3", WRITER, pf],
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    ok = True
    for r, pr in zip(ranks, procs):
        try:
            out, _ = pr.communicate(timeout=WRITER_WAIT_S)
        except subprocess.TimeoutExpired:
            pr.kill()
            out, _ = pr.communicate()
            out += b" (timed out)"
        ok &= ck.eq(pr.returncode, 0, "%s: writer of rank %d (%s)" % (
            label, r, out.decode(errors="replace").strip()))
    return ok


def commit_all(env, c, ckpt, ranks):
    """`shardctl commit` on each of ranks at once; {rank: (rc, out, secs)}."""
    procs = {}
    t0 = time.monotonic()
    for r in ranks:
        procs[r] = subprocess.Popen(
            [env.shardctl, "commit", os.path.join(c.mnt(r), ckpt)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    res = {}
    for r, pr in procs.items():
        try:
            out, _ = pr.communicate(timeout=COMMIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pr.kill()
            out, _ = pr.communicate()
            out += b" (no answer within %ds)" % COMMIT_WAIT_S
        res[r] = (pr.returncode, out.decode(errors="replace").strip(),
                  time.monotonic() - t0)
    return res


def state(c, r, ckpt):
    try:
        return os.getxattr(os.path.join(c.mnt(r), ckpt),
                           "user.shardfs.state").decode(errors="replace")
    except OSError as e:
        return "error %s" % sm.errname(e.errno)
