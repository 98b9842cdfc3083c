#!/usr/bin/python3
"""Mount test: shardfs mounted the way a system mounts things (issue 14,
item 5).

`cmake --install` into a temporary prefix puts shardfs, shardctl and the
mount helper sbin/mount.fuse.shardfs in place. From there:
- `mount.fuse3 'shardfs#STORE' DIR -o ro,allow_other,...` (fuse3's helper,
  which runs `shardfs STORE DIR -o OPTS` from PATH) mounts; ro and
  allow_other show in /proc/self/mountinfo, shardfs's own -o options
  (log_file, log_level) take effect, a tensor reads byte-exact, a write
  fails with EROFS, plain `umount` ends the daemon;
- `shardfs STORE DIR -o ...` (options after the paths) and bad -o values;
- `mount -t fuse.shardfs STORE DIR -o ...` and a line of a temporary fstab
  (`mount -T FSTAB DIR`): mount(8) looks for helpers only in /sbin and
  resets PATH, so these run in a private mount namespace where an overlay
  on /usr/sbin adds the installed helper (nothing of the system changes;
  the namespace and its mounts vanish with the test). The PATH mount(8)
  gives does not hold the prefix: only the helper can find shardfs;
- `findmnt --verify` accepts the fstab line.
"""

import argparse
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sfmount as sm  # noqa: E402
import sysmount as sy  # noqa: E402

CMAKE = None
BUILD = None
SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def try_write(path):
    """errno of opening path for writing (0: it opened)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        return e.errno
    os.close(fd)
    return 0


def install(env, ck):
    prefix = env.path("prefix")
    r = subprocess.run([CMAKE, "--install", BUILD, "--prefix", prefix],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120)
    ck.eq(r.returncode, 0, "cmake --install: %s" % r.stdout.decode()[-500:])
    for rel in ("bin/shardfs", "bin/shardctl", "sbin/mount.fuse.shardfs"):
        ck.ok(os.access(os.path.join(prefix, rel), os.X_OK),
              "installed: %s" % rel)
    return prefix


def check_mount_fuse3(env, ck, prefix, store, ref, tensor):
    mnt = sy.guard(env.path("mnt-fuse3"))
    os.makedirs(mnt)
    log = env.path("fuse3.log")
    penv = dict(os.environ, PATH=os.path.join(prefix, "bin") + ":" + SYS_PATH)
    r = subprocess.run(["mount.fuse3", "shardfs#" + store, mnt, "-o",
                        "ro,allow_other,log_level=info,log_file=%s,cache_mb=64" % log],
                       env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    ck.eq(r.returncode, 0, "mount.fuse3 'shardfs#STORE' DIR -o ro,allow_other: %r"
          % r.stderr[-500:])
    if not ck.ok(sy.wait_mount(mnt), "mount.fuse3: mounted"):
        return
    info = sy.mountinfo(mnt)
    ck.ok(info and "ro" in info[0], "mount.fuse3: ro in mountinfo: %r" % (info,))
    ck.ok(info and "allow_other" in info[3] and "default_permissions" in info[3],
          "mount.fuse3: allow_other (and default_permissions) in mountinfo: %r" % (info,))
    ck.ok(info and info[1] == "fuse.shardfs" and info[2] == "shardfs:" + store,
          "mount.fuse3: type and source: %r" % (info,))
    pids = sy.daemon_pids(mnt)
    ck.ok(len(pids) == 1 and os.readlink("/proc/%d/exe" % pids[0]) ==
          os.path.join(prefix, "bin", "shardfs"),
          "mount.fuse3 ran the installed shardfs: %r" % pids)
    p = sm.tensor_path(os.path.join(mnt, "ck"), tensor)
    ck.bytes_eq(sm.read_file(p), ref.tensor_bytes(tensor), "mount.fuse3: tensor bytes")
    ck.eq(try_write(p), errno.EROFS, "mount.fuse3: writing fails with EROFS")
    text = sm.read_text(log)
    ck.ok("info: fs: serving %s at %s" % (store, mnt) in text,
          "-o log_file and log_level took effect: %r" % text[-500:])
    # a plain umount, as fstab users do, ends the daemon
    r = subprocess.run(["umount", mnt], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    ck.eq(r.returncode, 0, "umount: %r" % r.stdout)
    ck.ok(sy.wait_gone(pids), "the daemon exits after umount")
    ck.ok(not sm.is_mounted(mnt), "unmounted")


def check_shardfs_conventions(env, ck, store, ref, tensor):
    """Options after the paths; shardfs's own -o keys; bad values."""
    mnt = sy.guard(env.path("mnt-after"))
    os.makedirs(mnt)
    proc = subprocess.Popen([env.shardfs, store, mnt, "-f", "-o",
                             "ro,no_verify,cache_mb=64,nofail,_netdev,x-systemd.automount,defaults",
                             "-o", "rw,nodev,nosuid"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sm._cleanups.append(lambda: proc.poll() is None and proc.kill())
    if ck.ok(sm.wait_mounted(proc, [mnt], sm.MOUNT_WAIT_S) is not None,
             "shardfs STORE DIR -f -o ...: mounted"):
        p = sm.tensor_path(os.path.join(mnt, "ck"), tensor)
        ck.bytes_eq(sm.read_file(p), ref.tensor_bytes(tensor), "options after paths: bytes")
        info = sy.mountinfo(mnt)
        ck.ok(info and "nodev" in info[0] and "nosuid" in info[0],
              "FUSE options pass through: %r" % (info,))
        subprocess.run(["fusermount3", "-u", mnt], timeout=30)
    try:
        out = proc.communicate(timeout=20)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0].decode(errors="replace")
    ck.eq(proc.returncode, 0, "the daemon exits cleanly: %s" % out[-500:])
    for argv, rc, words in (
            (["-o", "cache_mb=lots"], 2, ["cache_mb", "lots"]),
            (["-o", "log_level=loud"], 2, ["log_level", "loud"]),
            (["-o", "log_file="], 2, ["log_file"]),
            (["-o", "ro,no_such_option_here"], 1, ["no_such_option_here"]),
            (["extra-path"], 2, ["extra-path"])):
        r = subprocess.run([env.shardfs, "-f", store, mnt] + argv,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        err = r.stderr.decode(errors="replace")
        ck.ok(r.returncode == rc and all(w in err for w in words),
              "shardfs %s: exit %d naming it (got %d: %r)" % (argv, rc, r.returncode, err[-300:]))
        ck.ok(not sm.is_mounted(mnt), "%s: nothing mounted" % argv)


FSTAB_OPTS = "ro,allow_other,nofail,_netdev,x-systemd.automount,log_level=info,log_file=%s"


def check_fstab_verify(env, ck, store):
    """findmnt parses and accepts the documented fstab line."""
    if shutil.which("findmnt") is None:
        print("SKIP (not counted): findmnt is not installed")
        return
    mnt = env.path("mnt-verify")
    os.makedirs(mnt)
    tab = env.path("fstab-verify")
    with open(tab, "w") as f:
        f.write("# shardfs\n%s %s fuse.shardfs %s 0 0\n" % (
            store, mnt, FSTAB_OPTS % env.path("verify.log")))
    r = subprocess.run(["findmnt", "--verify", "--verbose", "--tab-file", tab],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    out = r.stdout.decode(errors="replace")
    ck.ok(r.returncode == 0 and "0 parse errors, 0 errors" in out,
          "findmnt --verify accepts the fstab line: %s" % out)
    ck.ok("allow_other,log_level=info,log_file=" in out,
          "and hands shardfs's options to the helper: %s" % out)
    os.rmdir(mnt)


# ------------------------------------------------- in a mount namespace

def ns_child(spec_path):
    """Runs inside `unshare -m`: the mount(8) cases. Prints JSON results."""
    with open(spec_path) as f:
        spec = json.load(f)
    res = {}
    upper, work = spec["upper"], spec["work"]
    os.symlink(os.path.join(spec["prefix"], "sbin", "mount.fuse.shardfs"),
               os.path.join(upper, "mount.fuse.shardfs"))
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        "lowerdir=/usr/sbin,upperdir=%s,workdir=%s" % (upper, work),
                        "/usr/sbin"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(json.dumps({"skip": "overlay on /usr/sbin: %s" % r.stdout.decode()}))
        return 0
    res["helper_seen"] = os.path.exists("/sbin/mount.fuse.shardfs")
    env = dict(os.environ, PATH=SYS_PATH)  # mount(8) resets PATH anyway
    for case in spec["cases"]:
        out = {}
        mnt = case["mnt"]
        r = subprocess.run(case["argv"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        out["rc"] = r.returncode
        out["out"] = r.stdout.decode(errors="replace")[-1000:]
        out["mounted"] = sy.wait_mount(mnt, 10) if r.returncode == 0 else False
        if out["mounted"]:
            out["info"] = sy.mountinfo(mnt)
            out["pids"] = sy.daemon_pids(mnt)
            out["exe"] = [os.readlink("/proc/%d/exe" % p) for p in out["pids"]]
            p = os.path.join(mnt, "ck", "tensors", spec["tensor"])
            try:
                out["sha256"] = sha256(p)
            except OSError as e:
                out["sha256"] = "errno %d" % e.errno
            out["write_errno"] = try_write(p)
            u = subprocess.run(["umount", mnt], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=30)
            out["umount_rc"] = u.returncode
            out["gone"] = sy.wait_gone(out["pids"])
            out["still_mounted"] = sm.is_mounted(mnt)
        sy.cleanup(mnt)
        res[case["name"]] = out
    print(json.dumps(res))
    return 0


def check_mount8(env, ck, prefix, store, ref, tensor):
    ok, why = sy.can_unshare()
    if not ok:
        print("SKIP (not counted): mount -t fuse.shardfs and fstab need a private "
              "mount namespace to put the helper in /sbin: %s" % why)
        return
    upper, work = env.path("ovl-upper"), env.path("ovl-work")
    os.makedirs(upper)
    os.makedirs(work)
    mnt_t = sy.guard(env.path("mnt-typed"))
    mnt_f = sy.guard(env.path("mnt-fstab"))
    os.makedirs(mnt_t)
    os.makedirs(mnt_f)
    log_t, log_f = env.path("typed.log"), env.path("fstab.log")
    tab = env.path("fstab")
    with open(tab, "w") as f:
        f.write("%s %s fuse.shardfs %s 0 0\n" % (store, mnt_f, FSTAB_OPTS % log_f))
    spec = {
        "upper": upper, "work": work, "prefix": prefix, "tensor": tensor,
        "cases": [
            {"name": "mount -t fuse.shardfs", "mnt": mnt_t,
             "argv": ["mount", "-t", "fuse.shardfs", store, mnt_t, "-o",
                      "ro,allow_other,nodev,nosuid,log_level=info,log_file=%s" % log_t]},
            {"name": "fstab line", "mnt": mnt_f, "argv": ["mount", "-T", tab, mnt_f]},
        ],
    }
    spec_path = env.path("ns-spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                        os.path.abspath(__file__), "--ns-child", spec_path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=150)
    if not ck.eq(r.returncode, 0, "namespace child: %r" % r.stderr[-1000:]):
        return
    res = json.loads(r.stdout.decode().strip().splitlines()[-1])
    if "skip" in res:
        print("SKIP (not counted): %s" % res["skip"])
        return
    ck.ok(res.get("helper_seen"), "the helper is in /sbin inside the namespace")
    want = hashlib.sha256(ref.tensor_bytes(tensor)).hexdigest()
    for case, log in (("mount -t fuse.shardfs", log_t), ("fstab line", log_f)):
        out = res.get(case, {})
        ck.eq(out.get("rc"), 0, "%s: exit status (%s)" % (case, out.get("out")))
        if not ck.ok(out.get("mounted"), "%s: mounted" % case):
            continue
        info = out.get("info") or [[], "", "", []]
        ck.ok("ro" in info[0] and "allow_other" in info[3],
              "%s: ro and allow_other in mountinfo: %r" % (case, info))
        ck.eq(info[1], "fuse.shardfs", "%s: type" % case)
        ck.eq(out.get("exe"), [os.path.join(prefix, "bin", "shardfs")],
              "%s: the helper ran the installed shardfs (PATH without it)" % case)
        ck.eq(out.get("sha256"), want, "%s: tensor bytes" % case)
        ck.eq(out.get("write_errno"), errno.EROFS, "%s: writing fails with EROFS" % case)
        ck.eq(out.get("umount_rc"), 0, "%s: umount" % case)
        ck.ok(out.get("gone") and not out.get("still_mounted"),
              "%s: the daemon exits after umount" % case)
        text = sm.read_text(log)
        ck.ok("info: fs: serving" in text, "%s: -o log_file took effect: %r"
              % (case, text[-300:]))
    ck.ok("nodev" in (res.get("mount -t fuse.shardfs", {}).get("info") or [[]])[0],
          "mount -t: nodev reached the mount")


def test(env, ck):
    sy.sanitizer_logs(env)
    run(env, ck)
    # every daemon has exited by now: their reports are complete
    ck.eq(sy.sanitizer_reports(env), [], "no sanitizer reports from any daemon")


def run(env, ck):
    store = env.path("store")
    os.makedirs(store)
    ref = env.gen(os.path.join(store, "ck"), size="256K")
    tensor = sorted(ref.tensors)[0]
    prefix = install(env, ck)
    check_shardfs_conventions(env, ck, store, ref, tensor)
    check_mount_fuse3(env, ck, prefix, store, ref, tensor)
    check_fstab_verify(env, ck, store)
    check_mount8(env, ck, prefix, store, ref, tensor)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ns-child":
        sys.exit(ns_child(sys.argv[2]))
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--cmake", required=True, help="the cmake that installs")
    ap.add_argument("--build", required=True, help="the build directory")
    known, rest = ap.parse_known_args()
    CMAKE, BUILD = known.cmake, os.path.abspath(known.build)
    sys.exit(sm.main(test, rest))
