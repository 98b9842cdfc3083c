#!/usr/bin/python3
"""MPI: a daemon serving a peer's reads of a framework's file never holds
a lease on it (issue 30, item 7), so a framework re-saving the step on that
node is never delayed nor its O_NONBLOCK open failed with EAGAIN.

Debian's torch 1.13 saves a state dict whose `big` tensor (16 MiB of
float32) lies in one .distcp (dcp_resave.py); that file is put on rank 1's
store only, everything else on rank 0's, all dated a minute back (a daemon
serves only settled files from a mapping). `mpirun -np 2 shardfs --mpi`
with a 1 MiB cache, so every read of tensors/big through rank 0's mount
asks rank 1 for 4 MiB blocks again. For 2 s, while rank 0's mount is read
again and again, another process opens rank 1's .distcp
O_WRONLY|O_NONBLOCK again and again: no open may fail (before this, rank
1 answered reads of 256 KiB and more from a leased mapping, and opens met
EAGAIN while a send was in flight) nor wait 100 ms, and every read gives
the saved bytes.
"""

import errno
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmpi  # noqa: E402
from sfmpi import sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESAVE = os.path.join(HERE, "..", "mount", "dcp_resave.py")
N = 4 << 20
LOOP_S = 2.0


def run(env, ck):
    full = env.path("full", "ck")
    r = subprocess.run(["/usr/bin/python3", RESAVE, full, env.path("side", "ck"), str(N)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if not ck.eq(r.returncode, 0, "dcp_resave.py ran: %s" % r.stderr.decode()[-2000:]):
        return
    files = json.loads(r.stdout)["files"]
    distcp = [f for f in files if f.endswith(".distcp")]
    big = max(distcp, key=lambda f: os.path.getsize(os.path.join(full, f)))
    pattern = env.path("store%r")
    past = time.time() - 60
    for f in files:
        d = os.path.join(sfmpi.expand(pattern, 1 if f == big else 0), "ck")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(full, f), "rb") as src, open(os.path.join(d, f), "wb") as dst:
            dst.write(src.read())
        os.utime(os.path.join(d, f), (past, past))
    target = os.path.join(sfmpi.expand(pattern, 1), "ck", big)
    want = np.arange(N, dtype=np.float32).astype("<f4").tobytes()

    with sfmpi.Cluster(env, pattern, opts=["--cache-mb", "1"], nranks=2, name="lease") as c:
        path = sm.tensor_path(os.path.join(c.mnt(0), "ck"), "big")
        stop = threading.Event()
        res = {"opens": 0, "eagain": 0, "other": [], "slowest": 0.0}

        def writer():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
                except OSError as e:
                    if e.errno == errno.EAGAIN:
                        res["eagain"] += 1
                    else:
                        res["other"].append(sm.errname(e.errno))
                res["slowest"] = max(res["slowest"], time.monotonic() - t0)
                res["opens"] += 1
                time.sleep(0.0005)

        th = threading.Thread(target=writer)
        th.start()
        reads = bad = 0
        t_end = time.monotonic() + LOOP_S
        try:
            while time.monotonic() < t_end or reads < 3:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
                bad += sm.read_file(path) != want
                reads += 1
        finally:
            stop.set()
            th.join()
        print("%d reads of tensors/big via rank 0, %d O_NONBLOCK opens on rank 1's %s: "
              "%d EAGAIN, slowest %.4f s" % (reads, res["opens"], big, res["eagain"],
                                              res["slowest"]))
        ck.eq(bad, 0, "every read of tensors/big gives the saved bytes")
        ck.ok(res["opens"] > 0, "the writer opened the file")
        ck.eq(res["eagain"], 0, "no O_NONBLOCK open for writing fails with EAGAIN")
        ck.eq(res["other"], [], "no open fails otherwise")
        ck.ok(res["slowest"] < 0.1, "no open waits 100 ms (slowest %.4f s)" % res["slowest"])
        ck.ok(c.alive(), "the daemons serve")


if __name__ == "__main__":
    sys.exit(sfmpi.main(run))
