#!/usr/bin/python3
"""fuse_reader.py - the reader of bench_fuse.sh's rows: read every file
named on stdin (one path a line) start to end and print "BYTES SECONDS".

  --bs N      bytes per read() into one reused, page-aligned buffer
              (default 1 MiB, as readfiles.py)
  --odirect   open with O_DIRECT (a FUSE mount then sends the reads as
              direct I/O requests, several in flight with async_dio)
  --mmap      map each file (MAP_SHARED, read-only, as numpy and
              safetensors do) and copy it out N bytes at a time

Exit 1 (after reading the rest) if any file fails to read or reads short
of its st_size, naming it on stderr."""

import argparse
import mmap
import os
import sys
import time


def read_file(path, bs, buf, mv, odirect, use_mmap):
    flags = os.O_RDONLY | (os.O_DIRECT if odirect else 0)
    fd = os.open(path, flags)
    try:
        size = os.fstat(fd).st_size
        n = 0
        if use_mmap:
            if size == 0:
                return 0, 0
            with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                while n < size:
                    k = min(bs, size - n)
                    mv[:k] = m[n:n + k]
                    n += k
            return n, size
        while True:
            k = os.readv(fd, [mv])
            if not k:
                break
            n += k
        return n, size
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=1 << 20)
    ap.add_argument("--odirect", action="store_true")
    ap.add_argument("--mmap", action="store_true")
    a = ap.parse_args()
    if a.bs < 4096 or a.bs % 4096:
        ap.error("--bs wants a multiple of 4096")
    paths = [l.rstrip("\n") for l in sys.stdin if l.strip()]
    buf = mmap.mmap(-1, a.bs)  # page-aligned, as O_DIRECT wants
    mv = memoryview(buf)
    total = bad = 0
    t0 = time.perf_counter()
    for p in paths:
        try:
            n, size = read_file(p, a.bs, buf, mv, a.odirect, a.mmap)
        except OSError as e:
            sys.stderr.write("fuse_reader: %s: %s\n" % (p, e))
            bad += 1
            continue
        if n != size:
            sys.stderr.write("fuse_reader: %s: read %d of %d bytes\n" % (p, n, size))
            bad += 1
        total += n
    dt = time.perf_counter() - t0
    print("%d %.6f" % (total, dt))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
