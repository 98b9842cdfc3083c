"""shardfs.direct - the direct data path (issue 29, 2): a tensor of a
mounted checkpoint read straight from this node's store files, with the
caller's own permissions, its bytes checked against the checkpoint's XXH3
block checksums here, in process.

The mount tells where the bytes lie: the xattr user.shardfs.where of
tensors/NAME (SPEC section 3 addition) lists each shard with its geometry,
file offset, length and checksums, and, where this node's store holds the
file and the caller may read it, the file's absolute path and identity
(dev, ino, size, mtime_ns). Such a shard is read here: the file opened
with O_NOFOLLOW, its identity compared, each block hashed and compared.
Everything else is read through the mount, as a plain read would: a shard
without a path (another node's, no checksums, compressed, not readable by
the caller), a file that changed since the daemon looked, an open that is
denied, a block whose checksum differs (the mount then verifies it too and
answers EIO where it is corrupt: never wrong bytes). Without the xxhash
module nothing is read directly.

Reads run in a few threads (os.preadv releases the GIL); `stats` counts
the bytes each way and the reasons for the mount reads.
"""

import concurrent.futures
import json
import os

from .dtypes import np

WHERE_XATTR = "user.shardfs.where"
WHERE_MAX = 1 << 16          # the daemon's bound on the value
TASK_BYTES = 32 << 20        # one read task: this many bytes at most
THREADS = 4

try:
    import xxhash as _xxhash
    _xxh3 = _xxhash.xxh3_64          # streaming: a block may span rows
    _xxh3_int = _xxhash.xxh3_64_intdigest
except (ImportError, AttributeError):   # the fallback: the mount
    _xxh3 = _xxh3_int = None
SCATTER_RUN = 256 << 10      # runs this long are read in place (preadv)
IOV_MAX = 1024               # buffers per preadv call


def available():
    """True when this Python can check checksums (the xxhash module)."""
    return _xxh3 is not None


class _Fallback(Exception):
    """These bytes are read through the mount instead (the reason)."""


class DirectReader:
    """Reads tensors of a Checkpoint: direct where offered, else through
    `mount` (the checkpoint's plain reader)."""

    def __init__(self, ck, mount, threads=THREADS):
        self.ck = ck
        self.mount = mount
        self.threads = threads
        self.stats = {"direct_bytes": 0, "mount_bytes": 0, "reasons": {}}
        self._pool = None

    def _note(self, nbytes, reason=None):
        if reason is None:
            self.stats["direct_bytes"] += nbytes
        else:
            self.stats["mount_bytes"] += nbytes
            r = self.stats["reasons"]
            r[reason] = r.get(reason, 0) + 1

    def memmap(self, t):
        return self.mount.memmap(t)

    def read_box(self, t, box):
        return self.mount.read_box(t, box)

    def _where(self, t):
        try:
            raw = os.getxattr(self.ck.tensor_path(t.name), WHERE_XATTR)
        except OSError as e:
            raise _Fallback("no where (%s)" % (e.strerror or e)) from None
        if len(raw) > WHERE_MAX:
            raise _Fallback("where too long")
        try:
            w = json.loads(raw)
            bs = int(w["block_size"])
            shards = list(w["shards"])
        except (ValueError, KeyError, TypeError):
            raise _Fallback("where unreadable") from None
        if w.get("nbytes") != t.nbytes or bs <= 0:
            raise _Fallback("where disagrees with the tensor")
        return bs, shards

    def read_into(self, t, buf):
        """Fill buf (t.nbytes writable bytes) with tensor t."""
        if _xxh3 is None:
            self._note(t.nbytes, "no xxhash module")
            return self.mount.read_into(t, buf)
        try:
            bs, shards = self._where(t)
            plan = _plan(t, shards)
        except _Fallback as e:
            self._note(t.nbytes, str(e))
            return self.mount.read_into(t, buf)
        out = memoryview(buf).cast("B")
        tasks = []
        for ent, geo in plan:
            tasks.extend(_tasks(ent, geo, bs))
        if not tasks:
            return None
        try:
            for ent, geo in plan:     # each file opened once, read ahead
                geo["why"] = _open_shard(ent, geo)
            if self.threads > 1 and len(tasks) > 1:
                if self._pool is None:   # one pool for the reader's life
                    self._pool = concurrent.futures.ThreadPoolExecutor(self.threads)
                res = list(self._pool.map(lambda k: self._run(t, out, k), tasks))
            else:
                res = [self._run(t, out, k) for k in tasks]
        finally:
            for _, geo in plan:
                if geo.get("fd") is not None:
                    os.close(geo["fd"])
                    geo["fd"] = None
        # A shard not read and checked whole goes through the mount.
        failed = {}
        for k, reason in zip(tasks, res):
            if reason is not None:
                failed.setdefault(id(k["geo"]), reason)
        for _, geo in plan:
            if geo["nbytes"] == 0:
                continue
            reason = failed.get(id(geo))
            self._note(geo["nbytes"], reason)
            if reason is not None:
                self._mount_region(t, out, geo)
        return None

    def _run(self, t, out, k):
        """One task: None when read and checked, else the reason."""
        geo = k["geo"]
        if geo["why"] is not None:
            return geo["why"]
        fd = geo["fd"]
        try:
            lo, hi = k["lo"], k["hi"]          # shard bytes [lo, hi)
            pos = geo["file_offset"] + lo
            bs, sums = k["bs"], geo["xxh3"]
            if geo["run"] < SCATTER_RUN and len(geo["rows"]) > 1:
                # short runs: one read aside, hashed, then spread out
                data = memoryview(np().empty(hi - lo, dtype=np().uint8))
                if os.preadv(fd, [data], pos) != hi - lo:
                    return "short read"
                for b in range(lo // bs, (hi + bs - 1) // bs):
                    s, e = b * bs - lo, min((b + 1) * bs, hi) - lo
                    if b >= len(sums) or _xxh3_int(data[s:e]) != sums[b]:
                        return "checksum differs"
                _scatter(out, geo, lo, hi, data)
                return None
            segs = _segments(out, geo, lo, hi)
            for i in range(0, len(segs), IOV_MAX):
                batch = segs[i:i + IOV_MAX]
                want = sum(len(v) for v in batch)
                if os.preadv(fd, batch, pos) != want:
                    return "short read"
                pos += want
            h, p, b = _xxh3(), lo, lo // bs
            end = min((b + 1) * bs, hi)
            for v in segs:
                i, n = 0, len(v)
                while i < n:
                    take = min(n - i, end - p)
                    h.update(v[i:i + take])
                    i += take
                    p += take
                    if p == end:
                        if b >= len(sums) or h.intdigest() != sums[b]:
                            return "checksum differs"
                        h.reset()
                        b += 1
                        end = min((b + 1) * bs, hi)
            return None
        except _Fallback as e:
            return str(e)
        except OSError as e:
            return "read: %s" % (e.strerror or e)

    def _mount_region(self, t, out, geo):
        """Read one shard's region of t through the mount into out."""
        if geo["flat"] is not None:
            off, n = geo["flat"]
            fd = os.open(self.ck.tensor_path(t.name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                view, done = out[off:off + n], 0
                while done < n:
                    m = os.preadv(fd, [view[done:]], off + done)
                    if m <= 0:
                        raise OSError("%s: short read through the mount" % t.name)
                    done += m
            finally:
                os.close(fd)
            return
        if not t.ndim:
            self.mount.read_into(t, out)
            return
        box = [(a, a + n) for a, n in zip(geo["offsets"], geo["lengths"])]
        arr = self.mount.read_box(t, box)
        _place(t, out, geo, arr.reshape(-1).view(np().uint8))


def _open_shard(ent, geo):
    """Open the file of an offered shard (geo["fd"]) and ask the kernel to
    read its range ahead: None, or the reason it is read through the
    mount (no path, a denied open, a file that changed since)."""
    geo["fd"] = None
    if geo["nbytes"] == 0:
        return None
    if "path" not in ent:
        return str(ent.get("why", "not offered"))
    try:
        fd = os.open(ent["path"], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return "open: %s" % (e.strerror or e)
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        return "open: %s" % (e.strerror or e)
    if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (
            ent.get("dev"), ent.get("ino"), ent.get("size"), ent.get("mtime_ns")):
        os.close(fd)
        return "file changed"
    try:
        os.posix_fadvise(fd, geo["file_offset"], geo["nbytes"], os.POSIX_FADV_WILLNEED)
    except OSError:
        pass                      # advice only
    geo["fd"] = fd
    return None


def _place(t, out, geo, data):
    """Copy a box's row-major bytes (data) into out (t's whole bytes): one
    contiguous run per index of the box's outer dimensions, copied as
    bytes (the trailing dimensions the box holds whole join its run)."""
    shape, offs, lens = list(t.shape), geo["offsets"], geo["lengths"]
    inner, d = t.itemsize, t.ndim
    while d > 1 and offs[d - 1] == 0 and lens[d - 1] == shape[d - 1]:
        inner *= shape[d - 1]
        d -= 1
    run = lens[d - 1] * inner
    strides = [0] * d
    acc = inner
    for j in range(d - 1, -1, -1):
        strides[j] = acc
        acc *= shape[j]
    base = sum(o * st for o, st in zip(offs[:d], strides))
    whole = np().frombuffer(out, dtype=np().uint8)
    dst = np().lib.stride_tricks.as_strided(
        whole[base:], shape=tuple(lens[:d - 1]) + (run,),
        strides=tuple(strides[:d - 1]) + (1,), writeable=True)
    dst[...] = np().frombuffer(data, dtype=np().uint8).reshape(
        tuple(lens[:d - 1]) + (run,))


def _plan(t, shards):
    """[(entry, geometry)] for t's shards, one of each set of replicas
    (the same box or range), or _Fallback when they do not tile t exactly
    once (partial overlaps are the mount's to resolve)."""
    plan, total, seen = [], 0, {}
    for ent in shards:
        sh = ent.get("shard") if isinstance(ent, dict) else None
        if not isinstance(sh, dict):
            raise _Fallback("where unreadable")
        try:
            nbytes = int(sh["nbytes"])
            sums = [int(x, 16) for x in sh.get("xxh3", [])]
            geo = {"nbytes": nbytes, "file_offset": int(sh["file_offset"]),
                   "xxh3": sums, "flat": None}
            if "flat" in sh:
                off, n = (int(x) for x in sh["flat"])
                if n != nbytes or off < 0 or off + n > t.nbytes:
                    raise _Fallback("where disagrees with the tensor")
                geo["flat"] = (off, n)
                geo["run"], geo["rows"], geo["stride"] = max(n, 1), [off], None
            else:
                offs = [int(x) for x in sh["offsets"]]
                lens = [int(x) for x in sh["lengths"]]
                if "strides" in sh or len(offs) != t.ndim or len(lens) != t.ndim:
                    raise _Fallback("strided or odd shard")
                numel = 1
                for a, n, d in zip(offs, lens, t.shape):
                    if a < 0 or n < 0 or a + n > d:
                        raise _Fallback("where disagrees with the tensor")
                    numel *= n
                if numel * t.itemsize != nbytes:
                    raise _Fallback("where disagrees with the tensor")
                geo["offsets"], geo["lengths"] = offs, lens
                geo["run"], geo["rows"], geo["stride"] = _rows(t, offs, lens)
        except (KeyError, TypeError, ValueError):
            raise _Fallback("where unreadable") from None
        key = ("f",) + geo["flat"] if geo["flat"] is not None else (
            "b", tuple(geo["offsets"]), tuple(geo["lengths"]))
        if key in seen:      # a replica: keep the one this node may read
            i = seen[key]
            if "path" in ent and "path" not in plan[i][0]:
                plan[i] = (ent, geo)
            continue
        seen[key] = len(plan)
        total += nbytes
        plan.append((ent, geo))
    if total != t.nbytes:
        raise _Fallback("shards overlap or leave gaps")
    return plan


def _rows(t, offs, lens):
    """(run, rows, stride): a box of t as the runs of t's bytes it holds,
    in its own row-major order: each run bytes long, at the byte offsets
    rows (the trailing dimensions the box holds whole join its run);
    stride: the distance between runs when it is one, else None."""
    shape = list(t.shape)
    inner, d = t.itemsize, t.ndim
    while d > 1 and offs[d - 1] == 0 and lens[d - 1] == shape[d - 1]:
        inner *= shape[d - 1]
        d -= 1
    if d == 0:
        return max(inner, 1), [0], None
    strides, acc = [0] * d, inner
    for j in range(d - 1, -1, -1):
        strides[j] = acc
        acc *= shape[j]
    base = sum(o * st for o, st in zip(offs[:d], strides))
    run = max(lens[d - 1] * inner, 1)
    rows = np().zeros([1], dtype=np().int64) + base
    for j in range(d - 1):   # outer dimensions, slowest first
        rows = (rows[:, None] + np().arange(lens[j], dtype=np().int64) *
                strides[j]).reshape(-1)
    # one outer dimension: the runs are evenly spaced
    return run, rows.tolist(), strides[0] if d == 2 else None


def _segments(out, geo, lo, hi):
    """The views of out that shard bytes [lo, hi) go to, in order."""
    run, rows = geo["run"], geo["rows"]
    segs = []
    for r in range(lo // run, (hi + run - 1) // run):
        a, b = max(lo - r * run, 0), min(hi - r * run, run)
        d = rows[r]
        segs.append(out[d + a:d + b])
    return segs


def _scatter(out, geo, lo, hi, data):
    """Copy shard bytes [lo, hi) (data) to their runs in out."""
    run, rows = geo["run"], geo["rows"]
    r, p, i = lo // run, lo, 0
    if p > r * run:                                   # a run's tail
        a = p - r * run
        take = min(run - a, hi - p)
        out[rows[r] + a:rows[r] + a + take] = data[:take]
        i, p, r = take, p + take, r + 1
    nfull = (hi - p) // run
    if nfull and geo["stride"] is not None:           # evenly spaced runs
        whole = np().frombuffer(out, dtype=np().uint8)
        dst = np().lib.stride_tricks.as_strided(
            whole[rows[r]:], shape=(nfull, run), strides=(geo["stride"], 1),
            writeable=True)
        dst[...] = np().frombuffer(data[i:i + nfull * run],
                                   dtype=np().uint8).reshape(nfull, run)
    else:
        for k in range(nfull):
            d = rows[r + k]
            out[d:d + run] = data[i + k * run:i + (k + 1) * run]
    i, p, r = i + nfull * run, p + nfull * run, r + nfull
    if p < hi:                                        # a run's head
        out[rows[r]:rows[r] + hi - p] = data[i:i + hi - p]


def _tasks(ent, geo, bs):
    """Read tasks for one shard: runs of whole blocks, TASK_BYTES at most."""
    n = geo["nbytes"]
    if n == 0:
        return []
    step = max(bs, (TASK_BYTES // bs) * bs)
    return [{"ent": ent, "geo": geo, "lo": lo, "hi": min(lo + step, n), "bs": bs}
            for lo in range(0, n, step)]
