#!/usr/bin/python3
"""Mount test (j, payload side): hostile payload files behind a valid
manifest. A payload path that is a directory, or a FIFO (open(2) of a FIFO
without a writer blocks forever unless opened O_NONBLOCK, and a blocked
daemon thread also keeps the daemon from exiting on unmount). Reads that
need it fail with EIO within 10 s (each read runs in a child process that is
killed at the bound), every tensor that does not need it reads correctly,
and the daemon exits on unmount. Likewise a checkpoint whose manifest.json
is a FIFO must not block the store scan: it is left out and the good
checkpoint next to it mounts and reads."""

import errno
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402


def check_payload_files(env, ck):
    store = env.path("pstore")
    os.makedirs(store)
    refs = {}
    for cname in ("dirpayload", "fifopayload"):
        refs[cname] = env.gen(os.path.join(store, cname), layout="mixed", ranks=2,
                              size="1M", seed=73, block_size="64K")
    man = sm.manifest_of(os.path.join(store, "dirpayload"))
    bad_file = "rank-00001/data-0.bin"
    for cname in refs:
        p = os.path.join(store, cname, bad_file)
        os.unlink(p)
        if cname == "dirpayload":
            os.mkdir(p)
        else:
            os.mkfifo(p)
    with sm.Mount(env, store, name="payloads") as m:
        for cname, ref in sorted(refs.items()):
            nbad, hung = 0, False
            for name in sorted(ref.tensors):
                kind_dep = sm.classify(man, ref, name, lambda s: s["file"] == bad_file)
                kind, val = sm.read_in_child(sm.tensor_path(os.path.join(m.mnt, cname), name))
                if kind == "timeout":
                    ck.ok(False, "%s: read of tensors/%s hung (> 10 s)" % (cname, name))
                    hung = True
                    break      # one hang is enough; the next would hang too
                if kind_dep == "broken":
                    nbad += 1
                    ck.eq((kind, val), ("errno", errno.EIO), "%s: read of tensors/%s" % (cname, name))
                elif kind_dep == "either":
                    # another shard may or may not cover it: EIO or correct
                    ck.ok((kind, val) in (("errno", errno.EIO),
                                          ("ok", hashlib.sha256(ref.tensor_bytes(name)).hexdigest())),
                          "%s: read of tensors/%s (partly on the bad file): %s %s" % (cname, name, kind, val))
                else:
                    ck.eq((kind, val), ("ok", hashlib.sha256(ref.tensor_bytes(name)).hexdigest()),
                          "%s: read of tensors/%s (not on the bad file)" % (cname, name))
            ck.ok(hung or nbad > 0, "%s: some tensor cannot be read without %s" % (cname, bad_file))
        ck.ok(m.alive(), "daemon alive after hostile payload files")


def check_fifo_manifest(env, ck):
    store = env.path("mstore")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "good"), layout="mixed", ranks=2, size="1M",
                  seed=74, block_size="64K")
    os.makedirs(os.path.join(store, "fifomanifest"))
    os.mkfifo(os.path.join(store, "fifomanifest", "manifest.json"))
    try:
        m = sm.Mount(env, store, name="fifomanifest")
        m.start()
    except RuntimeError as e:
        ck.ok(False, "a FIFO manifest.json next to a good checkpoint: %s" % str(e).splitlines()[0])
        return
    with m:
        ck.eq(sorted(os.listdir(m.mnt)), ["good"], "only the good checkpoint is mounted")
        ck.ok(any("fifomanifest" in l for l in m.log_lines()),
              "a log line names the checkpoint with a FIFO manifest")
        name = max(ref.tensors, key=ref.nbytes)
        ck.eq(sm.read_in_child(sm.tensor_path(os.path.join(m.mnt, "good"), name)),
              ("ok", hashlib.sha256(ref.tensor_bytes(name)).hexdigest()),
              "good: tensors/%s next to a FIFO manifest" % name)


def run(env, ck):
    # independent parts: a failure (or a hung daemon) in one must not hide the other
    for part in (check_payload_files, check_fifo_manifest):
        try:
            part(env, ck)
        except Exception as e:  # noqa: BLE001 - reported as a failure, then go on
            ck.ok(False, "%s: %s" % (part.__name__, str(e).splitlines()[0]))
            print(e)


if __name__ == "__main__":
    sys.exit(sm.main(run))
