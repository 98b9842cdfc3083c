#!/usr/bin/python3
"""The pickle writer (core/formats/sf_pickle_write.c) against torch.load:
every non-tensor entry of model states deepspeed 0.19.8 wrote (ZeRO 2 and
3, bf16 and fp16), written by test_pickle_write as a torch.save archive,
loads with Debian's torch 1.13 to a value equal to torch.load(archive)[KEY]
(same types all the way down).

  test_pickle_write_torch.py TEST_PICKLE_WRITE FIXTURES_DIR
"""
import glob
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:
    print("SKIPPED: no torch for /usr/bin/python3 (%s)" % e)
    sys.exit(77)


def same(a, b, path):
    if type(a) is not type(b):
        raise AssertionError("%s: %s vs %s" % (path, type(a), type(b)))
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError("%s: keys %r vs %r" % (path, list(a), list(b)))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (path, k))
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError("%s: length" % path)
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (path, i))
    elif isinstance(a, float) and a != a:
        if b == b:
            raise AssertionError("%s: nan vs %r" % (path, b))
    elif a != b:
        raise AssertionError("%s: %r vs %r" % (path, a, b))


def main():
    prog, fixtures = sys.argv[1], sys.argv[2]
    archives = sorted(glob.glob(os.path.join(fixtures, "*", "*", "*model_states.pt")))
    # torch's own archives (no DeepSpeed class inside: torch.load needs no deepspeed)
    archives = [a for a in archives if "zero_pp_rank_1" not in a]
    if not archives:
        print("FAIL: no model states under %s" % fixtures)
        return 1
    checked = 0
    for ms in archives:
        want = torch.load(ms)
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([prog, ms, out], capture_output=True, text=True)
            if r.returncode != 0:
                print("FAIL: %s: %s%s" % (ms, r.stdout, r.stderr))
                return 1
            made = sorted(os.listdir(out))
            for key, val in want.items():
                holds_tensor = "tensor(" in repr(val) or "Parameter" in repr(val)
                name = key + ".pt"
                if holds_tensor:
                    if name in made:
                        print("FAIL: %s: %s holds a tensor, written anyway" % (ms, key))
                        return 1
                    continue
                if name not in made:
                    print("FAIL: %s: %s not written" % (ms, key))
                    return 1
                got = torch.load(os.path.join(out, name))
                try:
                    same(val, got, key)
                except AssertionError as e:
                    print("FAIL: %s: %s" % (ms, e))
                    return 1
                checked += 1
    print("test_pickle_write_torch: %d entries of %d archives equal" % (checked, len(archives)))
    return 0 if checked >= 20 else 1


if __name__ == "__main__":
    sys.exit(main())
