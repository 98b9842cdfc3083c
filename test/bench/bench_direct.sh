#!/bin/bash
# bench_direct.sh - the direct data path (issue 29, 2): loading every
# tensor of a mounted checkpoint with the Python package, directly from
# the store's files (user.shardfs.where, XXH3 checked in process) and
# through the mount, against dd of the same payload files in the same run.
#
# Usage: test/bench/bench_direct.sh [--bin DIR] [--reps N] [--keep] [SIZE]
#   SIZE      total tensor bytes of the 4-rank llama-layout checkpoint
#             (default 2G; K/M/G suffixes as shardctl gen takes them)
#   --reps N  best of N runs per row (default 3)
#
# Rows (best of --reps; GB/s of tensor bytes; ratio to the dd row of the
# same temperature, measured in this run):
#   dd          dd bs=1M of every payload file (the bytes the tensors are)
#   direct      shardfs.open(CKPT).numpy() of every tensor, direct path on
#   mount       the same with direct=False (every byte through FUSE)
#   safetensors dd bs=1M of the mount's model.safetensors
#   fresh arrays  the same Python process start, then arrays of the
#               tensors' total size allocated and one byte per page
#               written: what any loader into new arrays pays before a
#               byte is read (on a VM whose balloon reports free pages,
#               page faults on fresh memory cost the host's faults too)
# "cold": page cache dropped before each side (needs root), the mount
# fresh; "warm": the payload files in the page cache (the mount's own
# page cache dropped by a fresh mount). Prints a markdown table. Not a
# ctest test. Always unmounts, stops the daemon and (unless --keep)
# removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
ME=bench_direct.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
bench_parse_args "$@"
SIZE=${ARGS[0]:-2G}
bench_need_tools dd
PY=/usr/bin/python3
$PY -c 'import numpy, xxhash' 2>/dev/null || {
	echo "$ME: needs $PY with numpy and xxhash (Debian's python3-numpy, python3-xxhash)" >&2
	exit 1
}

WORK=$(mktemp -d /tmp/sf-bench-direct.XXXXXX)
STORE=$WORK/store
MNT=$WORK/mnt
DPID=""
cleanup() { stop_daemon; bench_restore_memory; bench_remove_work; }
trap cleanup EXIT
trap 'exit 130' INT TERM
bench_steady_memory "$ME"
mkdir -p "$STORE" "$MNT"

"$SHARDCTL" gen --layout llama --ranks 4 --size "$SIZE" --block-size 4M "$STORE/ck" >/dev/null
mapfile -t PAYLOADS < <(find "$STORE/ck" -name '*.bin' -type f | sort)
NBYTES=$($PY -c '
import json, sys
m = json.load(open(sys.argv[1]))
n = 0
for t in m["tensors"].values():
    k = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4, "U8": 1, "I8": 1,
         "BOOL": 1, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2}[t["dtype"]]
    for d in t["shape"]:
        k *= d
    n += k
print(n)' "$STORE/ck/manifest.json")
echo "# checkpoint: llama layout, 4 ranks, $((NBYTES >> 20)) MiB of tensors in ${#PAYLOADS[@]} payload files, 4 MiB blocks"

start_daemon() {
	"$SHARDFS" "$STORE" "$MNT" 2>>"$WORK/daemon.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 6 "$WORK/daemon.log" || exit 1
}

COLD=0
[[ -w /proc/sys/vm/drop_caches ]] && COLD=1
drop() {
	[[ $COLD == 1 ]] || return 0
	sync
	echo 3 >/proc/sys/vm/drop_caches
	$PY -c 'import numpy, xxhash, sys; sys.path.insert(0, sys.argv[1]); import shardfs' "$TOP/python"
	dd --version >/dev/null
}

# seconds of one run of the row named $1 (a fresh mount each time)
run_row() {
	local what=$1 t0 t1
	start_daemon
	[[ $2 == cold ]] && drop
	t0=$(now)
	case $what in
	dd) dd bs=1M status=none if=/dev/null of=/dev/null
	    for f in "${PAYLOADS[@]}"; do dd bs=1M status=none if="$f" of=/dev/null; done ;;
	direct|mount)
		$PY - "$TOP/python" "$MNT/ck" "$what" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import shardfs
ck = shardfs.open(sys.argv[2], direct=(sys.argv[3] == "direct"))
for n in ck.names():
    ck[n].numpy()
s = ck.stats
if sys.argv[3] == "direct" and s.get("mount_bytes"):
    print("direct: %d bytes through the mount: %r" % (s["mount_bytes"], s["reasons"]),
          file=sys.stderr)
EOF
		;;
	safetensors) dd bs=1M status=none if="$MNT/ck/model.safetensors" of=/dev/null ;;
	fresh)
		$PY - "$TOP/python" "$NBYTES" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import numpy, shardfs  # noqa: F401  (the same imports as the loader rows)
a = numpy.empty(int(sys.argv[2]), dtype=numpy.uint8)
a[::4096] = 1
EOF
		;;
	esac
	t1=$(now)
	stop_daemon
	echo "$t0 $t1" | awk '{ printf "%.4f", $2 - $1 }'
}

best() {
	local b="" s
	for _ in $(seq "$REPS"); do
		s=$(run_row "$1" "$2")
		if [[ -z $b ]] || awk -v a="$s" -v b="$b" 'BEGIN { exit !(a < b) }'; then b=$s; fi
	done
	echo "$b"
}

# warm: the payload files read once into the page cache first
for f in "${PAYLOADS[@]}"; do cat "$f" >/dev/null; done

echo
echo "($(bench_memory_label))"
echo "| row | temperature | GB/s | ratio to dd |"
echo "|---|---|---:|---:|"
for temp in warm cold; do
	if [[ $temp == cold && $COLD == 0 ]]; then
		echo "| (cold rows) | cold | - | needs root to drop the page cache |"
		continue
	fi
	[[ $temp == warm ]] && for f in "${PAYLOADS[@]}"; do cat "$f" >/dev/null; done
	base=$(best dd "$temp")
	for row in dd direct mount safetensors fresh; do
		if [[ $row == dd ]]; then s=$base; else s=$(best "$row" "$temp"); fi
		[[ $temp == warm ]] && for f in "${PAYLOADS[@]}"; do cat "$f" >/dev/null; done
		awk -v n="$NBYTES" -v s="$s" -v b="$base" -v r="$row" -v t="$temp" \
			'BEGIN { printf "| %s | %s | %.2f | %.2f |\n", r, t, n / s / 1e9, b / s }'
	done
done
