#!/usr/bin/python3
"""check_arch - the dependency rules of docs/ARCHITECTURE.md, checked.

    tools/check_arch.py SOURCE_DIR [BUILD_DIR]

1. Includes (from the sources): a file in core/ includes only core/
   headers and system headers that are not FUSE, MPI or CUDA; fs/, mpi/
   and gpu/ include core/ headers and their own, never each other's;
   tools/ and test/ may include anything.
2. Calls (from the built static libraries, with BUILD_DIR): inside each
   library the object files form a tree: no file calls a file that
   (directly or through others) calls it back. Read from `nm` of
   libshardfs_*.a, so it sees what the compiler really linked.
3. Size: no source file of core/, fs/, mpi/, gpu/ or tools/ is longer than
   MAX_LINES lines.

Prints every violation and exits 1 if there is any; 0 otherwise.
Standard library only.
"""

import os
import re
import subprocess
import sys

LIB_DIRS = ["core", "fs", "mpi", "gpu"]
MAX_LINES = 1250
FORBIDDEN_IN_CORE = re.compile(r"^(fuse|mpi|cuda|cuda_runtime|nccl)", re.I)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)


def source_files(top, d):
    out = []
    for dp, dns, fns in os.walk(os.path.join(top, d)):
        dns[:] = [x for x in dns if x != "tests"]  # a library's tests are tests
        for f in fns:
            if f.endswith((".c", ".h")):
                out.append(os.path.join(dp, f))
    return sorted(out)


def header_homes(top):
    """header file name -> the library directory that has it"""
    homes = {}
    for d in LIB_DIRS:
        for p in source_files(top, d):
            if p.endswith(".h"):
                homes.setdefault(os.path.basename(p), d)
    return homes


def check_includes(top, problems):
    homes = header_homes(top)
    for d in LIB_DIRS:
        for p in source_files(top, d):
            with open(p, errors="replace") as f:
                text = f.read()
            for kind, name in INCLUDE.findall(text):
                rel = os.path.relpath(p, top)
                base = os.path.basename(name)
                if kind == "<":
                    if d == "core" and FORBIDDEN_IN_CORE.match(base):
                        problems.append("%s includes <%s>: core/ must not use FUSE, MPI or CUDA"
                                        % (rel, name))
                    continue
                home = homes.get(base)
                if home is None or home == d or home == "core":
                    continue
                problems.append("%s includes \"%s\" from %s/: %s/ may include only core/ and itself"
                                % (rel, name, home, d))


def archive_symbols(lib):
    """member -> (defined set, undefined set) from `nm` of a static lib"""
    r = subprocess.run(["nm", lib], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, check=True)
    members, cur = {}, None
    for line in r.stdout.decode(errors="replace").splitlines():
        if line.endswith(":") and not line.startswith(" "):
            cur = line[:-1]
            members[cur] = (set(), set())
            continue
        parts = line.split()
        if cur is None or len(parts) < 2:
            continue
        kind, sym = parts[-2], parts[-1]
        if kind == "U":
            members[cur][1].add(sym)
        elif kind in "TDBR":
            members[cur][0].add(sym)
    return members


def find_cycle(graph):
    """A list of nodes forming a cycle in graph {node: set(nodes)}, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    stack = []

    def visit(n):
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph[n]):
            if color[m] == GREY:
                return stack[stack.index(m):] + [m]
            if color[m] == WHITE:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE:
            c = visit(n)
            if c:
                return c
    return None


def check_calls(build, problems):
    libs = []
    for dp, _, fns in os.walk(build):
        for f in fns:
            if re.match(r"libshardfs_[a-z0-9_]+\.a$", f):
                libs.append(os.path.join(dp, f))
    if not libs:
        problems.append("no libshardfs_*.a under %s: build first" % build)
        return
    for lib in sorted(libs):
        members = archive_symbols(lib)
        owner = {}
        for m, (defs, _) in members.items():
            for s in defs:
                owner[s] = m
        graph = {m: set() for m in members}
        for m, (_, undef) in members.items():
            for s in undef:
                o = owner.get(s)
                if o and o != m:
                    graph[m].add(o)
        cyc = find_cycle(graph)
        while cyc:
            problems.append("%s: files call each other: %s" % (
                os.path.basename(lib), " -> ".join(x.replace(".c.o", ".c") for x in cyc)))
            # report every cycle once: cut the first edge and look again
            graph[cyc[0]].discard(cyc[1])
            cyc = find_cycle(graph)


def check_sizes(top, problems):
    for d in LIB_DIRS + ["tools"]:
        for p in source_files(top, d):
            with open(p, errors="replace") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                problems.append("%s has %d lines (at most %d)" % (
                    os.path.relpath(p, top), n, MAX_LINES))


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    top = os.path.abspath(sys.argv[1])
    problems = []
    check_includes(top, problems)
    check_sizes(top, problems)
    if len(sys.argv) == 3:
        check_calls(os.path.abspath(sys.argv[2]), problems)
    for p in problems:
        print("check_arch:", p)
    if problems:
        print("check_arch: %d problem(s); the rules are in docs/ARCHITECTURE.md" % len(problems))
        return 1
    print("check_arch: includes, calls and sizes follow docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
