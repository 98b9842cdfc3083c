#!/usr/bin/python3
"""test_fuse_ceiling.py - functional test of the benchmark's fuse_ceiling.

Usage: test_fuse_ceiling.py PATH_TO_FUSE_CEILING

Checks that bad LISTFILEs and -x options are refused, then mounts
fuse_ceiling on a temporary directory with four files of odd sizes (0, 1,
3 MiB + 7 bytes and 24 MiB) and checks that `ls -ln` shows them with those sizes,
that a full read of each returns exactly SIZE bytes of the documented
pattern (the byte at offset o is o % 251), that a pread at an odd offset
does too, and that mmap(MAP_SHARED) gives the pattern. The same again for
each experiment bench_fuse.sh times (-x): direct_io (whose shared mappings
the kernel refuses with ENODEV unless -x mmap negotiated
FUSE_DIRECT_IO_ALLOW_MMAP), notify_store pushing ahead (the daemon reports
bytes pushed and no failure, and the bytes read are the pattern), bigger
requests, a 2 MiB reply source (also hashing each reply), a read-only mount
without OPEN; replies with the bytes of ranges of one backing file of
random bytes at unaligned offsets (-x file, -x splice, each also hashing:
read and mapped, and a range past the backing's end fails to open with
EIO); and passthrough onto files of random bytes (their bytes, read and
mapped); and -x uring (FUSE over io_uring, root's enable_uring set for it
and put back), granted and serving the pattern. Times nothing. Always unmounts
(fusermount3 -u, umount -l as a last resort) and reaps the daemon; fails
if it exits non-zero. Exit 77 (skipped) when /dev/fuse or fusermount3 is
missing.
"""

import errno
import mmap
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
FILES = [("empty", 0), ("one", 1), ("three_mib_7", (3 << 20) + 7),
         ("big", 24 << 20)]
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
        "offset": "5 ok\n4 name\t/backing\t12x\n",
        "nooffset": "5 ok\n4 name\t/backing\t\n",
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
    for x in ("nosuch", "store=x", "pages=0", "chunk=3", "dio=1", "src=0", "noopen=1", "hash=1",
              "file=1", "splice=1"):
        r = subprocess.run([tool, "-f", "-x", x, path, nomnt], capture_output=True,
                           text=True, timeout=10)
        if r.returncode != 2 or "usage" not in r.stderr:
            print("FAIL: -x %s: exit %d, stderr %r" % (x, r.returncode, r.stderr))
            fails += 1
    for xs in (("file", "noopen"), ("splice", "passthrough"), ("file", "src=2")):
        argv = [tool, "-f"] + [a for x in xs for a in ("-x", x)] + [path, nomnt]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if r.returncode != 2 or "not with" not in r.stderr:
            print("FAIL: -x %s: exit %d, stderr %r"
                  % (" -x ".join(xs), r.returncode, r.stderr))
            fails += 1
    return fails


def mapped(path):
    """The bytes of path through mmap(MAP_SHARED)."""
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            return m[:]


def check_mmap(mnt, refuse):
    """MAP_SHARED of a file: the pattern, or (refuse) ENODEV."""
    name, size = FILES[2]
    try:
        data = mapped(os.path.join(mnt, name))
    except OSError as e:
        if refuse and e.errno == errno.ENODEV:
            return 0
        print("FAIL: mmap of %s: %s" % (name, e))
        return 1
    if refuse:
        print("FAIL: mmap of %s under direct_io without -x mmap worked" % name)
        return 1
    if data != pattern(0, size):
        print("FAIL: mmap of %s is not the pattern" % name)
        return 1
    return 0


def check_backed(mnt, backed):
    """Each file reads and maps as its bytes of its backing file."""
    fails = 0
    for name, data in backed:
        path = os.path.join(mnt, name)
        with open(path, "rb") as f:
            got = f.read()
        if got != data:
            print("FAIL: backed %s: read %d bytes, not the backing file's"
                  % (name, len(got)))
            fails += 1
        if data and mapped(path) != data:
            print("FAIL: backed %s: mapped bytes are not the backing file's"
                  % name)
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


def check_passthrough(tool, tmp, listfile):
    backed = []
    with open(listfile + ".pt", "w") as f:
        for name, size in FILES:
            data = os.urandom(size)
            path = os.path.join(tmp, "backing-" + name)
            with open(path, "wb") as b:
                b.write(data)
            f.write("%d %s\t%s\n" % (size, name, path))
            backed.append((name, data))
    return run_mount(tool, tmp, listfile + ".pt", ["passthrough"], backed)


def check_file_backed(tool, tmp, listfile):
    """-x file and -x splice: every file is a range of one backing file
    of random bytes, at offsets that are not page-aligned; each reads (and
    maps) as those bytes, with and without hashing. Whether libfuse really
    splices depends on fs.pipe-max-size; the bytes must be right either
    way. A file whose range runs past the backing's end fails to open."""
    path = os.path.join(tmp, "backing-all")
    blob = os.urandom(1000 + sum(size for _, size in FILES) + 4096)
    with open(path, "wb") as b:
        b.write(blob)
    backed, off = [], 1000
    with open(listfile + ".file", "w") as f:
        for name, size in FILES:
            f.write("%d %s\t%s\t%d\n" % (size, name, path, off))
            backed.append((name, blob[off:off + size]))
            off += size
        f.write("5000 past-end\t%s\t%d\n" % (path, len(blob) - 4999))
    fails = 0
    for xs in (["file"], ["file", "hash"], ["splice"], ["splice", "hash"]):
        fails += run_mount(tool, tmp, listfile + ".file", xs, backed)
    return fails


def check_uring(tool, tmp, listfile):
    """-x uring: the pattern and backed bytes through FUSE over io_uring,
    with the kernel's enable_uring on for it (put back after)."""
    param = "/sys/module/fuse/parameters/enable_uring"
    if os.geteuid() != 0 or not os.path.exists(param):
        print("uring: skipped: %s" % ("needs root to set " + param if os.path.exists(param)
                                     else "the kernel has no FUSE over io_uring"))
        return 0
    with open(param) as f:
        old = f.read().strip()
    try:
        with open(param, "w") as f:
            f.write("1")
        fails = run_mount(tool, tmp, listfile, ["uring"])
        fails += run_mount(tool, tmp, listfile, ["uring", "noopen"])
    finally:
        with open(param, "w") as f:
            f.write(old)
    return fails


def run_mount(tool, tmp, listfile, xs, backed=None):
    """Mount with -x xs, check it, unmount: the failures."""
    mnt = os.path.join(tmp, "mnt")
    os.makedirs(mnt, exist_ok=True)
    logpath = os.path.join(tmp, "daemon.log")
    argv = [tool, "-f"]
    for x in xs:
        argv += ["-x", x]
    label = " ".join(xs) or "(shardfs's settings)"
    log = open(logpath, "w+")
    proc = subprocess.Popen(argv + [listfile, mnt], stderr=log)
    log.close()
    fails = 0
    try:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(logpath) as f:
                    print("FAIL: %s: not mounted (daemon %s): %s"
                          % (label, proc.poll(), f.read()))
                return 1
            time.sleep(0.02)
        if backed is None:
            fails += check_mount(mnt)
            fails += check_mmap(mnt, refuse="dio" in xs and "mmap" not in xs)
        else:
            fails += check_backed(mnt, backed)
            if "file" in xs or "splice" in xs:
                try:
                    open(os.path.join(mnt, "past-end"), "rb").close()
                    print("FAIL: %s: a file past its backing's end opened" % label)
                    fails += 1
                except OSError as e:
                    if e.errno != errno.EIO:
                        print("FAIL: %s: past-end: %s, want EIO" % (label, e))
                        fails += 1
    finally:
        rc = stop(mnt, proc)
        if rc != 0:
            print("FAIL: %s: daemon exit status %s" % (label, rc))
            fails += 1
    with open(logpath) as f:
        log = f.read()
    if "passthrough" in xs and "passthrough 1" not in log:
        print("FAIL: passthrough was not granted: %s" % log[-500:])
        fails += 1
    if "uring" in xs and "uring 1" not in log:
        print("FAIL: FUSE over io_uring was not granted: %s" % log[-500:])
        fails += 1
    if "mmap" in xs and "direct_io_allow_mmap 1" not in log:
        print("FAIL: FUSE_DIRECT_IO_ALLOW_MMAP was not granted: %s" % log[-500:])
        fails += 1
    if any(x.startswith("store") for x in xs):
        pushed = [l for l in log.splitlines() if "pushed" in l]
        if not pushed or " 0 failed" not in pushed[-1] or pushed[-1].split()[2] == "0":
            print("FAIL: %s: notify_store pushed nothing or failed: %s"
                  % (label, pushed))
            fails += 1
    print("%s: %s" % (label, "ok" if not fails else "%d failures" % fails))
    return fails


def main():
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    tool = sys.argv[1]
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        print("SKIP: needs /dev/fuse and fusermount3")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="sfceil-")
    fails = 0
    try:
        fails += check_bad_lists(tool, tmp)
        listfile = os.path.join(tmp, "list")
        with open(listfile, "w") as f:
            for name, size in FILES:
                f.write("%d %s\n" % (size, name))
        for xs in ([], ["dio"], ["dio", "mmap"], ["store"], ["store=1", "chunk=64"],
                   ["pages=128", "ra=1024"], ["src=2"], ["src=2", "hash"], ["noopen"]):
            fails += run_mount(tool, tmp, listfile, xs)
        fails += check_file_backed(tool, tmp, listfile)
        # passthrough: files of random bytes, each mapped onto its own
        # (registering a backing file takes CAP_SYS_ADMIN)
        if os.geteuid() == 0:
            fails += check_passthrough(tool, tmp, listfile)
        else:
            print("passthrough: skipped: registering backing files needs root")
        fails += check_uring(tool, tmp, listfile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%s: %d failure%s" % ("FAIL" if fails else "PASS", fails,
                                "" if fails == 1 else "s"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
