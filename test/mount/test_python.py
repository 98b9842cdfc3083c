#!/usr/bin/python3
"""Mount test: the shardfs Python package against real mounts (issue 14,
item 9).

- shardfs.open(MOUNT/CKPT) on generated checkpoints (BF16 weights with
  F16/BOOL/U8 buffers, F8_E4M3 weights, F32): names, dtype names and shapes
  equal the unsharded reference's (`shardctl gen --ref`), every tensor's
  array holds the reference's bytes (read and mmap), BF16 comes back as
  uint16 with .dtype_name "BF16" and as float32 equal to a conversion of
  the raw bytes done here, F8 as uint8 with its dtype_name;
- slices: t[...] (ints, negative indices, steps, Ellipsis; read through
  tensors/NAME@BOX) equal numpy's indexing of the reference, and a box
  outside the shape raises IndexError;
- the reader of model.safetensors on the mount's file: every tensor equal
  to the reference, its __metadata__ naming the checkpoint;
- npy/ leaves out BF16/F8 tensors, and the daemon says so once per
  checkpoint (--log-level info), with the count and the dtypes; a
  checkpoint with only numpy dtypes gets no such line;
- shardfs.save through a mount of an empty store: box shards (two ranks'
  pieces of a BF16 tensor given as the arrays the reader returns, their
  dtype taken from .dtype_name), flat ranges cut inside elements, a whole
  F32 tensor, a 0-d I64, a root file; commit; read back with shardfs.open
  equal to what was saved; a second checkpoint with a gap: commit raises
  CommitError with the daemon's reason and the state stays writable;
- tools/shardfs_save.py still works as a command (demo --check, ls) and as
  the module the other tests import.
"""

import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import sfmount as sm  # noqa: E402

try:
    import shardfs
except ImportError:
    sys.path.insert(0, os.path.join(TOP, "python"))
    import shardfs


def bf16_to_f32_by_bytes(raw):
    return np.frombuffer(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)),
                         dtype="<f4")


def random_key(rng, shape):
    key = []
    for n in shape:
        k = rng.random()
        if k < 0.2 and n:
            key.append(rng.randrange(-n, n))
        elif k < 0.3 and Ellipsis not in key:
            key.append(Ellipsis)
        else:
            key.append(slice(rng.randrange(-n - 1, n + 2), rng.randrange(-n - 1, n + 2),
                             rng.choice([None, 1, 2, -1, -3])))
    return tuple(key[:rng.randrange(len(key) + 1)])


def check_ckpt(env, ck, root, ref, label):
    c = shardfs.open(root)
    ck.ok(isinstance(c, shardfs.Checkpoint), "%s: opens as a Checkpoint" % label)
    ck.eq(c.format, "shardfs/1", "%s: format" % label)
    ck.eq(c.state, "committed", "%s: state" % label)
    ck.eq(c.names(), sorted(ref.tensors, key=lambda s: s.encode()), "%s: names" % label)
    for name in c.names():
        t = c[name]
        want = ref.tensors[name]
        raw = ref.tensor_bytes(name)
        ck.eq((t.dtype_name, list(t.shape), t.nbytes), (want["dtype"], want["shape"],
                                                         len(raw)),
              "%s: %s: dtype, shape, size" % (label, name))
        a = t.numpy()
        ck.ok(a.dtype == shardfs.dtypes.raw_dtype(want["dtype"]) and
              a.dtype_name == want["dtype"] and list(a.shape) == want["shape"],
              "%s: %s: array of %s, dtype_name %s" % (label, name, a.dtype, a.dtype_name))
        ck.bytes_eq(a.tobytes(), raw, "%s: %s: bytes" % (label, name))
        ck.bytes_eq(t.numpy(mmap=True).tobytes(), raw, "%s: %s: mmap bytes" % (label, name))
        if want["dtype"] == "BF16":
            f = t.numpy(float32=True)
            ck.ok(f.dtype == np.float32 and f.dtype_name == "F32" and
                  f.reshape(-1).tobytes() == bf16_to_f32_by_bytes(raw).tobytes(),
                  "%s: %s: BF16 as float32 vs the bytes" % (label, name))
        elif want["dtype"] in ("F16", "F32"):
            f = t.numpy(float32=True)
            ck.ok(np.array_equal(f, a.astype(np.float32)), "%s: %s: float32" % (label, name))
        arr = ref.array(name)
        for _ in range(3 if want["shape"] else 0):
            key = random_key(env.rng, want["shape"])
            got = t[key]
            exp = np.asarray(arr[key])
            ck.ok(got.shape == exp.shape and got.tobytes() == exp.tobytes() and
                  got.dtype_name == want["dtype"],
                  "%s: %s[%r]: %s vs the reference's %s" % (label, name, key, got.shape,
                                                           exp.shape))
        if want["shape"]:
            try:
                t.read_box([(0, want["shape"][0] + 1)] + [(0, n) for n in want["shape"][1:]])
                ck.ok(False, "%s: %s: a box past the shape should raise" % (label, name))
            except IndexError:
                ck.ok(True, "")
    with c.safetensors() as st:
        ck.eq(st.names(), c.names(), "%s: model.safetensors names" % label)
        ck.eq(st.metadata.get("shardfs.checkpoint"), ref.name,
              "%s: model.safetensors names the checkpoint" % label)
        for name in st.names():
            ck.bytes_eq(st.numpy(name).tobytes(), ref.tensor_bytes(name),
                        "%s: model.safetensors %s" % (label, name))
    st = shardfs.open(os.path.join(root, "model.safetensors"))
    ck.ok(isinstance(st, shardfs.SafetensorsFile) and len(st) == len(ref.tensors),
          "%s: shardfs.open of model.safetensors" % label)
    st.close()


def npy_line(log, name):
    for line in log.splitlines():
        if 'checkpoint "%s": npy/ leaves out' % name in line:
            return line
    return None


def check_read(env, ck):
    store = env.path("store")
    os.makedirs(store)
    refs = {
        "bf16": env.gen(os.path.join(store, "bf16"), ranks=3, size="512K", dtype="BF16"),
        "f8": env.gen(os.path.join(store, "f8"), ranks=2, size="256K", dtype="F8_E4M3",
                      layout="llama"),
        "f32": env.gen(os.path.join(store, "f32"), ranks=2, size="256K", dtype="F32",
                       layout="llama"),
    }
    with sm.Mount(env, store, opts=["--log-level", "info"]) as m:
        for name, ref in sorted(refs.items()):
            check_ckpt(env, ck, os.path.join(m.mnt, name), ref, name)
            left = sorted(n for n, t in ref.tensors.items()
                          if t["dtype"] in ("BF16", "F8_E4M3", "F8_E5M2"))
            dts = sorted({ref.tensors[n]["dtype"] for n in left})
            npy = set()
            for dp, _, fns in os.walk(os.path.join(m.mnt, name, "npy")):
                rel = os.path.relpath(dp, os.path.join(m.mnt, name, "npy"))
                npy.update(f[:-4] if rel == "." else rel + "/" + f[:-4] for f in fns)
            ck.eq(sorted(set(ref.tensors) - npy), left,
                  "%s: npy/ leaves out exactly the BF16/F8 tensors" % name)
            line = npy_line(m.log_text(), name)
            if left:
                ck.ok(line is not None and (" %d tensor" % len(left)) in line and
                      all(d in line for d in dts) and "tensors/ or model.safetensors" in line,
                      "%s: the log says npy/ leaves out %d tensors of %s: %r" % (
                          name, len(left), dts, line))
            else:
                ck.eq(line, None, "%s: no npy/ line when every dtype has a numpy type" % name)
        for name in refs:
            ck.eq(m.log_text().count('checkpoint "%s": npy/ leaves out' % name),
                  1 if name != "f32" else 0, "%s: the npy/ line comes once" % name)
        try:
            shardfs.open(os.path.join(m.mnt, "bf16", "npy"))
            ck.ok(False, "shardfs.open of a directory that is no checkpoint should raise")
        except ValueError as e:
            ck.ok("tensors/" in str(e), "it says why: %s" % e)


def check_save(env, ck):
    empty = env.path("wstore")
    os.makedirs(empty)
    rng = np.random.default_rng(env.seed)
    # what the reader returns (a TensorArray with dtype_name "BF16") goes
    # straight back into save: the dtype comes from .dtype_name
    bf16 = (rng.standard_normal((8, 6), dtype=np.float32).view(np.uint32) >> 16).astype(
        np.uint16)
    f32 = rng.standard_normal((5, 7), dtype=np.float32)
    flat = rng.integers(0, 1 << 16, size=(4, 10), dtype=np.uint16)   # F16 bits
    step = np.array(1234, dtype=np.int64)
    cfg = json.dumps({"hidden": 6}).encode()
    with sm.Mount(env, empty) as m:
        shards = [
            shardfs.Shard("w/bf16", shardfs.tensor.labelled(bf16[:3], "BF16"),
                          shape=bf16.shape, offsets=[0, 0]),
            shardfs.Shard("w/bf16", shardfs.tensor.labelled(bf16[3:], "BF16"),
                          shape=bf16.shape, offsets=[3, 0]),
            shardfs.Shard("f16", flat.tobytes()[:33], shape=flat.shape, flat=0, dtype="F16"),
            shardfs.Shard("f16", flat.tobytes()[33:], shape=flat.shape, flat=33, dtype="F16"),
            shardfs.Shard("norm", f32),
            shardfs.Shard("step", step),
        ]
        shardfs.save(m.mnt, "py", shards, files={"config.json": cfg})
        root = os.path.join(m.mnt, "py")
        c = shardfs.open(root)
        ck.eq(c.state, "committed", "save() committed")
        ck.eq(c.names(), ["f16", "norm", "step", "w/bf16"], "saved names")
        want = {"w/bf16": ("BF16", bf16), "f16": ("F16", flat.view("<f2")),
                "norm": ("F32", f32), "step": ("I64", step)}
        for name, (dt, arr) in sorted(want.items()):
            a = c.numpy(name)
            ck.ok(a.dtype_name == dt and a.shape == arr.shape and
                  a.tobytes() == np.ascontiguousarray(arr).tobytes(),
                  "save round trip: %s (%s %s)" % (name, a.dtype_name, a.shape))
        ck.eq(sm.read_file(os.path.join(root, "config.json")), cfg, "root file")
        ck.ok(c["w/bf16"][2:5, 1::2].tobytes() == bf16[2:5, 1::2].tobytes(),
              "a box across both saved shards")

        gap = [shardfs.Shard("g", np.zeros((4, 4), np.float32)[:2], shape=[4, 4],
                             offsets=[0, 0])]
        shardfs.save(m.mnt, "gap", gap, commit=False)
        ck.eq(shardfs.state(m.mnt, "gap"), "writing", "save(commit=False) leaves it writing")
        try:
            shardfs.commit(m.mnt, "gap")
            ck.ok(False, "commit of a checkpoint with a gap should raise CommitError")
        except shardfs.CommitError as e:
            ck.ok("gap" in e.reason, "CommitError carries the reason: %r" % e.reason)
        ck.ok(shardfs.state(m.mnt, "gap").startswith("failed"),
              "the state says failed: %r" % shardfs.state(m.mnt, "gap"))
        shardfs.save(m.mnt, "gap", [shardfs.Shard("g", np.zeros((4, 4), np.float32)[2:],
                                                  shape=[4, 4], offsets=[2, 0])])
        ck.eq(shardfs.state(m.mnt, "gap"), "committed", "filled and committed")

        # the command line, and the module the other tests import
        tool = os.path.join(TOP, "tools", "shardfs_save.py")
        r = subprocess.run([sys.executable, tool, "demo", m.mnt, "demo", "--check"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        ck.ok(r.returncode == 0 and b"read back: 6 tensors equal" in r.stdout,
              "shardfs_save.py demo --check: %r" % r.stdout)
        r = subprocess.run([sys.executable, tool, "ls", root], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        ck.ok(r.returncode == 0 and b"w/bf16\tBF16\t[8, 6]" in r.stdout,
              "shardfs_save.py ls: %r" % r.stdout)
        r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); "
                            "import shardfs_save as s; print(s.save is __import__("
                            "'shardfs').save, sorted(s.__all__) == sorted(__import__("
                            "'shardfs.writer').writer.__all__))" % os.path.join(TOP, "tools")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                           env=dict(os.environ, PYTHONPATH=""))
        ck.eq(r.stdout.strip(), b"True True", "import shardfs_save is the package's writer")


def test(env, ck):
    print("shardfs from", shardfs.__file__)
    ck.ok(os.path.realpath(shardfs.__file__).startswith(os.path.join(TOP, "python")),
          "the package under test is the source tree's: %s" % shardfs.__file__)
    check_read(env, ck)
    check_save(env, ck)


if __name__ == "__main__":
    sys.exit(sm.main(test))
