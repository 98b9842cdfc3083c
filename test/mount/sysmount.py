"""sysmount - helpers for tests of shardfs mounted the way a system does it:
by mount(8), mount.fuse3, /etc/fstab, or as a detached daemon.

Role: such daemons are not children of the test (they fork and detach),
so they are found by their command line (/proc/PID/cmdline naming the
mountpoint, /proc/PID/exe a shardfs), checked in /proc/self/mountinfo,
and stopped by their pids. A private mount namespace (unshare -m) lets a
test put a mount helper into /sbin, or a syslog socket at /dev/log,
without changing the system: what is mounted there vanishes with the
namespace.

Detached daemons have no stderr: sanitizer_logs(env) points ASan and
UBSan at files in the test's directory (for every process started from
then on) and sanitizer_reports(env) lists the reports found there.

Invariants: cleanup() unmounts the mountpoint (fusermount3 -u, then
umount -l) and SIGTERMs, then SIGKILLs, every shardfs whose command line
names it, and waits until they are gone; tests register it (sm._cleanups)
before starting anything. Standard library only.
"""

import glob
import os
import signal
import subprocess
import time

import sfmount as sm

WAIT_S = 20.0


def mountinfo(mnt, path="/proc/self/mountinfo"):
    """(per-mount options, fs type, source, super options) of the mount at
    mnt, or None. Octal escapes (\\040) in the mountpoint are undone."""
    mnt = os.path.abspath(mnt)
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 6:
            continue
        point = fields[4].encode().decode("unicode_escape")
        if point != mnt:
            continue
        r = right.split()
        if len(r) < 3:
            continue
        return (fields[5].split(","), r[0], r[1], r[2].split(","))
    return None


def daemon_pids(mnt):
    """Pids of shardfs processes whose command line names mnt."""
    mnt = os.path.abspath(mnt)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            exe = os.readlink("/proc/%s/exe" % d)
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(exe).startswith("shardfs") and \
                mnt.encode() in argv:
            out.append(int(d))
    return out


def wait_gone(pids, timeout_s=WAIT_S):
    """Wait until none of pids exists (zombies count as gone). True if so."""
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout_s:
        alive = []
        for p in pids:
            try:
                with open("/proc/%d/stat" % p) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(p)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def wait_mount(mnt, timeout_s=WAIT_S):
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout_s:
        if sm.is_mounted(mnt):
            return True
        time.sleep(0.05)
    return False


def cleanup(mnt):
    """Unmount mnt and stop every shardfs serving it (see module doc)."""
    if sm.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", mnt], timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = daemon_pids(mnt)
    if pids and not wait_gone(pids, 5):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in daemon_pids(mnt):
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            if wait_gone(daemon_pids(mnt), 5):
                break
    if sm.is_mounted(mnt):
        subprocess.run(["umount", "-l", mnt], timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def guard(mnt):
    """Register cleanup(mnt) to run at the test's exit; returns mnt."""
    sm._cleanups.append(lambda: cleanup(mnt))
    return mnt


def can_unshare():
    """Whether this process may make a private mount namespace."""
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private",
                            "true"], timeout=30, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return r.returncode == 0, r.stderr.decode(errors="replace").strip()


def sanitizer_logs(env):
    """Send sanitizer reports of every process started from now on to
    files env.tmp/sanitizer.* (a detached daemon's stderr is /dev/null)."""
    base = os.path.join(env.tmp, "sanitizer")
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        old = os.environ.get(var, "")
        os.environ[var] = (old + ":" if old else "") + "log_path=" + base


def sanitizer_reports(env):
    """Texts of the sanitizer reports written since sanitizer_logs(env)."""
    out = []
    for p in sorted(glob.glob(os.path.join(env.tmp, "sanitizer.*"))):
        out.append("%s: %s" % (p, sm.read_text(p)[-2000:]))
    return out
