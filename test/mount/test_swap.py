#!/usr/bin/python3
"""Mount test, issue 30 item 1: a store's owner swapping a checkpoint
directory after mounting never leads the daemon out of the store.

The store and its checkpoints belong to an unprivileged user (nobody); the
daemon runs as root with -o allow_other, as a shared inference box would
run it. Each checkpoint is a copy of a real Hugging Face checkpoint
(transformers 4.46's sharded safetensors, test/fixtures/hf) plus a 40-byte
root file notes.txt; its reads are unverified (foreign, not indexed).
Beside the store, a root-only directory (0700) holds files of the same
names (notes.txt, the shards) with secret bytes (0600).

nobody, acting only through its own rights (setpriv):
 1. `mv store/ck store/.old; ln -s PRIVATE store/ck`: no byte of the
    private files is ever read through the mount (before the next scan the
    pinned directory, now .old, still serves its own bytes); within 3 s ck
    leaves the mount with one warning naming it and "symlink", and stays
    out while the symlink is there.
 2. The symlink replaced by a real directory (another copy with other
    notes): shown again as a new checkpoint, with the new bytes.
 3. `mv store/ck2 store/.old2; mv store/ck3 store/ck2` (another directory
    under the same name): ck2 is dropped ("another directory") and shown
    again with ck3's bytes and ck3's modes, never a mix.
 4. A symlink in the store at mount time (store/evil -> PRIVATE) is skipped
    with one warning, never listed, never read.
 5. The store is changed by nobody only: the private directory's bytes and
    modes are untouched.
 6. The write side: a checkpoint root is writing through the mount (a
    training job) is swapped by nobody for a symlink to nobody's directory
    whose rank directory is a symlink into the private one; root goes on
    writing and commits: the daemon creates, truncates or renames nothing
    outside the store
    (its write-side paths resolve beneath the store's descriptor with no
    symlink followed, sf_confine.h): the writes fail instead.
Skips (exit 77, saying why) when not root or without setpriv.
"""

import hashlib
import json
import os
import shutil
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "hf", "transformers-4.46", "llama-st")
NOBODY = sm.NOBODY
SHOWN_WITHIN_S = 3.0


def sha(b):
    return hashlib.sha256(b).hexdigest()


def make_ckpt(path, notes):
    shutil.copytree(FIXTURE, path)
    with open(os.path.join(path, "notes.txt"), "wb") as f:
        f.write(notes)
    for dp, dns, fns in os.walk(path):
        os.chown(dp, NOBODY, NOBODY)
        for fn in fns:
            os.chown(os.path.join(dp, fn), NOBODY, NOBODY)


def wait_for(pred, timeout_s):
    t0 = time.monotonic()
    while True:
        if pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.05)


def run(env, ck):
    if os.geteuid() != 0:
        print("SKIP: needs root (the daemon runs as root, the store's owner is nobody)")
        sys.exit(sm.SKIP)
    if not shutil.which("setpriv"):
        print("SKIP: setpriv (util-linux) is not installed")
        sys.exit(sm.SKIP)
    os.chmod(env.tmp, 0o711)  # nobody must reach the store and mountpoints
    store = env.path("store")
    os.makedirs(store)
    os.chown(store, NOBODY, NOBODY)
    notes = {n: (b"notes of %s: public, 40 bytes long......" % n.encode())[:40]
             for n in ("ck", "ck2", "ck3", "ck-new")}
    for n in ("ck", "ck2"):
        make_ckpt(os.path.join(store, n), notes[n])
    # ck3 waits outside the store (nobody's too), moved in by nobody later
    side = env.path("side")
    os.makedirs(side)
    os.chown(side, NOBODY, NOBODY)
    os.chmod(side, 0o755)
    make_ckpt(os.path.join(side, "ck3"), notes["ck3"])
    os.chmod(os.path.join(side, "ck3"), 0o750)
    make_ckpt(os.path.join(side, "ck-new"), notes["ck-new"])

    # the root-only directory every swap points at: same names, secret bytes
    private = env.path("private")
    os.makedirs(private)
    os.chmod(private, 0o700)
    secrets = {}
    for fn in os.listdir(FIXTURE) + ["notes.txt"]:
        size = os.path.getsize(os.path.join(store, "ck", fn))
        blob = (b"ROOT-ONLY SECRET %s " % fn.encode()) * (size // 20 + 2)
        blob = blob[:size]
        with open(os.path.join(private, fn), "wb") as f:
            f.write(blob)
        os.chmod(os.path.join(private, fn), 0o600)
        secrets[fn] = blob
    secret_marker = b"ROOT-ONLY SECRET"
    priv_before = sm.store_snapshot(private)
    # a symlink in the store at mount time
    os.symlink(private, os.path.join(store, "evil"))
    os.lchown(os.path.join(store, "evil"), NOBODY, NOBODY)

    r = sm.as_nobody([["read", os.path.join(private, "notes.txt")]])
    ck.eq(r[0].get("errno"), "EACCES", "nobody cannot read the private notes itself")

    with sm.Mount(env, store, ["-o", "allow_other", "--log-level", "info"],
                  name="swap") as m:
        mnt = m.mnt
        root = sm.as_nobody([["listdir", mnt]])[0]
        ck.eq(root.get("ok"), ["ck", "ck2"],
              "(4) the store's symlink is not listed: %s" % root)
        evil = [l for l in m.log_lines() if "evil" in l]
        ck.eq(len(evil), 1, "(4) one line for the skipped symlink: %s" % evil)
        ck.ok(evil and "symlink" in evil[0], "(4) the line says symlink: %s" % evil)
        r = sm.as_nobody([["read", os.path.join(mnt, "evil", "notes.txt")]])[0]
        ck.eq(r.get("errno"), "ENOENT", "(4) evil/notes.txt not reachable: %s" % r)

        # before the swap root reads (so knows) a tensor of a shard file
        # and notes.txt, which nobody never opened through the mount yet
        # (a descriptor the daemon kept open would hide the hole)
        wmap = json.load(open(os.path.join(FIXTURE, "model.safetensors.index.json")))["weight_map"]
        files = sorted(set(wmap.values()))
        t0 = sm.tensor_path(os.path.join(mnt, "ck"),
                            sorted(k for k in wmap if wmap[k] == files[-1])[0])
        # the bytes t0 must have: ck2 is a copy of the same checkpoint
        t0_ck2 = sm.tensor_path(os.path.join(mnt, "ck2"),
                                sorted(k for k in wmap if wmap[k] == files[-1])[0])
        before = sm.as_nobody([["read", t0_ck2]])[0]
        ck.ok("ok" in before, "a tensor of ck2 before the swap: %s" % before)

        # (1) the swap, by nobody
        sm.as_nobody([["rename", os.path.join(store, "ck"), os.path.join(store, ".old")],
                   ["run", "ln", "-s", private, os.path.join(store, "ck")]])
        ck.ok(os.path.islink(os.path.join(store, "ck")), "(1) ck is a symlink now")
        # read at once (before the next scan) and until it leaves: never a
        # private byte; only the pinned directory's own bytes or an error
        seen_secret = []
        t_start = time.monotonic()
        gone = None
        while time.monotonic() - t_start < SHOWN_WITHIN_S + 2:
            res = sm.as_nobody([["read", os.path.join(mnt, "ck", "notes.txt")],
                             ["read", t0], ["listdir", mnt]])
            if res[0].get("ok") not in (None, sha(notes["ck"])):
                seen_secret.append(res[0])
            if "ok" in res[1] and res[1]["ok"] != before.get("ok"):
                seen_secret.append(res[1])
            if "ck" not in res[2].get("ok", ["ck"]):
                gone = time.monotonic() - t_start
                break
            time.sleep(0.1)
        ck.eq(seen_secret, [], "(1) no private byte is ever served after the swap")
        ck.ok(gone is not None and gone <= SHOWN_WITHIN_S + 1,
                "(1) ck leaves the mount within %.0f s of the swap (%s)" % (
                    SHOWN_WITHIN_S, gone))
        # as root too: the daemon's rights never reach the private files
        try:
            data = sm.read_file(os.path.join(mnt, "ck", "notes.txt"))
        except OSError as e:
            data = e.errno
        ck.ok(not (isinstance(data, bytes) and secret_marker in data),
                "(1) root reading through the mount gets no private byte either")
        lines = [l for l in m.log_lines() if "ck" in l and "symlink" in l and "evil" not in l]
        ck.eq(len(lines), 1, "(1) one warning for the swap: %s" % lines)
        time.sleep(1.5)
        r = sm.as_nobody([["listdir", mnt]])[0]
        ck.ok("ck" not in r.get("ok", []), "(1) ck stays out while a symlink: %s" % r)

        # (2) the symlink replaced by a real directory: a new checkpoint
        sm.as_nobody([["unlink", os.path.join(store, "ck")],
                   ["rename", os.path.join(side, "ck-new"), os.path.join(store, "ck")]])
        back = wait_for(lambda: sm.as_nobody([["read", os.path.join(mnt, "ck", "notes.txt")]])
                        [0].get("ok") == sha(notes["ck-new"]), SHOWN_WITHIN_S + 2)
        ck.ok(back is not None, "(2) ck shown again with the new directory's bytes (%s)" % back)

        # (3) another directory under the same name
        r2 = sm.as_nobody([["read", os.path.join(mnt, "ck2", "notes.txt")],
                        ["stat", os.path.join(mnt, "ck2")]])
        ck.eq(r2[0].get("ok"), sha(notes["ck2"]), "(3) ck2 before its swap")
        sm.as_nobody([["rename", os.path.join(store, "ck2"), os.path.join(store, ".old2")],
                   ["rename", os.path.join(side, "ck3"), os.path.join(store, "ck2")]])
        mixed = []

        def now_ck3():
            res = sm.as_nobody([["read", os.path.join(mnt, "ck2", "notes.txt")]])[0]
            if res.get("ok") not in (None, sha(notes["ck2"]), sha(notes["ck3"])):
                mixed.append(res)
            return res.get("ok") == sha(notes["ck3"])
        t3 = wait_for(now_ck3, SHOWN_WITHIN_S + 2)
        ck.ok(t3 is not None, "(3) ck2 shows ck3's bytes within %.0f s (%s)" % (
            SHOWN_WITHIN_S, t3))
        ck.eq(mixed, [], "(3) never bytes of neither directory")
        st3 = sm.as_nobody([["stat", os.path.join(mnt, "ck2")]])[0]
        ck.eq(stat.S_IMODE(st3["ok"][0]) if "ok" in st3 else None, 0o550,
              "(3) ck2 shows the new directory's modes (0750, read-only: 0550)")
        lines = [l for l in m.log_lines() if "ck2" in l and "another directory" in l]
        ck.eq(len(lines), 1, "(3) one warning for ck2's swap: %s" % lines)

        # (6) the write side: a checkpoint nobody writes through the mount
        # swapped for a symlink to a directory whose rank directory is a
        # symlink into the private one; the daemon (root) goes on writing
        # nowhere but the store
        wck = os.path.join(mnt, "wck")
        os.mkdir(wck)
        with open(os.path.join(wck, "a.txt"), "wb") as f:
            f.write(b"a" * 100)
        attack = os.path.join(side, "attack")
        sm.as_nobody([["mkdir", attack],
                   ["run", "ln", "-s", private, os.path.join(attack, "rank-00000")],
                   ["rename", os.path.join(store, "wck"), os.path.join(store, ".wold")],
                   ["run", "ln", "-s", attack, os.path.join(store, "wck")]])
        res = []
        for fn in ("b.txt", "c.txt"):
            try:
                with open(os.path.join(wck, fn), "wb") as f:
                    f.write(b"b" * 100)
                res.append("ok")
            except OSError as e:
                res.append(sm.errname(e))
        try:
            os.setxattr(wck, "user.shardfs.commit", b"1")
            res.append("ok")
        except OSError as e:
            res.append(sm.errname(e))
        print("root's writes and commit after the swap:", res)
        ck.ok(all(os.path.islink(os.path.join(attack, "rank-00000")) and
                  sorted(os.listdir(attack)) == ["rank-00000"] for _ in [0]),
              "(6) nothing made in the symlink's target: %s" % os.listdir(attack))
        ck.ok(m.alive(), "(6) the daemon is alive")

    ck.eq(sm.snapshot_diff(priv_before, sm.store_snapshot(private)), [],
          "(5) the private directory is untouched")
    for fn, blob in secrets.items():
        ck.bytes_eq(sm.read_file(os.path.join(private, fn)), blob,
                    "(5) private %s unchanged" % fn)


if __name__ == "__main__":
    sys.exit(sm.main(run))
