"""test_hf_hub - the Hugging Face hub cache mounted as it lies (issue 27, 4; SPEC 7).

The store is a copy of test/fixtures/hf-hub/huggingface_hub-*/hub, the
cache root huggingface_hub 2.4's own hf_hub_download wrote
(test/interop/make_hf_hub_fixtures.py): a repository with two snapshots
(refs/main: two safetensors shards + index; the other: one
model.safetensors) and one without an organization holding a .bin.
Hostile repositories are made here from copies of the real one: a
snapshot link to /etc/passwd, to another repository's blob, to a
directory of blobs/, an index that links out, a blob that is itself a
symlink, a link that dangles (a download in progress), a refs/main that
names no snapshot.

Checked through one mount of the cache root: ORG/NAME (the snapshot
refs/main names) and ORG/NAME@REV for the others, NAME alone for a
repository without an organization; every tensor's bytes against the
xxh3 of the state dict handed to the writer (expected.json) and against
the blob files parsed here; model.safetensors, the format xattr,
config.json as a root file, manifest.json; EROFS; each hostile link is
not served and is reported by its name and target; a dangling snapshot is
not shown; the store is unchanged. Then a snapshot directory mounted on
its own, and the live store: a new snapshot appears, a new refs/main
swaps ORG/NAME and ORG/NAME@REV.
"""

import errno
import glob
import json
import os
import shutil
import struct
import sys
import time

import xxhash

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "hf-hub")
REPO = "models--shardfs-test--tiny-llama"


def xxh3(b):
    return "%016x" % xxhash.xxh3_64_intdigest(b)


def st_parse(buf):
    (n,) = struct.unpack_from("<Q", buf, 0)
    h = json.loads(buf[8:8 + n])
    h.pop("__metadata__", None)
    return h, buf[8 + n:]


def check_snapshot(ck, root, label, snap, fmt):
    """Every tensor, model.safetensors, config.json of a mounted snapshot."""
    ck.eq(os.getxattr(root, "user.shardfs.format").decode(), fmt,
          "%s: format xattr" % label)
    ck.eq(sorted(os.listdir(os.path.join(root, "tensors"))), sorted(snap["tensors"]),
          "%s: the tensors shown" % label)
    got = {}
    for n, e in snap["tensors"].items():
        p = sm.tensor_path(root, n)
        if not ck.ok(os.path.exists(p), "%s: %s shown" % (label, n)):
            continue
        got[n] = sm.read_file(p)
        ck.eq(xxh3(got[n]), e["xxh3"], "%s: %s byte-exact" % (label, n))
        ck.eq(os.getxattr(p, "user.shardfs.dtype").decode(), e["dtype"],
              "%s: %s dtype" % (label, n))
    h, data = st_parse(sm.read_file(os.path.join(root, "model.safetensors")))
    ck.eq(sorted(h), sorted(snap["tensors"]), "%s: model.safetensors names" % label)
    for n, e in snap["tensors"].items():
        if n in h:
            a, b = h[n]["data_offsets"]
            ck.eq((h[n]["dtype"], h[n]["shape"], xxh3(data[a:b])),
                  (e["dtype"], e["shape"], e["xxh3"]),
                  "%s: model.safetensors entry %s" % (label, n))
    for n, e in snap["files"].items():
        b = sm.read_file(os.path.join(root, n))
        ck.eq((len(b), xxh3(b)), (e["size"], e["xxh3"]), "%s: root file %s" % (label, n))


def blob_tensors(repo_dir, rev):
    """The tensors of a snapshot read here from its blobs (safetensors
    files parsed by hand): {name: bytes}."""
    snap = os.path.join(repo_dir, "snapshots", rev)
    out = {}
    for n in os.listdir(snap):
        if n.endswith(".safetensors"):
            with open(os.path.join(snap, n), "rb") as f:
                h, data = st_parse(f.read())
            for k, v in h.items():
                a, b = v["data_offsets"]
                out[k] = data[a:b]
    return out


def copy_repo(store, name):
    dst = os.path.join(store, "models--h--" + name)
    shutil.copytree(os.path.join(store, REPO), dst, symlinks=True)
    return dst


def relink(path, target):
    os.unlink(path)
    os.symlink(target, path)


def make_hostile(store, main, other, bin_blob):
    """Hostile copies of the real repository; {shown name: why}."""
    sh2 = "model-00002-of-00002.safetensors"
    d = copy_repo(store, "etc")
    relink(os.path.join(d, "snapshots", main, sh2), "/etc/passwd")
    d = copy_repo(store, "otherrepo")
    relink(os.path.join(d, "snapshots", main, sh2),
           "../../../models--tiny-bin/blobs/" + bin_blob)
    d = copy_repo(store, "up")  # into the repository, not its blobs/
    relink(os.path.join(d, "snapshots", main, sh2), "../../refs/main")
    d = copy_repo(store, "blobsym")
    blob = os.readlink(os.path.join(d, "snapshots", main, sh2)).split("/")[-1]
    relink(os.path.join(d, "blobs", blob), "/etc/passwd")
    d = copy_repo(store, "dangling")
    blob = os.readlink(os.path.join(d, "snapshots", main, sh2)).split("/")[-1]
    os.unlink(os.path.join(d, "blobs", blob))
    d = copy_repo(store, "dirlink")
    os.makedirs(os.path.join(d, "blobs", "adir"))
    relink(os.path.join(d, "snapshots", other, "model.safetensors"), "../../blobs/adir")
    d = copy_repo(store, "indexout")
    relink(os.path.join(d, "snapshots", main, "model.safetensors.index.json"),
           "/etc/passwd")
    d = copy_repo(store, "badref")
    with open(os.path.join(d, "refs", "main"), "w") as f:
        f.write("../..")
    copy_repo(store, "swap")  # changed once mounted (test)


def test(env, ck):
    tops = sorted(glob.glob(os.path.join(FIXTURES, "huggingface_hub-*")))
    if not ck.ok(tops, "hub fixtures found in %s" % FIXTURES):
        return
    with open(os.path.join(tops[-1], "expected.json")) as f:
        exp = json.load(f)
    store = env.path("hub")
    shutil.copytree(os.path.join(tops[-1], "hub"), store, symlinks=True)
    llama = exp["models"]["shardfs-test/tiny-llama"]
    main = llama["main"]
    other = [r for r in llama["snapshots"] if r != main][0]
    tb = exp["models"]["tiny-bin"]
    bin_blob = os.readlink(os.path.join(
        store, "models--tiny-bin", "snapshots", tb["main"], "pytorch_model.bin")).split("/")[-1]
    make_hostile(store, main, other, bin_blob)
    before = sm.store_snapshot(store)

    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        ck.eq(sorted(os.listdir(mnt)), ["h", "shardfs-test", "tiny-bin"],
              "the cache root: one directory per organization, NAME alone without one")
        ck.eq(sorted(os.listdir(os.path.join(mnt, "shardfs-test"))),
              ["tiny-llama", "tiny-llama@" + other],
              "ORG/NAME for refs/main's snapshot, ORG/NAME@REV for the other")
        root = os.path.join(mnt, "shardfs-test", "tiny-llama")
        check_snapshot(ck, root, "tiny-llama", llama["snapshots"][main], "hf-safetensors")
        check_snapshot(ck, os.path.join(mnt, "shardfs-test", "tiny-llama@" + other),
                       "tiny-llama@REV", llama["snapshots"][other], "hf-safetensors")
        check_snapshot(ck, os.path.join(mnt, "tiny-bin"), "tiny-bin",
                       tb["snapshots"][tb["main"]], "hf-bin")
        # the bytes the blobs hold, parsed here
        for n, b in blob_tensors(os.path.join(store, REPO), main).items():
            ck.bytes_eq(sm.read_file(sm.tensor_path(root, n)), b,
                        "tiny-llama: %s as its blob holds it" % n)
        man = sm.manifest_of(root)
        ck.eq(man.get("name"), "tiny-llama", "manifest.json names the model")
        ck.eq(sorted({s["file"] for t in man["tensors"].values() for s in t["shards"]}),
              ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
              "manifest.json's shards name the snapshot's files")
        ck.raises(errno.EROFS, lambda: os.unlink(os.path.join(root, "config.json")),
                  "unlink in a snapshot")
        ck.raises((errno.EROFS, errno.EPERM, errno.EACCES),
                  lambda: os.mkdir(os.path.join(mnt, "shardfs-test", "new")),
                  "mkdir in an organization's directory")
        ck.raises((errno.EROFS, errno.EPERM, errno.EACCES, errno.ENOTEMPTY),
                  lambda: os.rmdir(root), "rmdir of a snapshot")
        ck.eq(os.listxattr(os.path.join(mnt, "shardfs-test")), [],
              "an organization's directory has no xattrs")
        ck.eq(oct(os.stat(os.path.join(mnt, "shardfs-test")).st_mode & 0o777), "0o555",
              "an organization's directory is read-only")

        # hostile repositories
        log = m.log_text()
        h = os.path.join(mnt, "h")
        shown = set(os.listdir(h))
        sh2 = "model-00002-of-00002.safetensors"
        in_sh2 = {n for n in llama["snapshots"][main]["tensors"]
                  if n >= "model.layers.0.mlp.up_proj.weight"}  # keys sorted: 3 + 2
        ck.eq(len(in_sh2), 2, "the second shard holds two tensors")
        for name, target in (("etc", "/etc/passwd"),
                             ("otherrepo", "../../../models--tiny-bin/blobs/" + bin_blob),
                             ("up", "../../refs/main")):
            root = os.path.join(h, name)
            if not ck.ok(os.path.isdir(root), "h/%s is shown" % name):
                continue
            ck.eq(set(os.listdir(os.path.join(root, "tensors"))),
                  set(llama["snapshots"][main]["tensors"]) - in_sh2,
                  "h/%s: the tensors of the link that leads out are not shown" % name)
            ck.ok('checkpoint "h/%s": "%s" links to "%s", not a file of its repository\'s blobs/: not followed'
                  % (name, sh2, target) in log,
                  "h/%s: the log names the link and its target" % name)
            ck.ok("Invalid cross-device link" not in log, "h/%s: no errno text" % name)
            for n in set(llama["snapshots"][main]["tensors"]) - in_sh2:
                ck.eq(xxh3(sm.read_file(sm.tensor_path(root, n))),
                      llama["snapshots"][main]["tensors"][n]["xxh3"],
                      "h/%s: %s still served" % (name, n))
        ck.ok(b"root:" not in b"".join(
            sm.read_file(os.path.join(dp, f)) for dp, _, fs in os.walk(h) for f in fs),
            "no byte of /etc/passwd is served anywhere")
        root = os.path.join(h, "blobsym")
        if ck.ok(os.path.isdir(root), "h/blobsym is shown"):
            ck.eq(set(os.listdir(os.path.join(root, "tensors"))),
                  set(llama["snapshots"][main]["tensors"]) - in_sh2,
                  "h/blobsym: a blob that is a symlink is not read")
            ck.ok('checkpoint "h/blobsym": "%s": its blob is itself a symlink: not followed' % sh2
                  in log, "h/blobsym: the log says the blob is a symlink")
        ck.ok("dangling" not in shown, "h/dangling (a link that dangles) is not shown")
        ck.ok("dangling@" + other in shown, "h/dangling's complete snapshot is shown")
        ck.ok('"h/dangling" skipped: not complete yet' in log,
              "h/dangling: the skip is logged")
        ck.ok("dirlink@" + other not in shown, "h/dirlink@REV (a link to a directory) is left out")
        ck.ok("dirlink" in shown, "h/dirlink's other snapshot is shown")
        ck.ok("indexout" not in shown, "h/indexout (its index links out) is left out")
        ck.ok('checkpoint "h/indexout": "model.safetensors.index.json" links to "/etc/passwd"'
              in log, "h/indexout: the log names the index link and its target")
        ck.ok('model.safetensors.index.json: leads out of the checkpoint' in log,
              "h/indexout: left out as leading out")
        time.sleep(1.2)  # live rounds: what the scan refused is not opened again
        ck.eq(m.log_text().count('checkpoint "h/indexout" left out'), 1,
              "h/indexout: one line, not one per live round")
        ck.eq(sorted(n for n in shown if n.startswith("badref")),
              sorted(["badref@" + main, "badref@" + other]),
              "h/badref: a refs/main naming no snapshot: every snapshot by REV")

        # once mounted, nothing of h/swap read yet: its blob of shard 2
        # swapped for a symlink out, its link to shard 1 pointed out
        d = os.path.join(store, "models--h--swap")
        snap = os.path.join(d, "snapshots", main)
        blob = os.readlink(os.path.join(snap, sh2)).split("/")[-1]
        os.rename(os.path.join(d, "blobs", blob), os.path.join(d, "blob-aside"))
        os.symlink("/etc/passwd", os.path.join(d, "blobs", blob))
        relink(os.path.join(snap, "model-00001-of-00002.safetensors"), "/etc/passwd")
        for n, e in llama["snapshots"][main]["tensors"].items():
            try:
                b = sm.read_file(sm.tensor_path(os.path.join(h, "swap"), n))
                ck.ok(b"root:" not in b and xxh3(b) == e["xxh3"],
                      "h/swap: %s: the original bytes or nothing" % n)
            except OSError as ex:
                ck.eq(ex.errno, errno.EIO, "h/swap: %s fails with EIO" % n)
        # put back: the store must end as it began
        os.unlink(os.path.join(d, "blobs", blob))
        os.rename(os.path.join(d, "blob-aside"), os.path.join(d, "blobs", blob))
        relink(os.path.join(snap, "model-00001-of-00002.safetensors"),
               os.readlink(os.path.join(store, REPO, "snapshots", main,
                                        "model-00001-of-00002.safetensors")))
    snapdir = os.path.join(store, REPO, "snapshots", main)
    rc, out, err = sm.run_cmd([env.shardctl, "index", snapdir])
    ck.ok(rc == 1 and "Hugging Face hub cache" in err,
          "shardctl index refuses to write into the hub cache: %r" % err)
    after = sm.store_snapshot(store)
    ck.eq([l for l in sm.snapshot_diff(before, after) if "models--h--swap" not in l], [],
          "the store is unchanged by the mount and shardctl index (h/swap: by the test)")

    # a snapshot directory mounted on its own
    snapdir = os.path.join(store, REPO, "snapshots", main)
    with sm.Mount(env, snapdir, name="snap") as m:
        check_snapshot(ck, m.mnt, "snapshot alone", llama["snapshots"][main],
                       "hf-safetensors")

    # the live store: a new snapshot, then a new refs/main
    live = env.path("live")
    os.makedirs(live)
    shutil.copytree(os.path.join(store, REPO), os.path.join(live, REPO), symlinks=True)
    org = os.path.join(env.path("mnt-live"), "shardfs-test")
    with sm.Mount(env, live, name="live"):
        newrev = "f" * 40
        tmp = os.path.join(live, REPO, "snapshots", ".tmp")
        shutil.copytree(os.path.join(live, REPO, "snapshots", other), tmp, symlinks=True)
        os.rename(tmp, os.path.join(live, REPO, "snapshots", newrev))
        ck.ok(wait_for(lambda: "tiny-llama@" + newrev in os.listdir(org)),
              "live: a new snapshot appears as ORG/NAME@REV")
        # in place, as huggingface_hub writes it (truncated, then written)
        with open(os.path.join(live, REPO, "refs", "main"), "w") as f:
            f.write(other)
        want = sorted(["tiny-llama", "tiny-llama@" + main, "tiny-llama@" + newrev])
        ck.ok(wait_for(lambda: sorted(os.listdir(org)) == want),
              "live: a new refs/main: %r, want %r" % (sorted(os.listdir(org)), want))
        t = "model.norm.weight"
        ck.eq(xxh3(sm.read_file(os.path.join(org, "tiny-llama", "tensors", t))),
              llama["snapshots"][other]["tensors"][t]["xxh3"],
              "live: ORG/NAME serves the snapshot refs/main names now")


def wait_for(cond, timeout_s=10):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


if __name__ == "__main__":
    sys.exit(sm.main(test))
