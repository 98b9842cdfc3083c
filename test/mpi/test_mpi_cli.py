#!/usr/bin/python3
"""The `shardfs --mpi` command line: %r expands in STORE and MOUNTPOINT
(several occurrences; %% is a literal %), bad --commit-timeout and
--peer-timeout values are usage errors (exit 2), a shardfs linked
with the MPI stub refuses --mpi with a clear message and exit 2, and rank 0
warns once when mpirun was started without --enable-recovery."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402


def run(env, ck):
    stub = os.path.join(env.bin, "..", "test", "mpi", "shardfs_mpi_stub_check")
    for argv, what in (
            (["--mpi", "--commit-timeout", "0", "a", "b"], "commit timeout 0"),
            (["--mpi", "--commit-timeout", "x", "a", "b"], "commit timeout x"),
            (["--mpi", "--peer-timeout", "-3", "a", "b"], "peer timeout -3"),
            (["--mpi", "--peer-timeout", "86401", "a", "b"], "peer timeout 86401")):
        r = subprocess.run([env.shardfs] + argv, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        ck.eq(r.returncode, 2, "usage error for %s (%s)" % (
            what, r.stderr.decode(errors="replace").strip()))
    if ck.ok(os.access(stub, os.X_OK), "stub-linked shardfs built at %s" % stub):
        r = subprocess.run([stub, "--mpi", env.path("s%r"), env.path("m%r")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30)
        err = r.stderr.decode(errors="replace")
        ck.eq(r.returncode, 2, "stub: --mpi exits 2 (%s)" % err.strip())
        ck.ok("built without MPI" in err, "stub: the message says why: %r" % err)

    # %% and several %r: STORE "p%%q-%r-store%r", MOUNTPOINT via Cluster
    full = env.path("full")
    ref = env.gen(os.path.join(full, "ck"), layout="fsdp", ranks=4, size="1M",
                  dtype="F32", block_size="64K", seed=7)
    pattern = env.path("p%%q-%r-store%r")   # what shardfs is given
    sfmpi.split_store(os.path.join(full, "ck"), env.path("p%q-%r-store%r"))
    for r in range(sfmpi.NRANKS):
        want = env.path("p%%q-%d-store%d" % (r, r))
        ck.ok(os.path.isdir(os.path.join(want, "ck")), "store %s made" % want)
    c = sfmpi.Cluster(env, pattern, name="cli")
    c.mnt_pattern = env.path("mnt%%x-%r-%r")
    c.mnt = lambda r: env.path("mnt%%x-%d-%d" % (r, r))
    with c:
        for r in range(sfmpi.NRANKS):
            ck.ok(sm.is_mounted(c.mnt(r)), "rank %d mounted at %s" % (r, c.mnt(r)))
            name = sorted(ref.tensors)[r % len(ref.tensors)]
            ck.bytes_eq(sm.read_file(sm.tensor_path(os.path.join(c.mnt(r), "ck"),
                                                    name)),
                        ref.tensor_bytes(name), "rank %d: tensors/%s" % (r, name))
    # mpirun without --enable-recovery: rank 0 (only) says the job would end
    # with any daemon's death, and how to start it instead
    warn = [ln for ln in c.log_text().splitlines()
            if "started without --enable-recovery" in ln]
    ck.eq(len(warn), 1, "one warning about --enable-recovery: %r" % warn)
    ck.ok(all(ln.startswith("[rank 0] ") for ln in warn),
          "the warning comes from rank 0")


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
