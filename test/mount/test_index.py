"""test_index - `shardctl index` and verified reads of checkpoints other
frameworks wrote (issue 11 "Checksums", SPEC section 7).

On copies of the committed DCP checkpoints torch 2.15 wrote
(test/fixtures/dcp/torch-2.*), next to a shardfs/1 checkpoint:
- before indexing, user.shardfs.verified is "no";
- `shardctl index` adds shardfs.index.json and nothing else (every other
  file byte-for-byte and mtime unchanged, no temporary file left); it
  refuses a shardfs/1 checkpoint, a store and a path inside a mount, with
  the reason; running it again replaces the index;
- after a remount verified is "yes", every tensor and object is still
  byte-exact (check_dcp_tree.py against expected.json), manifest.json
  shows the checksums, shardfs.index.json is no root file;
- a byte flipped inside a chunk's tensor data (mtime kept: bit rot, or
  changed: an edit) makes that tensor's reads fail with EIO and the log
  name it, while the other tensors read fine; a root file indexed in
  blocks of 4 KiB fails only in its bad block;
- a file changed since indexing is reported with one log line: touched or
  appended files keep their checksums (reads verified), a root file
  rewritten with another size or a new file is served unverified and the
  checkpoint says verified "no";
- hostile index files (not JSON, truncated, too large, huge numbers,
  wrong checksum counts, names with "..", absolute names, a missing or
  extra shard, another adapter, a newer version, a symlink, a FIFO, a
  directory) are ignored with one log line: the checkpoint is served
  unverified and byte-exact;
- `shardctl verify` passes an intact indexed checkpoint and fails (exit
  1) on the flipped byte, a changed file and a checkpoint without index.
The store is byte-for-byte unchanged by the mounts.
"""

import copy
import errno
import glob
import json
import os
import shutil
import stat
import sys

import sfmount as sm

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "test", "interop"))
import check_dcp_tree as cdt  # noqa: E402

FIXTURES = os.path.join(os.environ.get("SHARDFS_FIXTURES") or
                        os.path.join(TOP, "test", "fixtures"), "dcp")
INDEX = "shardfs.index.json"
ROOTFILE = "tokenizer.json"     # a root file of three 4 KiB blocks
ROOTBYTES = bytes((i * 7 + 3) % 251 for i in range(10000))


def collect(store, cases):
    """Copy every committed torch-2.* checkpoint into store; append
    (name, expected dict)."""
    for vdir in sorted(glob.glob(os.path.join(FIXTURES, "torch-2.*"))):
        for exp in sorted(glob.glob(os.path.join(vdir, "*.expected.json"))):
            src = exp[:-len(".expected.json")]
            if not os.path.isdir(src):
                continue
            name = "%s-%s" % (os.path.basename(vdir), os.path.basename(src))
            shutil.copytree(src, os.path.join(store, name), symlinks=True)
            with open(exp) as f:
                cases.append((name, json.load(f)))


def files_only(snap):
    """A store_snapshot without the directories' own entries (a new file
    changes its directory's mtime)."""
    return {k: v for k, v in snap.items() if v[0] != stat.S_IFDIR}


def check_tree(ck, root, exp, label, bad_ok=()):
    """Every tensor and object byte-exact, except mismatches naming one of
    bad_ok (those must fail with EIO)."""
    good, bad = cdt.check_tree(root, exp, False, True)
    rest = [b for b in bad if not any(b.startswith("tensor %s:" % v) for v in bad_ok)]
    ck.eq(rest, [], "%s: every tensor byte-exact (%d checks)" % (label, good))
    for v in bad_ok:
        ck.raises(errno.EIO, lambda: sm.read_file(sm.tensor_path(root, v)),
                  "%s: reading %s" % (label, v))


def index(env, ck, d, *opts):
    r = env.shardctl_run("index", *(list(opts) + [d]), check=False)
    ck.eq(r.returncode, 0, "shardctl index %s: %s" % (d, r.stderr.decode(errors="replace")))
    ck.ok(b"index: " in r.stdout and INDEX.encode() in r.stdout,
          "shardctl index %s prints a summary: %r" % (d, r.stdout))
    return r


def load_index(d):
    with open(os.path.join(d, INDEX)) as f:
        return json.load(f)


def write_index(d, ix):
    with open(os.path.join(d, INDEX), "w") as f:
        json.dump(ix, f)


def flip(path, off, keep_mtime):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x20]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def victim_of(ix, entry):
    """The first index shard of tensor entry: (file, offset, nbytes)."""
    for s in ix["shards"]:
        if s["kind"] == "tensor" and s["name"] == entry and s["nbytes"] > 16:
            return s["file"], s["file_offset"], s["nbytes"]
    raise RuntimeError("no shard of %s in the index" % entry)


def hostile_variants(ix, indexed_dir):
    """name -> a function(dir) that plants a hostile shardfs.index.json."""
    def js(fn):
        def plant(d):
            h = copy.deepcopy(ix)
            fn(h)
            write_index(d, h)
        return plant

    def raw(data):
        def plant(d):
            with open(os.path.join(d, INDEX), "wb") as f:
                f.write(data)
        return plant

    text = json.dumps(ix).encode()
    multi = next(s for s in ix["shards"] if s["nbytes"] > 0)

    def big(d):
        with open(os.path.join(d, INDEX), "wb") as f:
            f.truncate(257 << 20)   # sparse: over the 256 MiB cap

    def symlink(d):
        shutil.copy(os.path.join(indexed_dir, INDEX), os.path.join(d, "real.json.bak"))
        os.symlink("real.json.bak", os.path.join(d, INDEX))

    def dup_shard(h):
        h["shards"].append(dict(h["shards"][0]))

    def extra_shard(h):
        s = dict(h["shards"][0])
        s["name"] = "no.such.tensor"
        h["shards"].append(s)

    return {
        "notjson": raw(b"this is not JSON\n"),
        "truncated": raw(text[:len(text) // 2]),
        "empty": raw(b""),
        "toobig": big,
        "array": raw(b"[1, 2, 3]"),
        "hugenbytes": js(lambda h: h["shards"][0].update(nbytes=2 ** 62)),
        "hugeoffset": js(lambda h: h["shards"][0].update(file_offset=2 ** 63 - 1)),
        "hugeint": js(lambda h: h["shards"][0].update(file_offset=2 ** 64 - 1)),
        "manyfiles": js(lambda h: h["files"].update(
            {"f%06d" % i: {"size": 0, "mtime_ns": 0} for i in range(1 << 17)})),
        "hugeblock": js(lambda h: h.update(block_size=2 ** 40)),
        "negsize": js(lambda h: h["files"][multi["file"]].update(size=-1)),
        "extrasum": js(lambda h: h["shards"][0]["xxh3"].append("0123456789abcdef")),
        "nosums": js(lambda h: h["shards"][0].update(xxh3=[])),
        "badhex": js(lambda h: h["shards"][0].update(xxh3=["XYZ"] * len(h["shards"][0]["xxh3"]))),
        "dotdot": js(lambda h: (h["files"].update({"../outside": {"size": 1, "mtime_ns": 1}}),
                                h["shards"][0].update(file="../outside"))),
        "absolute": js(lambda h: (h["files"].update({"/etc/passwd": {"size": 1, "mtime_ns": 1}}),
                                  h["shards"][0].update(file="/etc/passwd"))),
        "unlisted": js(lambda h: h["shards"][0].update(file="__9_9.distcp")),
        "missingshard": js(lambda h: h["shards"].pop(0)),
        "extrashard": js(extra_shard),
        "dupshard": js(dup_shard),
        "adapter": js(lambda h: h.update(adapter="hf-safetensors")),
        "version": js(lambda h: h.update(version=2)),
        "format": js(lambda h: h.update(format="something-else")),
        "kind": js(lambda h: h["shards"][0].update(kind="weights")),
        "symlink": symlink,
        "fifo": lambda d: os.mkfifo(os.path.join(d, INDEX)),
        "directory": lambda d: os.mkdir(os.path.join(d, INDEX)),
    }


def test(env, ck):
    store = env.path("store")
    os.makedirs(store)
    cases = []
    collect(store, cases)
    if not ck.ok(len(cases) >= 3, "torch 2.x fixtures found in %s" % FIXTURES):
        return
    names = [n for n, _ in cases]
    exp_of = dict(cases)
    coded = {n for n in names if "zstd" in n}  # torch-2.15-ext's zstd chunks
    env.gen(os.path.join(store, "native"), layout="mixed", ranks=2, size="128K", ref=False)
    base = "torch-2.15-rows4" if "torch-2.15-rows4" in exp_of else names[0]
    # a root file of several blocks, indexed in blocks of 4 KiB
    with open(os.path.join(store, base, ROOTFILE), "wb") as f:
        f.write(ROOTBYTES)

    # --- before indexing: unverified
    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        for n in names:
            ck.eq(os.getxattr(os.path.join(m.mnt, n), "user.shardfs.verified").decode(),
                  "no", "%s: verified before indexing" % n)
        # index refuses a path inside a mount
        r = env.shardctl_run("index", os.path.join(m.mnt, base), check=False)
        ck.ok(r.returncode == 1 and b"inside a shardfs mount" in r.stderr,
              "index refuses a path in a mount: %r" % r.stderr)
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the first mount")

    # --- shardctl index: adds shardfs.index.json, nothing else
    r = env.shardctl_run("index", os.path.join(store, "native"), check=False)
    ck.ok(r.returncode == 1 and b"checksums of its own" in r.stderr,
          "index refuses shardfs/1 and says why: %r" % r.stderr)
    r = env.shardctl_run("index", store, check=False)
    ck.ok(r.returncode == 1 and b"not a store" in r.stderr,
          "index refuses a store and says why: %r" % r.stderr)
    r = env.shardctl_run("index", os.path.join(store, "no-such"), check=False)
    ck.eq(r.returncode, 1, "index of a missing directory fails")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "refused index runs changed nothing")
    for n in names:
        d = os.path.join(store, n)
        opts = ["--block-size", "4K"] if n == base else []
        index(env, ck, d, *opts)
    index(env, ck, os.path.join(store, base), "--block-size", "4K")  # again: replaces
    after = sm.store_snapshot(store)
    want = sorted("added: %s/%s" % (n, INDEX) for n in names)
    ck.eq(sm.snapshot_diff(files_only(before), files_only(after)), want,
          "index added shardfs.index.json and changed nothing else")
    ck.eq([p for p in glob.glob(os.path.join(store, "*", ".shardfs.index.json*"))], [],
          "no temporary file is left")
    for n in names:
        ix = load_index(os.path.join(store, n))
        ck.eq((ix["format"], ix["version"], ix["adapter"]),
              ("shardfs-index", 1, "torch-dcp"), "%s: index header" % n)
        ck.ok(all(os.path.isfile(os.path.join(store, n, f)) for f in ix["files"]),
              "%s: the index lists the checkpoint's files" % n)
    bix = load_index(os.path.join(store, base))
    ck.eq(bix["block_size"], 4096, "%s: --block-size is kept" % base)
    ck.ok(any(s["file"] == ROOTFILE and len(s["xxh3"]) == 3 for s in bix["shards"]),
          "%s: the root file is indexed in 3 blocks" % base)

    # --- variants, each a copy of an indexed checkpoint
    def variant(tag, src=base):
        d = os.path.join(store, "v-" + tag)
        shutil.copytree(os.path.join(store, src), d, symlinks=True)
        exp_of["v-" + tag] = exp_of[src]
        return d

    vfile, voff, vlen = victim_of(bix, "rows" if base.endswith("rows4") else
                                  sorted(exp_of[base]["tensors"])[0])
    victim = next(s["name"] for s in bix["shards"]
                  if s["file"] == vfile and s["file_offset"] == voff)
    d = variant("bitrot")
    flip(os.path.join(d, vfile), voff + vlen // 2, keep_mtime=True)
    d = variant("edited")
    flip(os.path.join(d, vfile), voff + 1, keep_mtime=False)
    d = variant("rootrot")
    flip(os.path.join(d, ROOTFILE), 4096 + 5, keep_mtime=True)  # block 1 of 3
    d = variant("touched")
    os.utime(os.path.join(d, vfile), ns=(1, 10 ** 18))
    d = variant("appended")
    with open(os.path.join(d, vfile), "ab") as f:
        f.write(b"appended after indexing")
    d = variant("newfile")
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"added": "after indexing"}\n')
    d = variant("rootedit")
    with open(os.path.join(d, ROOTFILE), "wb") as f:
        f.write(b"a shorter tokenizer\n")
    d = variant("wrongsum")
    h = copy.deepcopy(bix)
    for s in h["shards"]:
        if s["name"] == victim and s["file"] == vfile:
            s["xxh3"][0] = "%016x" % (int(s["xxh3"][0], 16) ^ 1)
    write_index(d, h)
    hostile = hostile_variants(bix, os.path.join(store, base))
    for tag, plant in sorted(hostile.items()):
        d = variant("h-" + tag)
        os.unlink(os.path.join(d, INDEX))
        plant(d)
    d = variant("noindex")
    os.unlink(os.path.join(d, INDEX))

    # --- shardctl verify, without a daemon
    def verify(n):
        return env.shardctl_run("verify", os.path.join(store, n), check=False)
    for n in names:
        r = verify(n)
        if n in coded:
            # zstd chunks are not indexed (their checksums would be of the
            # decoded bytes): verify says so and fails, never passes blindly
            ck.ok(r.returncode == 1 and b"unverified" in r.stdout,
                  "verify %s reports its compressed chunks unverified: %r" % (
                      n, r.stdout[-300:]))
            continue
        ck.ok(r.returncode == 0 and b"verify: OK" in r.stdout,
              "verify %s passes: %r %r" % (n, r.stdout[-300:], r.stderr[-300:]))
    r = verify("v-bitrot")
    ck.ok(r.returncode == 1 and ("BAD tensor %s" % victim).encode() in r.stdout and
          b"checksum mismatch" in r.stdout, "verify catches the flipped byte: %r" % r.stdout)
    r = verify("v-rootrot")
    ck.ok(r.returncode == 1 and ("BAD file %s shard 0 file %s block 1:" %
                                 (ROOTFILE, ROOTFILE)).encode() in r.stdout,
          "verify names the bad block of the root file: %r" % r.stdout)
    r = verify("v-touched")
    ck.ok(r.returncode == 1 and b"changed since indexing" in r.stderr and
          b"1 files changed" in r.stdout, "verify reports a touched file: %r %r"
          % (r.stdout, r.stderr))
    r = verify("v-newfile")
    ck.ok(r.returncode == 1 and b"config.json" in r.stdout + r.stderr,
          "verify reports a new file: %r %r" % (r.stdout, r.stderr))
    r = verify("v-noindex")
    ck.ok(r.returncode == 1 and b"run shardctl index first" in r.stdout,
          "verify of a checkpoint without index fails and says why: %r" % r.stdout)
    r = verify("v-h-notjson")
    ck.ok(r.returncode == 1 and b"does not fit" in r.stdout,
          "verify of a bad index fails and says why: %r" % r.stdout)
    r = verify("native")
    ck.ok(r.returncode == 0 and b"verify: OK" in r.stdout, "verify of shardfs/1 still works")

    # --- mounted: verified reads
    before = sm.store_snapshot(store)
    with sm.Mount(env, store, ["--log-level", "info"]) as m:
        mnt = m.mnt
        listed = set(os.listdir(mnt))

        def root_of(n):
            return os.path.join(mnt, n)

        def verified(n):
            return os.getxattr(root_of(n), "user.shardfs.verified").decode()

        for n in names:
            root = root_of(n)
            if not ck.ok(n in listed, "%s is mounted" % n):
                continue
            ck.eq(verified(n), "no" if n in coded else "yes",
                  "%s: verified after indexing" % n)
            check_tree(ck, root, exp_of[n], n)
            ck.ok(INDEX not in os.listdir(root), "%s: the index is no root file" % n)
            if n not in coded:
                ck.ok('"xxh3"' in json.dumps(sm.manifest_of(root)),
                      "%s: manifest.json shows the checksums" % n)
        ck.bytes_eq(sm.read_file(os.path.join(root_of(base), ROOTFILE)), ROOTBYTES,
                    "%s: the indexed root file" % base)
        def log_has(n, *words):
            return [l for l in m.log_lines() if 'checkpoint "%s":' % n in l and
                    all(w in l for w in words)]

        for n in names:
            ck.eq(log_has(n, INDEX, "ignored"), [], "%s: no index problem logged" % n)
        # bit rot and an edit: that tensor fails, the rest reads
        for tag in ("bitrot", "edited", "wrongsum"):
            n = "v-" + tag
            ck.eq(verified(n), "yes", "%s: verified" % n)
            check_tree(ck, root_of(n), exp_of[n], n, bad_ok=(victim,))
            ck.ok(log_has(n, 'tensor "%s"' % victim, vfile, "checksum mismatch"),
                  "%s: the log names the tensor, its file and the mismatch" % n)
        ck.ok(log_has("v-edited", 'file "%s" changed since indexing' % vfile),
              "v-edited: the changed file is reported")
        ck.eq(log_has("v-bitrot", "changed since indexing"), [],
              "v-bitrot: no file reported changed (mtime kept)")
        # a root file's bad block: only reads touching it fail
        rp = os.path.join(root_of("v-rootrot"), ROOTFILE)
        ck.bytes_eq(sm.pread_all(rp, 0, 4096), ROOTBYTES[:4096],
                    "v-rootrot: block 0 of the root file reads")
        ck.bytes_eq(sm.pread_all(rp, 8192, 10000 - 8192), ROOTBYTES[8192:],
                    "v-rootrot: block 2 of the root file reads")
        ck.raises(errno.EIO, lambda: sm.pread_all(rp, 4096 + 100, 10),
                  "v-rootrot: a read inside block 1")
        ck.ok(log_has("v-rootrot", 'file "%s"' % ROOTFILE, "block 1", "checksum mismatch"),
              "v-rootrot: the log names the root file's block 1")
        check_tree(ck, root_of("v-rootrot"), exp_of["v-rootrot"], "v-rootrot")
        # changed files that still match: reported, still verified, exact
        for tag in ("touched", "appended"):
            n = "v-" + tag
            ck.eq(verified(n), "yes", "%s: still verified" % n)
            got = log_has(n, 'file "%s" changed since indexing' % vfile, "still checked")
            ck.eq(len(got), 1, "%s: one log line reports the changed file" % n)
            check_tree(ck, root_of(n), exp_of[n], n)
        # a new file, a root file rewritten: unverified, reported, served
        n = "v-newfile"
        ck.eq(verified(n), "no", "%s: unverified" % n)
        ck.eq(len(log_has(n, 'file "config.json" appeared since indexing')), 1,
              "%s: one log line reports the new file" % n)
        ck.eq(sm.read_file(os.path.join(root_of(n), "config.json")),
              b'{"added": "after indexing"}\n', "%s: the new file is served" % n)
        check_tree(ck, root_of(n), exp_of[n], n)
        n = "v-rootedit"
        ck.eq(verified(n), "no", "%s: unverified" % n)
        ck.eq(len(log_has(n, 'file "%s" changed since indexing' % ROOTFILE, "unverified")), 1,
              "%s: one log line reports the rewritten root file" % n)
        ck.eq(sm.read_file(os.path.join(root_of(n), ROOTFILE)), b"a shorter tokenizer\n",
              "%s: the rewritten root file is served as it is now" % n)
        check_tree(ck, root_of(n), exp_of[n], n)
        # hostile index files: ignored with one line, served unverified
        for tag in sorted(hostile):
            n = "v-h-" + tag
            if not ck.ok(n in listed, "%s is mounted" % n):
                continue
            ck.eq(verified(n), "no", "%s: unverified" % n)
            ck.eq(len(log_has(n, INDEX + " ignored")), 1,
                  "%s: one log line says the index is ignored" % n)
            ck.ok(INDEX not in os.listdir(root_of(n)), "%s: the index is no root file" % n)
            check_tree(ck, root_of(n), exp_of[n], n)
        ck.ok(any("symlink" in l for l in log_has("v-h-symlink", INDEX)),
              "the symlinked index is refused as one")
        ck.eq(verified("v-noindex"), "no", "v-noindex: unverified")
        ck.eq(verified("native"), "yes", "native: verified")
    ck.eq(sm.snapshot_diff(before, sm.store_snapshot(store)), [],
          "the store is unchanged by the mount")


OTHERS = [("hf-bin", "hf/transformers-4.46/llama-bin", "hf"),
          ("hf-st", "hf/transformers-5.24/llama-st", "hf"),
          ("paddle", "paddle/paddle-3.3.1/shard2", "paddle-dcp"),
          ("mcore", "megatron/mcore-0.15.3/distopt", "megatron-torch_dist")]


def test_others(env, ck):
    """shardctl index works the same for every read-only format: the
    Hugging Face, PaddlePaddle and Megatron-Core fixtures get an index,
    mount verified, byte-exact, and shardctl verify passes."""
    top = os.path.dirname(FIXTURES)
    store = env.path("store-others")
    os.makedirs(store)
    for name, rel, _ in OTHERS:
        shutil.copytree(os.path.join(top, rel), os.path.join(store, name))
    for name, _, adapter in OTHERS:
        r = env.shardctl_run("index", os.path.join(store, name), check=False)
        ck.eq(r.returncode, 0, "index %s: %r" % (name, r.stderr[-300:]))
        if r.returncode == 0:
            ck.eq(load_index(os.path.join(store, name))["adapter"], adapter,
                  "%s: the index names adapter %s" % (name, adapter))
        r = env.shardctl_run("verify", os.path.join(store, name), check=False)
        ck.ok(r.returncode == 0 and b"verify: OK" in r.stdout,
              "verify %s passes: %r" % (name, r.stdout[-200:]))
    with sm.Mount(env, store, name="others") as m:
        for name, rel, _ in OTHERS:
            root = os.path.join(m.mnt, name)
            ck.eq(os.getxattr(root, "user.shardfs.verified").decode(), "yes",
                  "%s: verified after indexing" % name)
            with open(os.path.join(top, rel + ".expected.json")) as f:
                check_tree(ck, root, json.load(f), name)


def test_all(env, ck):
    test(env, ck)
    test_others(env, ck)


if __name__ == "__main__":
    sys.exit(sm.main(test_all))
