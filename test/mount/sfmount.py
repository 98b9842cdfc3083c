"""sfmount - harness for the mount-level tests of shardfs.

Role: start a real shardfs daemon in the foreground on a temporary
mountpoint, wait (bounded) until the kernel shows the mount, and in teardown
always unmount (fusermount3 -u, then umount -l as a last resort), stop the
daemon (SIGTERM, then SIGKILL) and fail the test if the daemon crashed (died
by a signal we did not send, exited non-zero, or left sanitizer reports in
its log). Also: generating checkpoints with `shardctl gen --ref`, loading
the unsharded reference, a soft-assertion checker so one run reports
every mismatch instead of stopping at the first, a deliberate kill -9 of
the daemon (Mount.kill9) that teardown does not count as a crash, and the
helpers several tests share: random slice paths, random arrays, and the
Reference of a checkpoint written through the mount with the full
read-back check of it (check_written).

Invariants: every mount started through Mount is unmounted and its daemon
reaped before the test process exits (context manager + atexit); every
temporary directory lives under /tmp/sfmount-* and is removed at exit unless
--keep is given. Standard library + numpy only (run with /usr/bin/python3).
"""

import argparse
import atexit
import errno
import hashlib
import json
import mmap
import os
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile

import numpy as np

# tools/shardfs_save.py (the Python writer; stdlib + numpy)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tools"))
import shardfs_save as sfs  # noqa: E402

SKIP = 77
MOUNT_WAIT_S = 20.0     # bound on daemon start-up until the mount appears
EXIT_WAIT_S = 10.0      # bound on daemon exit after unmount
CMD_TIMEOUT_S = 120.0   # bound on one shardctl invocation

# safetensors dtype name -> (itemsize, numpy dtype or None when not native)
DTYPES = {
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, None),
    "F8_E4M3": (1, None), "F8_E5M2": (1, None),
    "I64": (8, "<i8"), "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "|i1"),
    "U64": (8, "<u8"), "U32": (4, "<u4"), "U16": (2, "<u2"), "U8": (1, "|u1"),
    "BOOL": (1, "|b1"),
}
# a plain unsigned type of each itemsize: lets numpy slice any dtype's bytes
UINT_OF_SIZE = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}

_cleanups = []          # callables run at exit, last registered first


def _run_cleanups():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception:  # teardown must go on whatever happens
            traceback.print_exc()


atexit.register(_run_cleanups)


def _on_signal(signum, frame):
    # ctest kills on timeout with SIGTERM/SIGKILL; make SIGTERM unmount.
    _run_cleanups()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _on_signal)


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True,
                    help="directory holding the shardfs and shardctl binaries")
    ap.add_argument("--keep", action="store_true",
                    help="keep temporary directories for inspection")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the random choices (default: time)")
    return ap.parse_args(argv)


class Env:
    """Per-test-process context: binaries, temp dirs, random source."""

    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.shardfs = os.path.join(self.bin, "shardfs")
        self.shardctl = os.path.join(self.bin, "shardctl")
        self.keep = args.keep
        seed = args.seed if args.seed is not None else int(time.time()) % 100000
        print("random seed: %d (rerun with --seed %d)" % (seed, seed))
        self.seed = seed
        self.rng = random.Random(seed)
        self.tmp = tempfile.mkdtemp(prefix="sfmount-", dir="/tmp")
        if self.keep:
            print("keeping temp dir", self.tmp)
        else:
            _cleanups.append(lambda: shutil.rmtree(self.tmp, ignore_errors=True))

    def path(self, *parts):
        p = os.path.join(self.tmp, *parts)
        return p

    def shardctl_run(self, *argv, check=True):
        cmd = [self.shardctl] + [str(a) for a in argv]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=CMD_TIMEOUT_S)
        if check and r.returncode != 0:
            raise RuntimeError("%s failed (rc %d): %s" % (
                " ".join(cmd), r.returncode, r.stderr.decode(errors="replace")))
        return r

    def gen(self, ckpt_dir, layout="mixed", ranks=2, size="2M", dtype=None,
            seed=1, block_size="64K", ref=True, extra=()):
        """Generate a committed checkpoint; return its Ref (or None)."""
        argv = ["gen", "--layout", layout, "--ranks", ranks, "--size", size,
                "--seed", seed, "--block-size", block_size]
        if dtype:
            argv += ["--dtype", dtype]
        refdir = None
        if ref:
            # references live outside any store so they are never scanned
            self._nref = getattr(self, "_nref", 0) + 1
            refdir = self.path("ref%d-%s" % (self._nref, os.path.basename(
                ckpt_dir.rstrip("/"))))
            argv += ["--ref", refdir]
        argv += list(extra)
        argv.append(ckpt_dir)
        t0 = time.monotonic()
        self.shardctl_run(*argv)
        print("generated %s (%s, ranks %s, %s, dtype %s, block %s) in %.1fs" % (
            ckpt_dir, layout, ranks, size, dtype or "default", block_size,
            time.monotonic() - t0))
        return Ref(refdir) if ref else None


def preflight():
    """Exit 77 (skipped) when this machine cannot mount FUSE at all."""
    if not os.path.exists("/dev/fuse"):
        print("SKIP: /dev/fuse is absent")
        sys.exit(SKIP)
    if shutil.which("fusermount3") is None:
        print("SKIP: fusermount3 is not installed")
        sys.exit(SKIP)


def is_mounted(mnt):
    mnt = os.path.abspath(mnt)
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[1] == mnt:
                return True
    return False


def wait_mounted(proc, mnts, timeout_s, poll_s=0.02):
    """Wait until every mountpoint in mnts is mounted: seconds it took, or
    None when proc exited first or timeout_s passed."""
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout_s:
        if all(is_mounted(m) for m in mnts):
            return time.monotonic() - t0
        if proc.poll() is not None:
            break
        time.sleep(poll_s)
    return None


def read_text(path):
    """A log file's text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class DaemonCrash(Exception):
    pass


class Mount:
    """A running shardfs daemon: `with Mount(env, store, opts) as m:`.

    m.mnt is the mountpoint, m.log_text() the daemon's stderr so far.
    Leaving the block unmounts and raises DaemonCrash when the daemon died
    or reported sanitizer errors.
    """

    _count = 0

    def __init__(self, env, store, opts=(), name=None):
        Mount._count += 1
        tag = name or "m%d" % Mount._count
        self.env = env
        self.store = store
        self.opts = list(opts)
        self.mnt = env.path("mnt-" + tag)
        self.logpath = env.path("daemon-%s.log" % tag)
        self.proc = None
        self.mount_s = None
        self.stopped = False
        self.killed = False     # kill9() was called: SIGKILL is no crash

    def __enter__(self):
        if self.proc is None:  # a test may start() first to catch mount errors
            self.start()
        return self

    def __exit__(self, et, ev, tb):
        self.stop(raise_on_crash=(et is None))
        return False

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        cmd = [self.env.shardfs, "-f"] + self.opts + [self.store, self.mnt]
        self.log = open(self.logpath, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        _cleanups.append(self._emergency_stop)
        self.mount_s = wait_mounted(self.proc, [self.mnt], MOUNT_WAIT_S)
        if self.mount_s is not None:
            return
        self.stop(raise_on_crash=False)
        raise RuntimeError("daemon did not mount %s within %.0fs (rc %s): %s" % (
            self.mnt, MOUNT_WAIT_S, self.proc.returncode, self.log_text()[-2000:]))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None and is_mounted(self.mnt)

    def log_text(self):
        return read_text(self.logpath)

    def kill9(self):
        """kill -9 the daemon on purpose (a crash test). stop() still
        cleans up the dead mount and still reports sanitizer reports and any
        other problem, but not the death by our SIGKILL."""
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_lines(self):
        return self.log_text().splitlines()

    def _emergency_stop(self):
        if not self.stopped:
            self.stop(raise_on_crash=False)

    def stop(self, raise_on_crash=True):
        if self.stopped:
            return
        self.stopped = True
        problems = []
        was_alive = self.proc.poll() is None
        if not was_alive and not self.killed:
            problems.append("daemon was already dead before unmount (rc %s)"
                            % self.proc.returncode)
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        killed = False
        try:
            self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            problems.append("daemon did not exit within %.0fs of unmount"
                            % EXIT_WAIT_S)
            self.proc.send_signal(signal.SIGTERM)
            killed = True
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if is_mounted(self.mnt):
            problems.append("mount still present after daemon exit")
            subprocess.run(["umount", "-l", self.mnt], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.log.close()
        rc = self.proc.returncode
        if not killed and rc != 0 and not (self.killed and rc == -signal.SIGKILL):
            if rc < 0:
                problems.append("daemon died by signal %d" % -rc)
            else:
                problems.append("daemon exited with status %d" % rc)
        log = self.log_text()
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                       "ThreadSanitizer"):
            if marker in log:
                problems.append("sanitizer report (%s) in daemon log" % marker)
        try:
            os.rmdir(self.mnt)
        except OSError:
            pass
        if problems:
            msg = "%s: %s\n--- daemon log tail (%s) ---\n%s" % (
                self.mnt, "; ".join(problems), self.logpath, log[-4000:])
            if raise_on_crash:
                raise DaemonCrash(msg)
            print("WARNING:", msg)

    def rss_peak_kb(self):
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None


    def open_fds(self):
        """How many file descriptors the daemon holds now (None if gone)."""
        try:
            return len(os.listdir("/proc/%d/fd" % self.proc.pid))
        except OSError:
            return None

    def deleted_fds(self):
        """Targets of the daemon's descriptors on deleted files (their
        space is not freed while they are open); None if it is gone."""
        fddir = "/proc/%d/fd" % self.proc.pid
        out = []
        try:
            fds = os.listdir(fddir)
        except OSError:
            return None
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fddir, fd))
            except OSError:
                continue
            if target.endswith(" (deleted)"):
                out.append(target)
        return out

    def sanitized(self):
        """Whether the daemon runs with AddressSanitizer (libasan mapped)."""
        try:
            with open("/proc/%d/maps" % self.proc.pid) as f:
                return "libasan" in f.read()
        except OSError:
            return False


class Ref:
    """The unsharded reference written by `shardctl gen --ref DIR`."""

    def __init__(self, refdir):
        self.dir = refdir
        with open(os.path.join(refdir, "index.json")) as f:
            self.index = json.load(f)
        self.name = self.index.get("name")
        self.tensors = self.index["tensors"]          # NAME -> {dtype, shape}
        self.files = self.index.get("files", {})      # NAME -> {size}
        self._cache = {}

    def tensor_bytes(self, name):
        b = self._cache.get(name)
        if b is None:
            with open(os.path.join(self.dir, "tensors", name), "rb") as f:
                b = f.read()
            self._cache[name] = b
        return b

    def file_bytes(self, name):
        with open(os.path.join(self.dir, "files", name), "rb") as f:
            return f.read()

    def itemsize(self, name):
        return DTYPES[self.tensors[name]["dtype"]][0]

    def nbytes(self, name):
        t = self.tensors[name]
        n = DTYPES[t["dtype"]][0]
        for d in t["shape"]:
            n *= d
        return n

    def array(self, name):
        """The tensor as a numpy array of an unsigned type of its itemsize
        (bit-exact for every dtype, BF16 and F8 included)."""
        t = self.tensors[name]
        a = np.frombuffer(self.tensor_bytes(name),
                          dtype=UINT_OF_SIZE[self.itemsize(name)])
        return a.reshape(tuple(t["shape"]))


class Checker:
    """Soft assertions: record every failure, report them all at the end."""

    def __init__(self, quiet=False):
        self.failures = []
        self.passed = 0
        self.quiet = quiet      # do not print failures as they happen

    def _fail(self, msg):
        self.failures.append(msg)
        if not self.quiet:
            print("FAIL:", msg)

    def ok(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self._fail(msg)
        return bool(cond)

    def eq(self, got, want, msg):
        if got == want:
            self.passed += 1
            return True
        g, w = repr(got), repr(want)
        self._fail("%s: got %s, want %s" % (msg, g[:300], w[:300]))
        return False

    def bytes_eq(self, got, want, msg):
        if got == want:
            self.passed += 1
            return True
        if len(got) != len(want):
            detail = "length %d, want %d" % (len(got), len(want))
        else:
            first = next(i for i in range(len(got)) if got[i] != want[i])
            ndiff = sum(1 for i in range(len(got)) if got[i] != want[i]) \
                if len(got) < (1 << 20) else -1
            detail = "first difference at byte %d (%d bytes differ)" % (first, ndiff)
        self._fail("%s: %s" % (msg, detail))
        return False

    def raises(self, errnos, fn, msg):
        """fn() must fail with OSError whose errno is in errnos."""
        if isinstance(errnos, int):
            errnos = (errnos,)
        try:
            r = fn()
        except OSError as e:
            if e.errno in errnos:
                self.passed += 1
                return True
            failure = ("%s: failed with %s, want %s" % (
                msg, errno.errorcode.get(e.errno, e.errno),
                "/".join(errno.errorcode[x] for x in errnos)))
        else:
            failure = ("%s: succeeded (returned %r), want %s" % (
                msg, r if not isinstance(r, bytes) else "%d bytes" % len(r),
                "/".join(errno.errorcode[x] for x in errnos)))
        self._fail(failure)
        return False


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def mmap_bytes(path, off=0, length=None):
    """Bytes [off, off + length) of path (to its end without length) read
    through a shared read-only mapping of the whole file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        with mmap.mmap(f.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            end = size if length is None else min(size, off + length)
            return m[off:end]


def write_commit_tensor(env, ck, mnt, label):
    """Write a F32 [300, 257] tensor x into a new checkpoint MNT/w in
    64 KiB pwrites through the mount and commit it with shardctl (the
    commit's success checked, label in the message); returns the tensor's
    path and the bytes written, for the caller to read back its way."""
    root = os.path.join(mnt, "w")
    os.makedirs(os.path.join(root, "tensors"), exist_ok=True)
    data = np.arange(300 * 257, dtype=np.float32).reshape(300, 257)
    p = tensor_path(root, "x")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.setxattr(p, "user.shardfs.dtype", b"F32")
        os.setxattr(p, "user.shardfs.shape", b"[300,257]")
        raw = data.tobytes()
        for off in range(0, len(raw), 65536):
            os.pwrite(fd, raw[off:off + 65536], off)
    finally:
        os.close(fd)
    r = env.shardctl_run("commit", root, check=False)
    ck.eq(r.returncode, 0, "%s: %s" % (label, r.stderr.decode()[-300:]))
    return p, raw


def index_then_verify(env, ck, d, label):
    """`shardctl index D` (its success checked, label in the message), then
    `shardctl verify D`: verify's exit status and its output."""
    r = env.shardctl_run("index", d, check=False)
    ck.eq(r.returncode, 0, "%s: shardctl index: %r" % (label, r.stderr[-500:]))
    r = env.shardctl_run("verify", d, check=False)
    return r.returncode, r.stdout.decode(errors="replace")


def pread_all(path, off, length):
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while length > 0:
            b = os.pread(fd, length, off)
            if not b:
                break
            out += b
            off += len(b)
            length -= len(b)
        return bytes(out)
    finally:
        os.close(fd)


def errname(e):
    return errno.errorcode.get(e, str(e))


def main(test_fn, argv=None):
    """Run test_fn(env, checker) with the shared set-up and reporting.

    Exit 0 when every check passed, 1 on any failure or crash, 77 when the
    machine has no FUSE."""
    preflight()
    args = parse_args(argv)
    env = Env(args)
    for tool in (env.shardfs, env.shardctl):
        if not os.access(tool, os.X_OK):
            print("FAIL: %s is not built" % tool)
            return 1
    ck = Checker()
    t0 = time.monotonic()
    status = 0
    try:
        test_fn(env, ck)
    except Exception:
        traceback.print_exc()
        ck.failures.append("exception: %s" % sys.exc_info()[1])
    _run_cleanups()
    # no mount of ours may survive the test
    with open("/proc/mounts") as f:
        leftover = [l for l in f if env.tmp in l]
    if leftover:
        ck.failures.append("mounts left behind: %s" % leftover)
    dt = time.monotonic() - t0
    if ck.failures:
        print("\n%d check(s) FAILED, %d passed (%.1fs):" % (
            len(ck.failures), ck.passed, dt))
        for f in ck.failures[:200]:
            print("  -", f)
        status = 1
    else:
        if ck.passed == 0:
            print("FAIL: no checks ran")
            return 1
        print("\nall %d checks passed (%.1fs)" % (ck.passed, dt))
    return status



# --- acting as another local user, running helper scripts ---

NOBODY = 65534


def as_nobody(ops):
    """Run ops (userops.py: [op, args...] each) as uid/gid 65534 through
    setpriv; their results, in order ({"ok": ...} or {"errno": NAME})."""
    r = subprocess.run(
        ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
         "--clear-groups", "/usr/bin/python3",
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "userops.py")],
        input=json.dumps(ops).encode(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("userops failed: %s" % r.stderr.decode(errors="replace"))
    res = json.loads(r.stdout)
    assert len(res) == len(ops)
    return res


def run_cmd(argv, timeout=300):
    """Run argv; (returncode, stdout, stderr) as text."""
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), \
        r.stderr.decode(errors="replace")

# --- paths inside a mounted checkpoint (SPEC section 3) ---

def tensor_path(root, name, spec=None):
    """root/tensors/NAME or its slice root/tensors/NAME@SPEC."""
    p = os.path.join(root, "tensors", name)
    return p if spec is None else p + "@" + spec


def npy_path(root, name):
    return os.path.join(root, "npy", name + ".npy")


def manifest_of(ckpt_dir):
    with open(os.path.join(ckpt_dir, "manifest.json")) as f:
        return json.load(f)


def shard_positions(shape, itemsize, shard):
    """Tensor byte offsets of each payload byte of one shard, in payload
    order (numpy int64 array). Small tensors only: it materialises them."""
    nbytes = itemsize
    for d in shape:
        nbytes *= d
    if "flat" in shard:
        off, ln = shard["flat"]
        return np.arange(off, off + ln, dtype=np.int64)
    idx = np.arange(nbytes, dtype=np.int64).reshape(tuple(shape) + (itemsize,))
    sl = tuple(slice(o, o + l) for o, l in zip(shard["offsets"], shard["lengths"]))
    return idx[sl].reshape(-1)


def store_snapshot(top):
    """Everything a change to a store could touch, as a comparable dict:
    {relative path: (kind, mode, size, mtime_ns, sha256 or link target)}
    for every directory, file and symlink under top (top itself too)."""
    out = {}
    for dirpath, dns, fns in os.walk(top):
        dns.sort()
        paths = [os.path.join(dirpath, n) for n in sorted(dns + fns)]
        if dirpath == top:
            paths.insert(0, top)
        for p in paths:
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                what = h.hexdigest()
            else:
                what = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                        st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
                        st.st_mtime_ns, what)
    return out


def snapshot_diff(before, after):
    """Human-readable differences between two store_snapshot()s."""
    out = []
    for k in sorted(set(before) | set(after)):
        if k not in after:
            out.append("removed: %s" % k)
        elif k not in before:
            out.append("added: %s" % k)
        elif before[k] != after[k]:
            out.append("changed: %s %r -> %r" % (k, before[k], after[k]))
    return out


def format_slice(box):
    """[(start, stop) or None, ...] -> "S:E,:,..." (None is ':')."""
    return ",".join(":" if b is None else "%s:%s" % b for b in box)


_CHILD_READ = r"""
import hashlib, sys
try:
    with open(sys.argv[1], "rb") as f:
        print("ok", hashlib.sha256(f.read()).hexdigest())
except OSError as e:
    print("errno", e.errno)
"""


def read_in_child(path, timeout_s=10):
    """Read a whole file in a child process that is killed after timeout_s,
    so a hung FUSE request cannot hang the test. Returns ("ok", sha256 hex),
    ("errno", N) or ("timeout", None)."""
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD_READ, path],
                           stdout=subprocess.PIPE, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ("timeout", None)
    kind, _, val = r.stdout.decode().strip().partition(" ")
    return (kind, int(val) if kind == "errno" else val)


def rewrite_pickle(path, old, new):
    """A torch.save archive written again (Python's zipfile, stored) with
    old replaced by new in its data.pkl: a hostile variant of a real file
    (test_deepspeed.py, test_dtensor.py)."""
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_STORED) as z:
        for name, data in items:
            if name.endswith("/data.pkl"):
                assert old in data
                data = data.replace(old, new)
            z.writestr(name, data)
    os.replace(path + ".tmp", path)


def classify(man, ref, name, bad_shard):
    """How a tensor depends on damaged shards (bad_shard(shard) -> bool):
    "clean" (no damaged shard), "broken" (the undamaged shards cannot
    cover it, so reading it all must fail), or "either" (an undamaged
    replica covers it: the daemon may serve it or fail)."""
    shards = man["tensors"][name]["shards"]
    if not any(bad_shard(s) for s in shards):
        return "clean"
    t = ref.tensors[name]
    cover = np.zeros(ref.nbytes(name), dtype=bool)
    for s in shards:
        if not bad_shard(s):
            cover[shard_positions(t["shape"], ref.itemsize(name), s)] = True
    return "either" if cover.all() else "broken"


# --- random slices, written checkpoints (shared by several tests) ---

def random_dim(rng, n):
    """One dimension's slice text and the python slice it means."""
    k = rng.random()
    if k < 0.2:
        return ":", slice(None)
    s = rng.randrange(0, n + 1)
    if k < 0.3:
        return "%d:%d" % (s, s), slice(s, s)            # empty
    e = rng.randrange(s, n + 1)
    if k < 0.4:
        return "%d:" % s, slice(s, None)                 # open stop
    if k < 0.5:
        return ":%d" % e, slice(None, e)                 # open start
    return "%d:%d" % (s, e), slice(s, e)


def random_array(rng, shape, dtype):
    """Random values of a numpy dtype, from a numpy Generator (bit patterns for BF16 / F8 as ints)."""
    n = int(np.prod(shape)) if shape else 1
    raw = np.frombuffer(rng.bytes(n * np.dtype(dtype).itemsize), dtype=np.uint8)
    if np.dtype(dtype).kind == "f":   # no NaNs: keep comparisons simple
        return rng.standard_normal(n).astype(dtype).reshape(shape)
    if np.dtype(dtype) == np.bool_:
        return (raw & 1).astype(np.bool_).reshape(shape)
    return raw.view(dtype).reshape(shape).copy()


class Reference:
    """The expected contents of a checkpoint written through the mount:
    NAME -> (dtype, shape, bytes), and root files NAME -> bytes."""

    def __init__(self):
        self.tensors = {}
        self.files = {}

    def add(self, name, dtype, data):
        dt, shape, buf = sfs.as_bytes(data, dtype)
        self.tensors[name] = (dt, list(shape), bytes(buf))
        return data

    def array(self, name):
        """Bit-exact view as an unsigned type of the itemsize."""
        dt, shape, buf = self.tensors[name]
        u = UINT_OF_SIZE[DTYPES[dt][0]]
        return np.frombuffer(buf, dtype=u).reshape(tuple(shape))


def parse_safetensors(buf):
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    return header, 8 + n


def check_written(rng, ck, root, ref, label):
    """Every byte of a committed checkpoint written through the mount against
    its Reference: state, tensors/ listing, every tensor with its size and
    dtype/shape xattrs, random slices (rng: a random.Random), npy/,
    model.safetensors and root files."""
    ck.eq(os.getxattr(root, "user.shardfs.state"), b"committed", "%s: state" % label)
    names = sorted(ref.tensors)
    listed = []
    for dirpath, _, fnames in os.walk(os.path.join(root, "tensors")):
        rel = os.path.relpath(dirpath, os.path.join(root, "tensors"))
        listed += [f if rel == "." else os.path.join(rel, f) for f in fnames]
    ck.eq(sorted(listed), names, "%s: tensors/ listing" % label)
    for name in names:
        dt, shape, want = ref.tensors[name]
        p = tensor_path(root, name)
        try:
            ck.bytes_eq(read_file(p), want, "%s: tensors/%s" % (label, name))
            ck.eq(os.stat(p).st_size, len(want), "%s: size of %s" % (label, name))
            ck.eq(os.getxattr(p, "user.shardfs.dtype").decode(), dt, "%s: dtype of %s" % (label, name))
            ck.eq(json.loads(os.getxattr(p, "user.shardfs.shape")), shape,
                  "%s: shape of %s" % (label, name))
        except OSError as e:
            ck.ok(False, "%s: tensors/%s: %s" % (label, name, e))
            continue
        # random slices vs numpy
        arr = ref.array(name)
        for _ in range(3 if shape else 0):
            box = []
            for d in shape:
                lo = rng.randrange(d)
                box.append((lo, rng.randrange(lo + 1, d + 1)))
            spec = format_slice(box)
            want_sl = arr[tuple(slice(a, b) for a, b in box)].tobytes()
            try:
                ck.bytes_eq(read_file(tensor_path(root, name, spec)), want_sl,
                            "%s: slice %s@%s" % (label, name, spec))
            except OSError as e:
                ck.ok(False, "%s: slice %s@%s: %s" % (label, name, spec, e))
        # npy/ for numpy-native dtypes
        if DTYPES[dt][1] is not None:
            try:
                got = np.load(npy_path(root, name))
                ck.ok(got.dtype == np.dtype(DTYPES[dt][1]) and list(got.shape) == shape
                      and got.tobytes() == want, "%s: npy/%s.npy" % (label, name))
            except (OSError, ValueError) as e:
                ck.ok(False, "%s: npy/%s.npy: %s" % (label, name, e))
    # model.safetensors, parsed by hand
    try:
        buf = read_file(os.path.join(root, "model.safetensors"))
        header, base = parse_safetensors(buf)
        ck.eq(sorted(header), names, "%s: model.safetensors names" % label)
        for name in names:
            e = header.get(name)
            if e is None:
                continue
            dt, shape, want = ref.tensors[name]
            ck.eq((e["dtype"], e["shape"]), (dt, shape), "%s: safetensors %s header" % (label, name))
            b, end = e["data_offsets"]
            ck.bytes_eq(buf[base + b:base + end], want, "%s: safetensors %s bytes" % (label, name))
    except (OSError, ValueError, KeyError) as e:
        ck.ok(False, "%s: model.safetensors: %s" % (label, e))
    for fname, want in sorted(ref.files.items()):
        try:
            ck.bytes_eq(read_file(os.path.join(root, fname)), want, "%s: %s" % (label, fname))
        except OSError as e:
            ck.ok(False, "%s: root file %s: %s" % (label, fname, e))
