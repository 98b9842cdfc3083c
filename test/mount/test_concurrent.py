#!/usr/bin/python3
"""Mount test (m): concurrent readers. On a fresh mount (so the daemon
assembles while others wait on it), 4 threads start together and read
different tensors whole (in random chunk sizes with pread), random slices,
and all of them one shared large tensor; every byte is checked against the
reference. Repeated on a second checkpoint of another layout."""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

NTHREADS = 4


def reader(tid, root, ref, names, shared, seed, barrier, out):
    import random
    rng = random.Random(seed)
    fails = []
    nchecks = 0
    barrier.wait(timeout=60)
    for name in names + [shared, shared]:
        want = ref.tensor_bytes(name)
        p = sm.tensor_path(root, name)
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                got = bytearray()
                off = 0
                while True:
                    b = os.pread(fd, rng.choice([4096, 65536, 131072, 1 << 20, 12345]), off)
                    if not b:
                        break
                    got += b
                    off += len(b)
            finally:
                os.close(fd)
            nchecks += 1
            if bytes(got) != want:
                fails.append("thread %d: tensors/%s differs (%d bytes, want %d)" % (
                    tid, name, len(got), len(want)))
            shape = ref.tensors[name]["shape"]
            if shape:
                dims = [sm.random_dim(rng, n) for n in shape]
                spec = ",".join(d[0] for d in dims)
                sw = ref.array(name)[tuple(d[1] for d in dims)].tobytes()
                nchecks += 1
                if sm.read_file(sm.tensor_path(root, name, spec)) != sw:
                    fails.append("thread %d: slice %s@%s differs" % (tid, name, spec))
        except OSError as e:
            fails.append("thread %d: %s: %s" % (tid, name, e))
    out[tid] = (nchecks, fails)


def run_round(env, ck, root, ref, label):
    names = sorted(ref.tensors, key=ref.nbytes, reverse=True)
    shared = names[0]
    # warm the reference cache (and its numpy views) before the threads start
    for n in names:
        ref.tensor_bytes(n)
    barrier = threading.Barrier(NTHREADS)
    out = {}
    threads = [threading.Thread(target=reader, args=(
        i, root, ref, names[i::NTHREADS], shared, env.rng.randrange(1 << 30), barrier, out))
        for i in range(NTHREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
        ck.ok(not t.is_alive(), "%s: reader thread finished within its timeout" % label)
    for tid in range(NTHREADS):
        nchecks, fails = out.get(tid, (0, ["thread %d produced no result" % tid]))
        ck.ok(nchecks > 0, "%s: thread %d checked something" % (label, tid))
        for f in fails:
            ck.ok(False, "%s: %s" % (label, f))
        ck.passed += nchecks - len(fails)


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "mixed": env.gen(os.path.join(store, "mixed"), layout="mixed", ranks=4,
                         size="16M", seed=81, block_size="64K"),
        "llama": env.gen(os.path.join(store, "llama"), layout="llama", ranks=4,
                         size="24M", dtype="BF16", seed=82, block_size="128K"),
    }
    with sm.Mount(env, store, name="concurrent") as m:
        for cname, ref in sorted(refs.items()):
            run_round(env, ck, os.path.join(m.mnt, cname), ref, cname)
        ck.ok(m.alive(), "daemon alive after concurrent readers")


if __name__ == "__main__":
    sys.exit(sm.main(run))
