"""savelib - what the tests of saves through the mount share (test_save.py
here, test/mpi/test_mpi_save.py): a checkpoint's state, ranks of
dcp_save_worker.py started and awaited, the bytes they save, and reads
that return an error's text instead of raising.
Standard library only; torch is imported by expected() alone.
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
WORKER = os.path.join(HERE, "dcp_save_worker.py")
XA_STATE = "user.shardfs.state"


def state(path):
    """user.shardfs.state of path, or "error ENAME"."""
    import errno
    try:
        return os.getxattr(path, XA_STATE).decode()
    except OSError as e:
        return "error %s" % errno.errorcode.get(e.errno, e.errno)


def xattr(path, name):
    """Extended attribute name of path, or the error's text (bytes)."""
    try:
        return os.getxattr(path, name)
    except OSError as e:
        return str(e).encode()


def read(path):
    """The bytes of path, or the error's text (bytes): a failed read
    compares unequal to any expected bytes and says why."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return str(e).encode()


def start_ranks(init, paths, stall=-1, seed=5, big_mib=0, stall_after=False):
    """One torch 1.13 save_state_dict process per path (rank r saves into
    paths[r]), sharing the rendezvous file init; rank stall stops before
    its data (stall_after: right after its data files were written);
    big_mib: a plain tensor of that many MiB besides. The Popen objects,
    stdout piped."""
    n = len(paths)
    env = dict(os.environ, SF_SAVE_BIG_MIB=str(big_mib),
               SF_SAVE_STALL_AFTER="1" if stall_after else "0")
    return [subprocess.Popen(
        [PY, WORKER, "save", str(r), str(n), init, p, str(stall), str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        for r, p in enumerate(paths)]


def wait_ranks(procs, timeout):
    """Wait for every rank (killed past timeout); True when all exited 0,
    the output's tail printed for each that did not."""
    ok = True
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        if p.returncode != 0:
            ok = False
            print(out.decode(errors="replace")[-3000:])
    return ok


def expected(seed=5):
    """{name: bytes} the workers save with seed (BF16 as its raw bits)."""
    sys.path.insert(0, HERE)
    import dcp_save_worker as w
    import torch
    out = {}
    for k, v in w.full_tensors(seed).items():
        if v.dtype == torch.bfloat16:
            v = v.view(torch.int16)
        out[k] = v.contiguous().numpy().tobytes()
    return out


def wait_until(pred, bound, poll_s=0.05):
    """Seconds until pred() held, or None after bound seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        if pred():
            return time.monotonic() - t0
        time.sleep(poll_s)
    return None
