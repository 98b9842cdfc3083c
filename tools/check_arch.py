#!/usr/bin/python3
"""check_arch - the dependency rules of docs/ARCHITECTURE.md, checked.

    tools/check_arch.py SOURCE_DIR [BUILD_DIR]
    tools/check_arch.py --selftest

1. Includes (from the sources): a file in core/ includes only core/
   headers and system headers that are not FUSE, MPI or CUDA; fs/, mpi/
   and gpu/ include core/ headers and their own, never each other's, and
   no header of core/formats/ (rule 5: they never name a format);
   tools/ and test/ may include anything.
2. Units (from the sources): inside each library (core with
   core/formats, fs, mpi, gpu) the units form a tree. A unit is a .c
   file and its .h; a .c with no .h of its own (sf_where.c, sf_cdir.c)
   implements part of the header that declares its functions and joins
   that header's unit when the header has a .c of its own; a header with
   none (sf_fs_internal.h, sf_mpi_int.h) and a library's public face
   (fs/sf_fs.h, mpi/sf_mpi.h, gpu/sf_gpu.h: declared by several files,
   defined by none) are units of their own. Unit A uses unit B when A's
   files name anything B's files define: a function, a variable, a
   typedef, a struct/union/enum with its body, an enum constant, a macro
   or an inline function. What a .c defines static, and its macros and
   types, are its own; a prototype or an extern declaration is not a use,
   nor is a tag the unit declares opaque itself (`struct X;`) and never
   includes the body of; a *_stub.c stands in for its library in another
   build and owns nothing.
   Every cycle is printed, with the names that make each edge.
3. Calls (from the built static libraries, with BUILD_DIR): inside each
   library the object files form a tree: no file calls a file that
   (directly or through others) calls it back. Read from `nm` of
   libshardfs_*.a. Kept beside rule 2 because it is finer where rule 2
   is coarser (the .c files of one unit, sf_model.c and sf_where.c, must
   not call each other back either) and because it sees what the
   compiler really linked; rule 2 sees what nm cannot (types, macros,
   inline functions, and the alternative of a build not configured).
4. Size: no source file of core/, fs/, mpi/, gpu/ or tools/ is longer than
   MAX_LINES lines.

Prints every violation and exits 1 if there is any; 0 otherwise.
Standard library only; the source rules take well under a second.
"""

import os
import re
import subprocess
import sys
from collections import Counter

LIB_DIRS = ["core", "fs", "mpi", "gpu"]
MAX_LINES = 1200
FORBIDDEN_IN_CORE = re.compile(r"^(fuse|mpi|cuda|cuda_runtime|nccl)", re.I)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
# A library's public face: declared here, defined by several of its files.
PUBLIC_FACES = {"fs/sf_fs.h", "mpi/sf_mpi.h", "gpu/sf_gpu.h"}



def source_files(top, d):
    out = []
    for dp, dns, fns in os.walk(os.path.join(top, d)):
        dns[:] = [x for x in dns if x != "tests"]  # a library's tests are tests
        for f in fns:
            if f.endswith((".c", ".h")):
                out.append(os.path.join(dp, f))
    return sorted(out)


def header_homes(top):
    """header file name -> (the library directory that has it, its folder)"""
    homes = {}
    for d in LIB_DIRS:
        for p in source_files(top, d):
            if p.endswith(".h"):
                homes.setdefault(os.path.basename(p),
                                 (d, os.path.relpath(os.path.dirname(p), top)))
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
                home, folder = homes.get(base, (None, None))
                if home == "core" and folder == "core/formats" and d != "core":
                    problems.append("%s includes \"%s\" from core/formats/: %s/ never "
                                    "names a format (rule 5)" % (rel, name, d))
                    continue
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


COMMENT_STR = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
TOKEN = re.compile(r'[A-Za-z_]\w*|->|\.\.\.|[{}()\[\];,=.*]|#')
IDENT = re.compile(r'[A-Za-z_]\w*$')
TAGS = ("struct", "union", "enum")
KEYWORDS = set("""auto break case char const continue default do double else enum
extern float for goto if inline int long register restrict return short signed
sizeof static struct switch typedef union unsigned void volatile while _Bool
_Atomic _Static_assert _Thread_local _Alignas _Alignof _Noreturn _Generic
__attribute__ __extension__ __typeof__ typeof asm __asm__ __inline__ __restrict
bool""".split())


def is_name(t):
    return IDENT.match(t) is not None and t not in KEYWORDS


def strip(text):
    """text without comments (newlines kept), string and character
    literals emptied, continued lines joined"""
    def rep(m):
        s = m.group(0)
        return "\n" * s.count("\n") if s.startswith("/") else '""'
    return COMMENT_STR.sub(rep, text).replace("\\\n", " ")


def match_brace(toks, i):
    """the index after the '}' that closes toks[i] == '{'"""
    d, j = 1, i + 1
    while j < len(toks) and d:
        d += {"{": 1, "}": -1}.get(toks[j], 0)
        j += 1
    return j


def declarator(s):
    """(name, is_prototype) of a file-scope declaration s (tokens, no ';'):
    the last name at bracket depth 0 before any initializer and after any
    struct body; a prototype when '(' follows that name"""
    pre = s[:s.index("=")] if "=" in s else s
    if "{}" in pre:
        pre = pre[len(pre) - pre[::-1].index("{}"):]
    depth, last, proto = 0, None, False
    for k, x in enumerate(pre):
        if x in "([":
            if x == "(" and depth == 0 and last is not None and pre[k - 1] == last:
                proto = True
            depth += 1
        elif x in ")]":
            depth -= 1
        elif depth == 0 and is_name(x):
            last = x
    return last, proto


def scan(text):
    """What one C file defines and names, read from its tokens (no
    preprocessing; every branch of an #if counts).

    -> (defs, uses, declared, opaque):
       defs      {(ns, name): kind}: ns "id" or "tag" (struct/union/enum);
                 kind "macro", "type" (typedefs, tags with a body, enum
                 constants), "static" or "global" (functions, variables)
       uses      Counter of (ns, name) named anywhere, members excepted
       declared  [(ns, name)] the declarators of prototypes and extern
                 declarations (named, not used)
       opaque    {(ns, name)} tags declared without a body (struct X;)
    """
    defs, uses, declared, opaque = {}, Counter(), [], set()
    code = []
    for ln in strip(text).split("\n"):
        s = ln.lstrip()
        if not s.startswith("#"):
            code.append(ln)
            continue
        code.append("")
        m = re.match(r'#\s*define\s+([A-Za-z_]\w*)(.*)', s)
        if m:
            defs[("id", m.group(1))] = "macro"
            s = m.group(2)
        elif re.match(r'#\s*include', s):
            continue
        for t in re.findall(r'[A-Za-z_]\w*', s):
            uses[("id", t)] += 1
    toks = TOKEN.findall("\n".join(code))

    prev = None
    for t in toks:
        if is_name(t) and prev not in (".", "->"):
            uses[("tag" if prev in TAGS else "id", t)] += 1
        prev = t

    stmt, i = [], 0  # the file-scope statement so far; a body is "{}"
    while i < len(toks):
        t = toks[i]
        if t == "{":
            j = match_brace(toks, i)
            body = toks[i + 1:j - 1]
            i = j
            kind = tag = None
            if stmt and stmt[-1] in TAGS:
                kind = stmt[-1]
            elif len(stmt) >= 2 and stmt[-2] in TAGS:
                kind, tag = stmt[-2], stmt[-1]
            if kind is None and stmt and stmt[-1] == ")" and "=" not in stmt:
                # a function body: its name is the first one before a '('
                for k in range(len(stmt) - 1):
                    if stmt[k + 1] == "(" and is_name(stmt[k]):
                        defs[("id", stmt[k])] = "static" if "static" in stmt else "global"
                        break
                stmt = []
                continue
            if tag:
                defs[("tag", tag)] = "type"
            if kind == "enum":
                expect, depth = True, 0
                for b in body:
                    if b in "([{":
                        depth += 1
                    elif b in ")]}":
                        depth -= 1
                    elif depth == 0 and expect and is_name(b):
                        defs[("id", b)] = "type"
                        expect = False
                    elif depth == 0 and b == ",":
                        expect = True
            elif kind:  # tags defined inside a struct or union
                for k in range(len(body) - 2):
                    if body[k] in TAGS and body[k + 2] == "{":
                        defs[("tag", body[k + 1])] = "type"
            stmt.append("{}")
            continue
        if t != ";":
            stmt.append(t)
            i += 1
            continue
        s, stmt = stmt, []
        i += 1
        if not s or s[0] in ("_Static_assert", "static_assert"):
            continue
        if len(s) == 2 and s[0] in TAGS:
            opaque.add(("tag", s[1]))
        elif s[0] == "typedef":
            # typedef T (*name)(...); or typedef T name;
            name = next((s[k + 2] for k in range(len(s) - 2)
                         if s[k] == "(" and s[k + 1] == "*" and is_name(s[k + 2])), None)
            name = name or declarator(s[1:])[0]
            if name:
                defs[("id", name)] = "type"
        else:
            name, proto = declarator(s)
            if name is None:
                continue
            if proto or "extern" in s:
                declared.append(("id", name))
            else:
                defs[("id", name)] = "static" if "static" in s else "global"
    return defs, uses, declared, opaque


def unit_of(top, lib, files):
    """file -> unit name (rule 2 of the docstring)"""
    decls = {}  # header -> names it declares
    defined = {}  # .c -> its external functions and variables
    for p in files:
        with open(p, errors="replace") as f:
            d, _, dc, _ = scan(f.read())
        if p.endswith(".h"):
            decls[p] = set(n for _, n in dc)
        else:
            defined[p] = set(k[1] for k, v in d.items() if v == "global")
    unit = {}
    for p in files:
        rel = os.path.relpath(p, top)
        stem = p[:-2]
        if rel in PUBLIC_FACES:
            unit[p] = rel
            continue
        unit[p] = os.path.relpath(stem, top)
        if p.endswith(".c") and not os.path.exists(stem + ".h") and not stem.endswith("_stub"):
            best, most = None, 0
            for h, names in sorted(decls.items()):
                k = len(names & defined[p])
                if k > most:
                    best, most = h, k
            if best and os.path.exists(best[:-2] + ".c") and \
                    os.path.relpath(best, top) not in PUBLIC_FACES:
                unit[p] = os.path.relpath(best[:-2], top)
    return unit


def tarjan(graph):
    """the strongly connected components of graph {node: {node: ...}}"""
    index, low, stack, on, comps = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def check_units(top, problems):
    for lib in LIB_DIRS:
        files = source_files(top, lib)
        unit = unit_of(top, lib, files)
        defs, uses, opaque, incl = {}, {}, {}, {}
        hdr_owner, c_owner, tag_home = {}, {}, {}
        for p in files:
            u = unit[p]
            with open(p, errors="replace") as f:
                text = f.read()
            d, us, dc, op = scan(text)
            for k in dc:
                us[k] -= 1
            defs.setdefault(u, set()).update(d)
            uses.setdefault(u, set()).update(k for k, c in us.items() if c > 0)
            opaque.setdefault(u, set()).update(op)
            incl.setdefault(u, set()).update(
                os.path.basename(n) for _, n in INCLUDE.findall(text))
            if p.endswith("_stub.c"):
                continue
            for k, kind in d.items():
                if p.endswith(".h"):
                    hdr_owner.setdefault(k, set()).add(u)
                    if k[0] == "tag":
                        tag_home.setdefault(k, set()).add(os.path.basename(p))
                elif kind == "global" or (kind == "type" and k[0] == "tag"):
                    c_owner.setdefault(k, set()).add(u)
        graph = {u: {} for u in defs}
        for u, names in uses.items():
            for k in names:
                if k in defs[u]:
                    continue
                # a tag the unit declares opaque (struct X;) and never
                # includes the body of is a handle it passes, not a use
                if k in opaque[u] and not (tag_home.get(k, set()) & incl[u]):
                    continue
                for o in hdr_owner.get(k) or c_owner.get(k) or ():
                    if o != u:
                        graph[u].setdefault(o, set()).add(k[1])
        for comp in tarjan(graph):
            if len(comp) < 2:
                continue
            sub = {u: set(v for v in graph[u] if v in comp) for u in comp}
            cyc = find_cycle(sub)
            while cyc:
                problems.append("%s: units use each other: %s" % (lib, " ".join(
                    "%s -> (%s)" % (a, ", ".join(sorted(graph[a][b])[:3]))
                    for a, b in zip(cyc, cyc[1:])) + " " + cyc[-1]))
                # report every cycle once: cut the first edge and look again
                sub[cyc[0]].discard(cyc[1])
                cyc = find_cycle(sub)


def check_sizes(top, problems):
    for d in LIB_DIRS + ["tools"]:
        for p in source_files(top, d):
            with open(p, errors="replace") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                problems.append("%s has %d lines (at most %d)" % (
                    os.path.relpath(p, top), n, MAX_LINES))


SELFTEST = {
    # a back-edge only a source check sees: b.h's inline function names
    # a's type, and a.c calls b's function
    "cycle": ({
        "core/a.h": "struct a_thing { int x; };\nint a_fn(void);\n",
        "core/a.c": "#include \"a.h\"\n#include \"b.h\"\nint a_fn(void) { return b_fn(); }\n",
        "core/b.h": "#include \"a.h\"\nstatic inline int b_x(struct a_thing *t) { return t->x; }\nint b_fn(void);\n",
        "core/b.c": "#include \"b.h\"\nint b_fn(void) { return 0; }\n",
    }, ["core: units use each other: core/a -> (b_fn) core/b -> (a_thing) core/a"]),
    # the same through a macro and an enum constant; a static helper of
    # the same name in both is each file's own; a prototype is no use
    "macro": ({
        "core/a.h": "enum a_kind { A_ONE, A_TWO };\nint a_fn(void);\n",
        "core/a.c": "#include \"a.h\"\nstatic int helper(void) { return B_MAX; }\nint a_fn(void) { return helper(); }\n",
        "core/b.h": "#define B_MAX A_TWO\nint a_fn(void);\n",
        "core/b.c": "#include \"b.h\"\nstatic int helper(void) { return 1; }\n",
    }, ["core: units use each other: core/a -> (B_MAX) core/b -> (A_TWO) core/a"]),
    # a tree: b uses a, a is opaque about b's struct; rule 5 on includes
    "tree": ({
        "core/a.h": "struct b_thing;\nint a_fn(struct b_thing *t);\n",
        "core/a.c": "#include \"a.h\"\nint a_fn(struct b_thing *t) { return t != 0; }\n",
        "core/b.h": "struct b_thing { int y; };\n",
        "core/b.c": "#include \"b.h\"\n#include \"a.h\"\nint b_fn(struct b_thing *t) { return a_fn(t); }\n",
        "core/formats/f.h": "int f_fn(void);\n",
        "fs/x.c": "#include \"f.h\"\n#include \"b.h\"\n",
    }, ["fs/x.c includes \"f.h\" from core/formats/: fs/ never names a format (rule 5)"]),
}


def selftest():
    import tempfile
    bad = 0
    for name, (files, want) in sorted(SELFTEST.items()):
        with tempfile.TemporaryDirectory() as top:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(top, rel)), exist_ok=True)
                with open(os.path.join(top, rel), "w") as f:
                    f.write(text)
            got = []
            check_includes(top, got)
            check_units(top, got)
        if got != want:
            print("check_arch selftest %s: got %r, want %r" % (name, got, want))
            bad += 1
    print("check_arch selftest: %d of %d cases as expected" % (len(SELFTEST) - bad, len(SELFTEST)))
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    top = os.path.abspath(sys.argv[1])
    problems = []
    check_includes(top, problems)
    check_units(top, problems)
    check_sizes(top, problems)
    if len(sys.argv) == 3:
        check_calls(os.path.abspath(sys.argv[2]), problems)
    for p in problems:
        print("check_arch:", p)
    if problems:
        print("check_arch: %d problem(s); the rules are in docs/ARCHITECTURE.md" % len(problems))
        return 1
    print("check_arch: includes, units, calls and sizes follow docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
