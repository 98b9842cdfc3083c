#!/usr/bin/python3
"""test_fuse_ceiling.py - functional test of the benchmark's fuse_ceiling.

Usage: test_fuse_ceiling.py PATH_TO_FUSE_CEILING

Checks that bad LISTFILEs are refused with the line named, then mounts
fuse_ceiling on a temporary directory with three files of odd sizes (0, 1
and 3 MiB + 7 bytes) and checks that `ls -ln` shows them with those sizes,
that a full read of each returns exactly SIZE bytes of the documented
pattern (the byte at offset o is o % 251), and that a pread at an odd
offset does too. Times nothing. Always unmounts (fusermount3 -u, umount -l
as a last resort) and reaps the daemon; fails if it exits non-zero.
Exit 77 (skipped) when /dev/fuse or fusermount3 is missing.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
MOUNT_WAIT_S = 10.0
EXIT_WAIT_S = 10.0
FILES = [("empty", 0), ("one", 1), ("three_mib_7", (3 << 20) + 7)]
PERIOD = bytes(i % 251 for i in range(251))


def pattern(off, n):
    """Bytes [off, off+n) of the pattern."""
    start = off % 251
    reps = (start + n) // 251 + 1
    return (PERIOD * reps)[start:start + n]


def mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # octal escapes of spaces etc. do not occur in our temp paths
            if fields[4] == mnt and " - fuse" in line:
                return True
    return False


def check_bad_lists(tool, tmp):
    """Each bad LISTFILE: exit 1 with the file and line number named. The
    mountpoint does not exist, so nothing is mounted even if one passed."""
    nomnt = os.path.join(tmp, "no-such-dir")
    bad = {
        "slash": "5 ok\n7 a/b\n",
        "size": "5 ok\nx12 name\n",
        "nosep": "5 ok\n12\n",
        "dot": "5 ok\n3 ..\n",
        "long": "5 ok\n1 " + "n" * 600 + "\n",
        "ctrl": "5 ok\n4 cr\r\n",
    }
    fails = 0
    for what, text in bad.items():
        path = os.path.join(tmp, "bad-" + what)
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run([tool, "-f", path, nomnt], capture_output=True,
                           text=True, timeout=10)
        if r.returncode != 1 or (path + ":2:") not in r.stderr:
            print("FAIL: bad list %s: exit %d, stderr %r"
                  % (what, r.returncode, r.stderr))
            fails += 1
    path = os.path.join(tmp, "bad-dup")
    with open(path, "w") as f:
        f.write("5 same\n6 same\n")
    r = subprocess.run([tool, "-f", path, nomnt], capture_output=True,
                       text=True, timeout=10)
    if r.returncode != 1 or "listed twice" not in r.stderr:
        print("FAIL: duplicate names: exit %d, stderr %r"
              % (r.returncode, r.stderr))
        fails += 1
    return fails


def check_mount(mnt):
    fails = 0
    out = subprocess.run(["ls", "-ln", mnt], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    sizes = {}
    for line in out.splitlines()[1:]:          # after "total N"
        fields = line.split()
        sizes[fields[-1]] = int(fields[4])
    want = {name: size for name, size in FILES}
    if sizes != want:
        print("FAIL: ls -ln shows %r, want %r" % (sizes, want))
        fails += 1
    for name, size in FILES:
        path = os.path.join(mnt, name)
        with open(path, "rb", buffering=0) as f:
            chunks = []
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                chunks.append(b)
            data = b"".join(chunks)
            if len(data) != size:
                print("FAIL: %s: read %d bytes, want %d" % (name, len(data), size))
                fails += 1
            elif data != pattern(0, size):
                bad = next(i for i in range(size) if data[i] != i % 251)
                print("FAIL: %s: byte %d is %d, want %d"
                      % (name, bad, data[bad], bad % 251))
                fails += 1
            if size > 12345:
                got = os.pread(f.fileno(), 100000, 12345)
                if got != pattern(12345, 100000):
                    print("FAIL: %s: pread at 12345 is not the pattern" % name)
                    fails += 1
    try:
        open(os.path.join(mnt, "one"), "r+b").close()
        print("FAIL: opening a file for writing succeeded")
        fails += 1
    except OSError:
        pass
    return fails


def stop(mnt, proc):
    """Unmount, reap the daemon; its exit status (None if killed)."""
    if mounted(mnt):
        subprocess.run(["fusermount3", "-u", mnt], timeout=10)
    try:
        rc = proc.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        print("FAIL: daemon did not exit after unmount; killing it")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        rc = None
    if mounted(mnt):
        subprocess.run(["umount", "-l", mnt], timeout=10)
    return rc


def main():
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    tool = sys.argv[1]
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        print("SKIP: needs /dev/fuse and fusermount3")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="sfceil-")
    proc = None
    mnt = os.path.join(tmp, "mnt")
    fails = 0
    try:
        fails += check_bad_lists(tool, tmp)
        os.mkdir(mnt)
        listfile = os.path.join(tmp, "list")
        with open(listfile, "w") as f:
            for name, size in FILES:
                f.write("%d %s\n" % (size, name))
        log = open(os.path.join(tmp, "daemon.log"), "w+")
        proc = subprocess.Popen([tool, "-f", listfile, mnt], stderr=log)
        log.close()
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(tmp, "daemon.log")) as f:
                    print("FAIL: not mounted (daemon %s): %s"
                          % (proc.poll(), f.read()))
                return 1
            time.sleep(0.02)
        fails += check_mount(mnt)
    finally:
        if proc is not None:
            rc = stop(mnt, proc)
            if rc != 0:
                print("FAIL: daemon exit status %s" % rc)
                fails += 1
        shutil.rmtree(tmp, ignore_errors=True)
    print("%s: %d failure%s" % ("FAIL" if fails else "PASS", fails,
                                "" if fails == 1 else "s"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
