#!/usr/bin/env python3
"""check_docs.py - the docs a newcomer reads hold together.

Usage: check_docs.py REPO_ROOT

Checks README.md and docs/*.md:
  - every relative link [text](target) resolves: the file or directory
    exists in the repository, and a #fragment names a heading of the
    target (GitHub's anchors: lower case, punctuation dropped, spaces to
    hyphens, -1, -2, ... for repeats);
  - README.md stays the front page: under 400 lines, and its first two
    commands are tools/demo.sh and tools/test.sh (what .ci/run runs).
Links to other sites (http:, https:, mailto:) are not followed, and
neither are links inside code blocks or code spans.
Prints one line per problem and exits 1 if there is any, else 0.
"""

import os
import re
import sys
import unicodedata

README_MAX_LINES = 400
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def strip_code(lines):
    """The lines with fenced and indented code blocks blanked, and code
    spans removed (links there are examples, not links)."""
    out = []
    fence = None
    prev_blank = True
    in_indented = False
    for ln in lines:
        s = ln.rstrip("\n")
        m = re.match(r"^\s*(```|~~~)", s)
        if fence:
            out.append("")
            if m and m.group(1) == fence:
                fence = None
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        if (s.startswith("    ") or s.startswith("\t")) and (prev_blank or in_indented):
            in_indented = True
            out.append("")
            continue
        if s.strip():
            in_indented = False
        prev_blank = not s.strip()
        out.append(re.sub(r"`[^`]*`", "", s))
    return out


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.replace("`", "").lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        names = set()
        with open(path, encoding="utf-8") as f:
            for ln in strip_code(f.readlines()):
                m = HEADING.match(ln)
                if not m:
                    continue
                a = slug(m.group(2))
                n = seen.get(a, 0)
                seen[a] = n + 1
                names.add(a if n == 0 else "%s-%d" % (a, n))
        cache[path] = names
    return cache[path]


def check_file(root, path, problems):
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for no, ln in enumerate(strip_code(lines), 1):
        for m in LINK.finditer(ln):
            target = m.group(1)
            if target.startswith("<") or EXTERNAL.match(target):
                continue
            file_part, _, frag = target.partition("#")
            if file_part:
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            else:
                dest = path
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append("%s:%d: link %s leads out of the repository" % (rel, no, target))
                continue
            if not os.path.exists(dest):
                problems.append("%s:%d: link %s: no such file" % (rel, no, target))
                continue
            if frag and dest.endswith(".md") and os.path.isfile(dest):
                if frag not in anchors(dest):
                    problems.append("%s:%d: link %s: no heading with anchor #%s in %s"
                                    % (rel, no, target, frag, os.path.relpath(dest, root)))


def check_readme(root, problems):
    path = os.path.join(root, "README.md")
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if len(lines) >= README_MAX_LINES:
        problems.append("README.md: %d lines; the front page stays under %d (move the rest to docs/)"
                        % (len(lines), README_MAX_LINES))
    cmds = [ln.strip() for ln in lines if re.match(r"^    bash tools/\S+\.sh", ln)]
    want = ["tools/demo.sh", "tools/test.sh"]
    got = [c.split()[1] for c in cmds[:2]]
    if got != want:
        problems.append("README.md: its first commands must be bash %s then bash %s, found %s"
                        % (want[0], want[1], got or "none"))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: check_docs.py REPO_ROOT\n")
        return 2
    root = os.path.abspath(sys.argv[1])
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    files += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    problems = []
    for p in files:
        check_file(root, p, problems)
    check_readme(root, problems)
    for p in problems:
        print(p)
    print("check_docs: %d files, %s" % (len(files), "%d problems" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
