"""test_overlap - overlapping and replicated chunks of foreign checkpoints
(issue 30, item 2; SPEC 7).

The store holds:
- dcp_overlap.py's variants of a checkpoint Debian's torch 1.13 wrote now:
  w's chunks overlapping partially (ov-partial), w stored twice with other
  bytes (ov-repdiff) and with the same bytes (ov-repsame), each also read
  back by torch's own dcp.load_state_dict;
- paddle 3.3.1's replicas2 fixture (save_replicas: every replicated chunk
  stored once per rank, replica_id 0 the copy paddle's load reads) as
  written (pd-replicas) and changed with Python's pickle as
  paddle_hostile.py does: the copy paddle does not read holds other values
  (pd-repdiff), the copy it reads does (pd-repread), and rows' two chunks
  overlap partially (pd-partial).

Checked through one mount: a partial overlap leaves that tensor out with
one log line and the others are served; of replicas, the copy the
framework's loader reads is served (DCP: byte for byte what torch 1.13's
dcp.load_state_dict returned, whole and sliced); the store is unchanged.
Then on copies: `shardctl index` + `shardctl verify` report the replicas
whose bytes differ (exit 1, one REPLICA DIFFERS line naming the tensor)
and pass where the replicas are equal.
"""

import errno
import json
import os
import shutil
import sys

import numpy as np

import sfmount as sm
import paddle_hostile as ph

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "paddle")
PY = "/usr/bin/python3"


def paddle_variants(store):
    """pd-* in store from the replicas2 fixture; returns the new values of
    pd-repread's rep."""
    src = os.path.join(FIXTURES, "paddle-3.3.1", "replicas2")
    ph.stub_module()
    ph.stub_module(ph.MOD_OLD)

    def variant(name):
        d = os.path.join(store, name)
        shutil.copytree(src, d)
        return d

    def change_distcp(d, fname, fn):
        with open(os.path.join(src, fname), "rb") as f:
            sd = ph.NpUnpickler(f).load()  # our own fixture: trusted here
        fn(sd)
        ph.dump(sd, os.path.join(d, fname))

    md = ph.load_md(os.path.join(src, "0.metadata"))
    where = {(k.tensor_key, k.replica_id): f for k, f in md.storage_metadata.items()}
    variant("pd-replicas")
    d = variant("pd-repdiff")  # the copy paddle does not read changed
    change_distcp(d, where[("rep", 1)], lambda sd: sd.__setitem__("rep", sd["rep"] * 0 - 7))
    d = variant("pd-repread")  # the copy paddle reads changed
    newrep = {}

    def reread(sd):
        sd["rep"] = sd["rep"] * 0 + 5
        newrep["v"] = sd["rep"].tobytes()
    change_distcp(d, where[("rep", 0)], reread)
    # pd-partial: rows 5 x 3 as [0, 0] 3 x 3 and [2, 0] 3 x 3 (row 2 twice)
    d = variant("pd-partial")
    m = ph.load_md(os.path.join(src, "0.metadata"))
    for c in m.state_dict_metadata["rows"]:
        if tuple(c.global_offset) == (3, 0):
            c.__dict__.update(global_offset=(2, 0), local_shape=(3, 3))
    for k in list(m.storage_metadata):
        if k.tensor_key == "rows" and tuple(k.global_offset) == (3, 0):
            k.__dict__.update(global_offset=(2, 0), local_shape=(3, 3))
            rows_file = m.storage_metadata[k]
    ph.dump(m, os.path.join(d, "0.metadata"))
    change_distcp(d, rows_file, lambda sd: sd.__setitem__(
        "rows", np.arange(9, dtype=sd["rows"].dtype).reshape(3, 3) + 100))
    return newrep["v"]


def names_in(root):
    out = []
    for dp, _, fns in os.walk(os.path.join(root, "tensors")):
        out += [os.path.relpath(os.path.join(dp, f), os.path.join(root, "tensors"))
                for f in fns]
    return sorted(out)


def left_out_lines(log, ckpt, key):
    return [l for l in log.splitlines() if ckpt in l and "left out" in l and key in l]


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    rc, out, err = sm.run_cmd([PY, os.path.join(HERE, "dcp_overlap.py"), store])
    if not ck.eq(rc, 0, "dcp_overlap.py ran with torch 1.13: %s" % err[-2000:]):
        return
    want = json.loads(out)
    newrep = paddle_variants(store)
    vstore = env.path("vstore")  # copies for shardctl index (which writes)
    shutil.copytree(store, vstore, symlinks=True)

    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))
        # DCP: torch 1.13's dcp.load_state_dict is the reference
        for v in ("ov-partial", "ov-repdiff", "ov-repsame"):
            root = os.path.join(mnt, v)
            if not ck.ok(v in listed, "%s is mounted" % v):
                continue
            for n, hx in sorted(want[v]["others"].items()):
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)), bytes.fromhex(hx),
                            "%s: %s as torch's dcp.load reads it" % (v, n))
        log = m.log_text()
        root = os.path.join(mnt, "ov-partial")
        ck.eq(names_in(root), ["a", "b", "c"], "ov-partial: w left out, the others served")
        ck.eq(len(left_out_lines(log, "ov-partial", "w")), 1,
              "ov-partial: one log line says w is left out")
        ck.ok(any("overlap" in l for l in left_out_lines(log, "ov-partial", "w")),
              "ov-partial: the line says the chunks overlap")
        ck.raises((errno.ENOENT,), lambda: sm.read_file(sm.tensor_path(root, "w", ":,3:6")),
                  "ov-partial: no slice of w is served")
        for v in ("ov-repdiff", "ov-repsame"):
            root = os.path.join(mnt, v)
            tw = bytes.fromhex(want[v]["w"])
            ck.bytes_eq(sm.read_file(sm.tensor_path(root, "w")), tw,
                        "%s: w is the copy torch's dcp.load reads" % v)
            arr = np.frombuffer(tw, dtype="<f4").reshape(3, 6)
            for spec, sl in ((":,3:6", (slice(None), slice(3, 6))),
                             ("1:3,0:4", (slice(1, 3), slice(0, 4)))):
                ck.bytes_eq(sm.read_file(sm.tensor_path(root, "w", spec)),
                            arr[sl].tobytes(), "%s: w@%s from that copy" % (v, spec))
            ck.eq(left_out_lines(log, v, "w"), [], "%s: nothing left out" % v)
        ck.ok(want["ov-repdiff"]["w"] != want["original_w"],
              "ov-repdiff: torch reads the later copy (the test can tell copies apart)")
        ck.eq(want["ov-repsame"]["w"], want["original_w"], "ov-repsame: the same bytes")

        # paddle: replica_id 0 is read; pd-replicas is the reference
        ref = os.path.join(mnt, "pd-replicas")
        refnames = names_in(ref)
        ck.ok("rep" in refnames and "rows" in refnames, "pd-replicas served: %s" % refnames)
        for v in ("pd-repdiff", "pd-repread", "pd-partial"):
            root = os.path.join(mnt, v)
            if not ck.ok(v in listed, "%s is mounted" % v):
                continue
            names = names_in(root)
            exp_names = [n for n in refnames if not (v == "pd-partial" and n == "rows")]
            ck.eq(names, exp_names, "%s: tensors served" % v)
            for n in names:
                got = sm.read_file(sm.tensor_path(root, n))
                if v == "pd-repread" and n == "rep":
                    ck.bytes_eq(got, newrep, "pd-repread: rep is the copy paddle reads (replica 0)")
                else:
                    ck.bytes_eq(got, sm.read_file(sm.tensor_path(ref, n)),
                                "%s: %s as written" % (v, n))
        ck.eq(len(left_out_lines(log, "pd-partial", "rows")), 1,
              "pd-partial: one log line says rows is left out")
        ck.ok(any("overlap" in l for l in left_out_lines(log, "pd-partial", "rows")),
              "pd-partial: the line says the chunks overlap")
        for v in ("pd-replicas", "pd-repdiff", "pd-repread"):
            ck.eq(left_out_lines(log, v, ""), [], "%s: nothing left out" % v)
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged")

    # shardctl verify reports replicas whose bytes differ
    for v, differs, tensor in (("ov-repdiff", True, "w"), ("ov-repsame", False, "w"),
                               ("pd-replicas", False, "rep"), ("pd-repdiff", True, "rep"),
                               ("pd-repread", True, "rep")):
        d = os.path.join(vstore, v)
        rc, outv = sm.index_then_verify(env, ck, d, v)
        lines = [l for l in outv.splitlines() if l.startswith("verify: REPLICA DIFFERS")]
        if differs:
            ck.eq(rc, 1, "%s: verify fails: %s" % (v, outv))
            ck.eq(len(lines), 1, "%s: one replica reported: %s" % (v, outv))
            ck.ok(lines and ("tensor %s:" % tensor) in lines[0],
                  "%s: the line names %s: %s" % (v, tensor, outv))
        else:
            ck.eq(rc, 0, "%s: verify passes: %s" % (v, outv))
            ck.eq(lines, [], "%s: no replica reported" % v)
            ck.ok("replicas equal" in outv and " 0 replicas" not in outv,
                  "%s: verify compared its replicas: %s" % (v, outv))


if __name__ == "__main__":
    sys.exit(sm.main(test))
