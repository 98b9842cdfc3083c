#!/usr/bin/python3
"""readfiles.py - read every file named on stdin (one path a line) start to
end with 1 MiB reads into one reused buffer; print "BYTES SECONDS".
Exit 1 (after reading the rest) if any file fails to read or reads short of
its st_size, naming it on stderr."""

import os
import sys
import time

BUF = 1 << 20


def main():
    paths = [l.rstrip("\n") for l in sys.stdin if l.strip()]
    buf = bytearray(BUF)
    mv = memoryview(buf)
    total = 0
    bad = 0
    t0 = time.perf_counter()
    for p in paths:
        n = 0
        try:
            with open(p, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                while True:
                    k = f.readinto(mv)
                    if not k:
                        break
                    n += k
        except OSError as e:
            sys.stderr.write("readfiles: %s: %s\n" % (p, e))
            bad += 1
            continue
        if n != size:
            sys.stderr.write("readfiles: %s: read %d of %d bytes\n" % (p, n, size))
            bad += 1
        total += n
    dt = time.perf_counter() - t0
    print("%d %.6f" % (total, dt))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
