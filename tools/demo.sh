#!/usr/bin/env bash
# tools/demo.sh - the main job on a demo checkpoint: install what is
# missing, build, generate a 4-rank sharded checkpoint, mount it, use it
# with ordinary tools, unmount. Run as root on Debian 12.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/tools/deps.sh" --minimal
cmake -S "$top" -B "$top/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$top/build" -j "$(nproc)" --target shardfs shardctl >/dev/null
bin="$top/build/tools"
demo="$top/demo"
mnt="$demo/mnt"
pid=""
cleanup() {
	if mountpoint -q "$mnt" 2>/dev/null; then
		fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt"
	fi
	[ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
}
trap cleanup EXIT
run() { printf '\n$ %s\n' "$*"; "$@"; }

rm -rf "$demo/store"
mkdir -p "$demo/store" "$mnt"
run "$bin/shardctl" gen --layout mixed --ranks 4 --size 64M "$demo/store/step-1000"
run "$bin/shardctl" info "$demo/store/step-1000" | sed -n 1,12p

"$bin/shardfs" -f "$demo/store" "$mnt" 2>"$demo/shardfs.log" &
pid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || { cat "$demo/shardfs.log"; exit 1; }

cd "$mnt"
run ls -l step-1000
run ls step-1000/tensors/optim
t=step-1000/tensors/model.embed_tokens.weight
[ -e "$t" ] || t=$(find step-1000/tensors -type f | head -1)
run od -A d -t x2 -N 32 "$t"
run getfattr -d -m user.shardfs "$t"
run stat -c '%n %s bytes' "$t@0:2,:"
run od -A d -t x2 -N 16 "$t@0:2,:"
npy=$(find step-1000/npy -name '*.npy' | head -1)
run /usr/bin/python3 - "$mnt" "$npy" <<'PY'
import json, struct, sys
import numpy as np
mnt, npy = sys.argv[1], sys.argv[2]
a = np.load(npy, mmap_mode="r")
print(f"numpy.load({npy!r}): dtype={a.dtype} shape={a.shape} mean={float(np.asarray(a, dtype=np.float64).mean()):.6f}")
with open(f"{mnt}/step-1000/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
names = [k for k in hdr if k != "__metadata__"]
print(f"model.safetensors: {len(names)} tensors, header {n} bytes, first: {names[0]} {hdr[names[0]]}")
PY
cd /
echo
echo "demo: OK (log in $demo/shardfs.log)"
