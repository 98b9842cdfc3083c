#!/usr/bin/python3
"""test_man_pages - docs/man/shardfs.1 and shardctl.1 against the programs.

    test_man_pages.py BIN_DIR MAN_DIR

Each page renders without a warning (groff -man -ww -z, nothing on stderr);
every option `shardfs --help` lists is in shardfs.1; every command
`shardctl --help` lists has its own section in shardctl.1, and every option
of `shardctl COMMAND --help` is in that command's section. Options are
looked for in the page as rendered (groff -Tascii, wide lines, no
hyphenation), as whole words. Exit 0, 1 on any failure, 77 (skipped,
saying why) without groff (tools/deps.sh installs groff-base).
Standard library only.
"""

import os
import re
import shutil
import subprocess
import sys

OPTION = re.compile(r"(?<![\w-])(--[a-zA-Z][\w-]*|-[a-zA-Z](?![\w-]))")
failures = []
checks = 0


def check(ok, msg):
    global checks
    checks += 1
    if not ok:
        failures.append(msg)
        print("FAIL:", msg)


def run(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def options(text):
    return sorted(set(OPTION.findall(text)))


def has_word(text, word):
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(word), text) is not None


def render(page):
    rc, out, err = run(["groff", "-man", "-ww", "-z", page])
    check(rc == 0 and err == "", "%s renders without warnings: rc %d, %r" % (
        os.path.basename(page), rc, err[:500]))
    rc, out, err = run(["groff", "-man", "-Tascii", "-P-c", "-P-b", "-P-o", "-P-u",
                        "-rLL=2000n", "-rHY=0", page])
    check(rc == 0 and "NAME" in out, "%s renders as text" % os.path.basename(page))
    return out


def sections(text):
    """{command: its section's text} from the '   shardctl CMD ...' headers."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^   shardctl ([a-z]+)", line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, "")
        elif re.match(r"^[A-Z]", line):
            cur = None          # the next .SH ends the section
        if cur:
            out[cur] += line + "\n"
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bindir, mandir = sys.argv[1:]
    if shutil.which("groff") is None:
        print("SKIP: groff is not installed (tools/deps.sh installs groff-base)")
        return 77
    shardfs, shardctl = os.path.join(bindir, "shardfs"), os.path.join(bindir, "shardctl")

    page = render(os.path.join(mandir, "shardfs.1"))
    rc, help_text, _ = run([shardfs, "--help"])
    check(rc == 0 and options(help_text), "shardfs --help lists options")
    for opt in options(help_text):
        check(has_word(page, opt), "shardfs.1 lacks %s (from shardfs --help)" % opt)

    page = render(os.path.join(mandir, "shardctl.1"))
    secs = sections(page)
    rc, help_text, _ = run([shardctl, "--help"])
    commands = re.findall(r"^  ([a-z]+)  ", help_text, re.M)
    check(rc == 0 and len(commands) >= 8, "shardctl --help lists commands: %s" % commands)
    for opt in options(help_text):
        check(has_word(page, opt), "shardctl.1 lacks %s (from shardctl --help)" % opt)
    for cmd in commands:
        check(cmd in secs, "shardctl.1 has no section for '%s'" % cmd)
        rc, cmd_help, _ = run([shardctl, cmd, "--help"])
        check(rc == 0 and cmd_help.startswith("usage: shardctl %s" % cmd),
              "shardctl %s --help" % cmd)
        for opt in options(cmd_help):
            check(has_word(secs.get(cmd, ""), opt),
                  "shardctl.1's section '%s' lacks %s (from shardctl %s --help)"
                  % (cmd, opt, cmd))
    if failures:
        print("%d of %d checks FAILED" % (len(failures), checks))
        return 1
    print("all %d checks passed" % checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
