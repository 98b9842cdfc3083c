#!/usr/bin/python3
"""MPI read side (issue 3, portability (a)): checkpoints generated for 4
ranks are split into 4 node-local stores (each with manifest.json, the
root files and only its own rank-0000R/ payloads) and served by
`mpirun -np 4 shardfs --mpi STORE%r MNT%r`.

  1. every tensor, root file, random slices and model.safetensors through
     every daemon's mount equal the unsharded reference (3 of 4 shards of
     a tensor are remote on average), and model.safetensors equals the one
     a single-process mount of the unsplit store shows;
  2. the same with STORE%r being one checkpoint directory itself (peers
     index it under the name "");
  3. all of rank 2's payloads deleted while running: tensors that need
     them fail with EIO on every daemon within a bound, the rest read
     correctly, no daemon dies;
  4. rank 3 stopped (SIGSTOP): a read on rank 0 that needs rank 3's bytes
     fails with EIO within DEAD_BOUND_S (the heartbeat marks rank 3 down
     1.5 s after it went silent, whatever --peer-timeout says); the next
     read that needs it fails in well under a second; a read that does not
     need rank 3 succeeds meanwhile, and after SIGCONT (its next heartbeat
     marks rank 3 up) the same tensors read correctly.
"""

import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

PEER_TIMEOUT_S = 3
DEAD_BOUND_S = 2.5      # a read of a stopped rank's bytes: SPEC's 2 s from
                        # the stop; this one is timed from its own start,
                        # with 0.5 s for the reader process to start on a
                        # loaded machine
FAIL_BOUND_S = 20       # a failing read must end within this (several
                        # kernel requests may each wait one peer timeout)

CONFIGS = [
    # (name, layout, size, dtype, block size, seed)
    ("mixed4", "mixed", "8M", "BF16", "64K", 31),
    ("fsdp4", "fsdp", "4M", "F32", "128K", 32),
    ("repl4", "replicated", "2M", "F16", "64K", 33),
]


def gen_split(env, full, stores, name, layout, size, dtype, bs, seed):
    ref = env.gen(os.path.join(full, name), layout=layout, ranks=4, size=size,
                  dtype=dtype, block_size=bs, seed=seed)
    sfmpi.split_store(os.path.join(full, name), stores)
    return ref


def part_full_and_cluster(env, ck, full, stores, refs):
    # what one process shows for the unsplit store
    single_st = {}
    with sm.Mount(env, full, name="full") as m:
        for name in refs:
            single_st[name] = sm.read_file(os.path.join(m.mnt, name,
                                                        "model.safetensors"))
    with sfmpi.Cluster(env, stores, ["--peer-timeout", str(PEER_TIMEOUT_S),
                                     "--log-level", "info"],
                       name="read") as c:
        for r in range(sfmpi.NRANKS):
            root = c.mnt(r)
            ck.eq(sorted(os.listdir(root)), sorted(refs),
                  "rank %d: checkpoints at the mount root" % r)
            for name, ref in sorted(refs.items()):
                label = "rank %d %s" % (r, name)
                sfmpi.check_ckpt(ck, env, os.path.join(root, name), ref, label)
                ck.bytes_eq(sm.read_file(os.path.join(root, name,
                                                      "model.safetensors")),
                            single_st[name],
                            "%s: model.safetensors equals the single-process one"
                            % label)
        ck.ok(c.alive(), "every daemon alive after the reads")
    log = c.log_text()
    for r in range(sfmpi.NRANKS):
        ck.ok("[rank %d] shardfs: info: mpi: rank %d of 4: " % (r, r) in log,
              "rank %d's log lines carry its rank" % r)


def part_single(env, ck):
    """STORE%r is one checkpoint directory."""
    full = env.path("full-single")
    ref = env.gen(os.path.join(full, "one"), layout="llama", ranks=4,
                  size="3M", dtype="BF16", block_size="64K", seed=41)
    pattern = env.path("single%r")
    sfmpi.split_store(os.path.join(full, "one"), pattern, single=True)
    with sfmpi.Cluster(env, pattern, name="single") as c:
        for r in range(sfmpi.NRANKS):
            names = set(os.listdir(c.mnt(r)))
            ck.ok({"tensors", "manifest.json", "model.safetensors"} <= names,
                  "single rank %d: the mount root is the checkpoint (%s)" % (
                      r, sorted(names)))
            sfmpi.check_ckpt(ck, env, c.mnt(r), ref, "single rank %d" % r,
                             nslices=10)


def read_timed(path, timeout_s=FAIL_BOUND_S + 10):
    t0 = time.monotonic()
    res = sm.read_in_child(path, timeout_s=timeout_s)
    return res, time.monotonic() - t0


def part_damage(env, ck):
    full = env.path("full-dmg")
    stores = env.path("dstore%r")
    refs = {
        "del": gen_split(env, full, stores, "del", "mixed", "3M", "BF16",
                         "64K", 51),
        "stop": gen_split(env, full, stores, "stop", "llama", "3M", "F32",
                          "64K", 52),
    }
    mans = {n: sm.manifest_of(os.path.join(full, n)) for n in refs}
    import hashlib
    with sfmpi.Cluster(env, stores, ["--peer-timeout", str(PEER_TIMEOUT_S)],
                       name="dmg") as c:
        # 3. rank 2's payloads disappear while the daemons run
        rdir = os.path.join(sfmpi.expand(stores, 2), "del", "rank-00002")
        shutil.rmtree(rdir)

        def bad_del(s):
            return s["file"].startswith("rank-00002/")
        ref, man = refs["del"], mans["del"]
        nbroken = 0
        for r in range(sfmpi.NRANKS):
            for name in sorted(ref.tensors):
                kind = sm.classify(man, ref, name, bad_del)
                path = sm.tensor_path(os.path.join(c.mnt(r), "del"), name)
                (res, val), dt = read_timed(path)
                want = hashlib.sha256(ref.tensor_bytes(name)).hexdigest()
                label = "deleted rank 2 payloads: rank %d tensors/%s (%s)" % (
                    r, name, kind)
                if kind == "broken":
                    nbroken += 1
                    ck.eq((res, val), ("errno", 5), label)
                    ck.ok(dt < FAIL_BOUND_S, "%s failed in %.1fs" % (label, dt))
                elif kind == "clean":
                    ck.eq((res, val), ("ok", want), label)
                else:
                    ck.ok((res, val) in (("ok", want), ("errno", 5)),
                          "%s: got %s %s" % (label, res, val))
        ck.ok(nbroken > 0, "some tensors needed rank 2's payloads (%d reads)"
              % nbroken)
        ck.ok(c.alive(), "every daemon alive after the EIOs")

        # 4. rank 3 stops answering
        ref, man = refs["stop"], mans["stop"]

        def bad_stop(s):
            return s["rank"] == 3
        broken = [n for n in sorted(ref.tensors)
                  if sm.classify(man, ref, n, bad_stop) == "broken"]
        clean = [n for n in sorted(ref.tensors)
                 if sm.classify(man, ref, n, bad_stop) == "clean"]
        pid = c.rank_pid(3)
        if not ck.ok(pid is not None, "found rank 3's daemon"):
            return
        if not ck.ok(broken, "the 'stop' checkpoint has tensors needing rank 3"):
            return
        root0 = os.path.join(c.mnt(0), "stop")
        os.kill(pid, signal.SIGSTOP)
        try:
            name = broken[0]
            (res, val), dt = read_timed(sm.tensor_path(root0, name))
            print("read of %s with rank 3 stopped: %s %s after %.1fs" % (
                name, res, val, dt))
            ck.eq((res, val), ("errno", 5),
                  "rank 3 stopped: rank 0 read of %s fails with EIO" % name)
            ck.ok(dt < DEAD_BOUND_S,
                  "rank 3 stopped: the read failed after %.1fs (< %.1fs: the "
                  "heartbeat, not the %ds peer timeout)" % (dt, DEAD_BOUND_S,
                                                           PEER_TIMEOUT_S))
            if len(broken) > 1:
                # the peer is marked down: the next read that needs only it
                # fails at once (or after one short probe), not after
                # another peer timeout
                n1 = broken[1]
                (res, val), dt = read_timed(sm.tensor_path(root0, n1))
                ck.eq((res, val), ("errno", 5),
                      "rank 3 marked down: rank 0 read of %s fails with EIO" % n1)
                ck.ok(dt < 1.5, "rank 3 marked down: the next read failed "
                      "after %.2fs (< 1.5s, not another %ds timeout)" % (
                          dt, PEER_TIMEOUT_S))
            if clean:
                n2 = clean[0]
                (res, val), dt = read_timed(sm.tensor_path(root0, n2))
                ck.eq((res, val), ("ok", hashlib.sha256(
                    ref.tensor_bytes(n2)).hexdigest()),
                    "rank 3 stopped: rank 0 still reads %s (no rank 3 shard)" % n2)
        finally:
            os.kill(pid, signal.SIGCONT)
        for name in broken[:3]:
            # marked up again by its next heartbeat
            deadline = time.monotonic() + 6
            while True:
                try:
                    got = sm.read_file(sm.tensor_path(root0, name))
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        got = None
                        ck.ok(False, "after SIGCONT: read %s: %s" % (name, e))
                        break
                    time.sleep(0.2)
            if got is None:
                continue
            ck.bytes_eq(got, ref.tensor_bytes(name),
                        "after SIGCONT: rank 0 reads %s" % name)
        ck.ok(c.alive(), "every daemon alive after rank 3 was stopped")


def run(env, ck):
    full = env.path("full")
    stores = env.path("store%r")
    refs = {}
    for (name, layout, size, dtype, bs, seed) in CONFIGS:
        refs[name] = gen_split(env, full, stores, name, layout, size, dtype,
                               bs, seed)
    part_full_and_cluster(env, ck, full, stores, refs)
    part_single(env, ck)
    part_damage(env, ck)


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
