"""sfmpi - harness for the 4-daemon tests of `shardfs --mpi`.

Role: start `mpirun -np N shardfs --mpi STORE%r MNT%r` on one machine
(each daemon with its own store and mountpoint), wait (bounded) until every
rank's mount is up, and in teardown always unmount every mount (fusermount3
-u, then umount -l as a last resort), reap mpirun (SIGTERM to its process
group, then SIGKILL) and fail the test if a daemon crashed: mpirun exited
non-zero, or the log holds a sanitizer report or a signal death.

Invariants: every Cluster is stopped before the test process exits (context
manager + the sfmount cleanup list, which also runs on SIGTERM from ctest);
temporary directories are sfmount's (/tmp/sfmount-*). Reuses sfmount.py
(test/mount) for the environment, the reference, the checker and the
helpers; standard library + numpy only (run with /usr/bin/python3).
"""

import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "mount"))
import sfmount as sm  # noqa: E402

NRANKS = 4
MOUNT_WAIT_S = 60.0     # bound on MPI start-up until every mount is up
EXIT_WAIT_S = 30.0      # bound on all daemons leaving after the unmounts

MPIRUN_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1",
              "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              # several ranks share a small machine: do not spin for
              # progress at full speed, and no hwloc warnings
              "OMPI_MCA_mpi_yield_when_idle": "1",
              "OMPI_MCA_hwloc_base_binding_policy": "none"}


def preflight():
    """sfmount's FUSE checks, plus mpirun; exit 77 (skipped) without."""
    sm.preflight()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun is not installed")
        sys.exit(sm.SKIP)


def mpirun_cmd(nranks):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe",
            "--bind-to", "none", "--mca", "btl", "self,vader",
            "-np", str(nranks)]


def expand(pattern, rank):
    return pattern.replace("%r", str(rank))


class Cluster:
    """`with Cluster(env, "/tmp/.../store%r", opts) as c:` runs NRANKS
    daemons; c.mnt(r) is rank r's mountpoint, c.log_text() the merged log
    (stdout and stderr of mpirun and every rank)."""

    _count = 0

    def __init__(self, env, store_pattern, opts=(), nranks=NRANKS, name=None,
                 mpirun_opts=()):
        Cluster._count += 1
        self.tag = name or "c%d" % Cluster._count
        self.env = env
        self.nranks = nranks
        self.store_pattern = store_pattern
        self.mnt_pattern = env.path("mnt-%s-%%r" % self.tag)
        self.opts = list(opts)
        self.mpirun_opts = list(mpirun_opts)
        self.logpath = env.path("mpirun-%s.log" % self.tag)
        self.proc = None
        self.stopped = False
        self.start_s = None

    def mnt(self, rank):
        return expand(self.mnt_pattern, rank)

    def store(self, rank):
        return expand(self.store_pattern, rank)

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, et, ev, tb):
        self.stop(raise_on_crash=(et is None))
        return False

    def start(self):
        for r in range(self.nranks):
            os.makedirs(self.mnt(r), exist_ok=True)
        cmd = mpirun_cmd(self.nranks)[:1] + self.mpirun_opts + \
            mpirun_cmd(self.nranks)[1:] + [self.env.shardfs, "--mpi"] + \
            self.opts + [self.store_pattern, self.mnt_pattern]
        envv = dict(os.environ)
        envv.update(MPIRUN_ENV)
        self.log = open(self.logpath, "wb")
        # its own process group: teardown can signal mpirun and every rank
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL, env=envv,
                                     start_new_session=True)
        sm._cleanups.append(self._emergency_stop)
        self.start_s = sm.wait_mounted(
            self.proc, [self.mnt(r) for r in range(self.nranks)],
            MOUNT_WAIT_S, poll_s=0.05)
        if self.start_s is not None:
            print("cluster %s: %d daemons mounted in %.1fs" % (
                self.tag, self.nranks, self.start_s))
            return
        self.stop(raise_on_crash=False)
        raise RuntimeError("cluster %s did not mount within %.0fs (rc %s): %s" % (
            self.tag, MOUNT_WAIT_S, self.proc.returncode, self.log_text()[-3000:]))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None and \
            all(sm.is_mounted(self.mnt(r)) for r in range(self.nranks))

    def log_text(self):
        return sm.read_text(self.logpath)

    def rank_pid(self, rank):
        """pid of rank's daemon (a child of our mpirun), or None."""
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    argv = f.read().split(b"\0")
                with open("/proc/%s/environ" % d, "rb") as f:
                    envv = f.read().split(b"\0")
            except OSError:
                continue
            if not argv or os.path.basename(argv[0]) != b"shardfs" or \
                    self.mnt_pattern.encode() not in argv:
                continue
            if ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in envv:
                return int(d)
        return None

    def _emergency_stop(self):
        if not self.stopped:
            self.stop(raise_on_crash=False)

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, raise_on_crash=True):
        """Unmount every rank, reap mpirun; raise DaemonCrash on a crash."""
        if self.stopped:
            return
        self.stopped = True
        problems = []
        if self.proc.poll() is not None:
            problems.append("mpirun was already gone before unmount (rc %s)"
                            % self.proc.returncode)
        # a stopped daemon (a test's SIGSTOP) must run to leave
        self._signal_group(signal.SIGCONT)
        for r in range(self.nranks):
            if sm.is_mounted(self.mnt(r)):
                subprocess.run(["fusermount3", "-u", self.mnt(r)], timeout=30,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        killed = False
        try:
            self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            problems.append("daemons did not all leave within %.0fs of unmount"
                            % EXIT_WAIT_S)
            killed = True
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(timeout=10)
        for r in range(self.nranks):
            if sm.is_mounted(self.mnt(r)):
                problems.append("mount %s still present after exit" % self.mnt(r))
                subprocess.run(["umount", "-l", self.mnt(r)], timeout=30,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        self.log.close()
        rc = self.proc.returncode
        if not killed and rc != 0:
            problems.append("mpirun exited with status %s" % rc)
        log = self.log_text()
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                       "ThreadSanitizer", "exited on signal",
                       "Segmentation fault"):
            if marker in log:
                problems.append("%s in the log" % marker)
        for r in range(self.nranks):
            try:
                os.rmdir(self.mnt(r))
            except OSError:
                pass
        if problems:
            msg = "cluster %s: %s\n--- log tail (%s) ---\n%s" % (
                self.tag, "; ".join(problems), self.logpath, log[-4000:])
            if raise_on_crash:
                raise sm.DaemonCrash(msg)
            print("WARNING:", msg)


def split_store(full_ckpt, pattern, nranks=NRANKS, single=False):
    """Copy checkpoint full_ckpt into nranks node-local stores: each gets
    manifest.json, the root files' payloads are wherever the manifest puts
    them, and only its own rank-NNNNN/ directory. With single, STORE%r is
    the checkpoint itself; otherwise STORE%r/NAME."""
    name = os.path.basename(full_ckpt.rstrip("/"))
    for r in range(nranks):
        dst = expand(pattern, r) if single else \
            os.path.join(expand(pattern, r), name)
        os.makedirs(dst, exist_ok=True)
        for ent in os.listdir(full_ckpt):
            src = os.path.join(full_ckpt, ent)
            if ent.startswith("rank-"):
                if ent == "rank-%05d" % r:
                    shutil.copytree(src, os.path.join(dst, ent))
            elif os.path.isdir(src):
                shutil.copytree(src, os.path.join(dst, ent))
            else:
                shutil.copy2(src, os.path.join(dst, ent))


def safetensors_check(ck, data, ref, label):
    """Parse a model.safetensors by hand and compare every tensor with ref."""
    import json
    import struct
    if not ck.ok(len(data) >= 8, "%s: model.safetensors has a header" % label):
        return
    hlen = struct.unpack("<Q", data[:8])[0]
    if not ck.ok(8 + hlen <= len(data), "%s: header length %d fits" % (label, hlen)):
        return
    hdr = json.loads(data[8:8 + hlen])
    hdr.pop("__metadata__", None)
    ck.eq(sorted(hdr), sorted(ref.tensors), "%s: safetensors tensor names" % label)
    base = 8 + hlen
    for name, t in sorted(ref.tensors.items()):
        e = hdr.get(name)
        if e is None:
            continue
        ck.eq((e["dtype"], e["shape"]), (t["dtype"], t["shape"]),
              "%s: safetensors dtype/shape of %s" % (label, name))
        a, b = e["data_offsets"]
        ck.bytes_eq(data[base + a:base + b], ref.tensor_bytes(name),
                    "%s: safetensors bytes of %s" % (label, name))


def random_box(rng, shape):
    """A random box [(start, stop) or None per dim] inside shape."""
    box = []
    for d in shape:
        if d == 0 or rng.random() < 0.25:
            box.append(None)
            continue
        a = rng.randrange(0, d)
        b = rng.randrange(a + 1, d + 1)
        box.append((a, b))
    return box


def box_bytes(ref, name, box):
    arr = ref.array(name)
    sl = tuple(slice(None) if b is None else slice(b[0], b[1]) for b in box)
    return arr[sl].tobytes()


def check_slices(ck, env, root, ref, label, count):
    """count random slices of random tensors vs the reference."""
    names = sorted(n for n in ref.tensors if ref.tensors[n]["shape"])
    for _ in range(count):
        name = env.rng.choice(names)
        box = random_box(env.rng, ref.tensors[name]["shape"])
        spec = sm.format_slice(box)
        try:
            got = sm.read_file(sm.tensor_path(root, name, spec))
        except OSError as e:
            ck.ok(False, "%s: slice %s@%s: %s" % (label, name, spec, e))
            continue
        ck.bytes_eq(got, box_bytes(ref, name, box),
                    "%s: slice %s@%s" % (label, name, spec))


def check_ckpt(ck, env, root, ref, label, nslices=20):
    """Every tensor and root file, random slices and model.safetensors."""
    for name in sorted(ref.tensors):
        try:
            got = sm.read_file(sm.tensor_path(root, name))
        except OSError as e:
            ck.ok(False, "%s: read tensors/%s: %s" % (label, name, e))
            continue
        ck.bytes_eq(got, ref.tensor_bytes(name), "%s: tensors/%s" % (label, name))
    for name in sorted(ref.files):
        try:
            ck.bytes_eq(sm.read_file(os.path.join(root, name)),
                        ref.file_bytes(name), "%s: root file %s" % (label, name))
        except OSError as e:
            ck.ok(False, "%s: read root file %s: %s" % (label, name, e))
    check_slices(ck, env, root, ref, label, nslices)
    try:
        st = sm.read_file(os.path.join(root, "model.safetensors"))
    except OSError as e:
        ck.ok(False, "%s: read model.safetensors: %s" % (label, e))
    else:
        safetensors_check(ck, st, ref, label)


def main(test_fn):
    """sm.main with the MPI preflight."""
    preflight()
    return sm.main(test_fn)
