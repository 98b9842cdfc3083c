#!/usr/bin/python3
"""userops - run file operations as whoever runs this script and report
each outcome, for tests that act as another local user:

    setpriv --reuid=65534 --regid=65534 --clear-groups \\
        /usr/bin/python3 userops.py < ops.json > results.json

Input: a JSON list of operations, each a list [op, args...]:
  read PATH            -> {"ok": sha256 hex of the whole file}
  stat PATH            -> {"ok": [mode, uid, gid, size]}
  listdir PATH         -> {"ok": sorted names}
  mkdir PATH
  create PATH          (O_CREAT|O_WRONLY, then write b"x")
  open_w PATH          (O_WRONLY, then write b"x")
  truncate PATH N
  chmod PATH MODE
  setxattr PATH NAME VALUE
  rename A B
  unlink PATH
  rmdir PATH
  run ARGV...          -> {"ok": returncode, "out": stdout+stderr}
Output: a JSON list of results in order: {"ok": ...} on success, or
{"errno": "EACCES"} when the call failed. Standard library only; every
call is bounded (run: 60 s).
"""

import errno
import hashlib
import json
import os
import subprocess
import sys


def one(op, args):
    if op == "read":
        with open(args[0], "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    if op == "stat":
        st = os.stat(args[0])
        return [st.st_mode, st.st_uid, st.st_gid, st.st_size]
    if op == "listdir":
        return sorted(os.listdir(args[0]))
    if op == "mkdir":
        os.mkdir(args[0])
        return True
    if op in ("create", "open_w"):
        flags = os.O_WRONLY | (os.O_CREAT if op == "create" else 0)
        fd = os.open(args[0], flags, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        return True
    if op == "truncate":
        os.truncate(args[0], int(args[1]))
        return True
    if op == "chmod":
        os.chmod(args[0], int(args[1]))
        return True
    if op == "setxattr":
        os.setxattr(args[0], args[1], args[2].encode())
        return True
    if op == "rename":
        os.rename(args[0], args[1])
        return True
    if op == "unlink":
        os.unlink(args[0])
        return True
    if op == "rmdir":
        os.rmdir(args[0])
        return True
    if op == "run":
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        return {"rc": r.returncode, "out": r.stdout.decode(errors="replace")}
    raise ValueError("unknown op %r" % op)


def main():
    ops = json.load(sys.stdin)
    out = []
    for o in ops:
        try:
            out.append({"ok": one(o[0], o[1:])})
        except OSError as e:
            out.append({"errno": errno.errorcode.get(e.errno, str(e.errno))})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
