#!/bin/bash
# bench_write.sh - write throughput through a shardfs mount against dd to a
# local file on the same filesystem as the store.
#
# Usage: test/bench/bench_write.sh [--bin DIR] [--keep] [SIZE]
#   SIZE      bytes per write, a multiple of 1 MiB (default 1G; dd suffixes)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --keep    keep the temporary store and logs (printed at the end)
#   --reps N  runs of each row; the table shows the fastest (default 3)
#   BENCH_QUICK=1 in the environment: a 128M smoke run, one run per row
#
# One source file of SIZE random bytes is made and read once, so every run
# reads it from the page cache. Then, one run each, on this machine:
#   local file        dd if=SRC of=STOREFS/local.bin bs=1M
#   mount, flat       dd bs=1M into tensors/flat (a U8 [SIZE] tensor): one
#                     flat shard
#   mount, box        dd bs=1M into tensors/box@:,0:C (the left half of an
#                     F32 [R, 2C] tensor, a dim-1 box of SIZE bytes) through
#                     the slice path
# each twice: "cached" ends when dd has closed its output (conv=fsync on
# neither side: the bytes may still sit in the page cache), "synced" adds
# `sync -f` of the store's filesystem to the timed span on both sides, so the
# bytes are on disk. Before every run the store filesystem is synced
# (untimed) so one run's dirty pages do not slow the next. Each mount run
# writes into its own checkpoint, discarded afterwards with `shardctl rm`.
# Prints a markdown table (what, bytes, seconds, GB/s, ratio vs the local
# file of the same column), the daemon's peak RSS and CPU time. Not a ctest
# test. Always unmounts, stops the daemon and (unless --keep) removes its
# temporary data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_write.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
SIZE=1G
REPS=3
[[ ${BENCH_QUICK:-0} == 1 ]] && SIZE=128M && REPS=1
bench_parse_args "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
bench_need_tools
BYTES=$(numfmt --from=iec "$SIZE")
MIBS=$((BYTES / 1048576))
((MIBS > 0 && MIBS * 1048576 == BYTES)) ||
	{ echo "bench_write.sh: SIZE must be a positive multiple of 1M" >&2; exit 2; }
# the box: left half of an F32 [R, 2C] tensor, R*C*4 = BYTES
BOX_C=1024
BOX_R=$((BYTES / (BOX_C * 4)))

WORK=$(mktemp -d /tmp/sfbench-write-XXXXXX)
STORE=$WORK/store
MNT=$WORK/mnt
DPID=""          # the running daemon, if any
ROWS=()          # "what|column|seconds" rows

cleanup() {
	stop_daemon
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$STORE" "$MNT"
echo "making a $SIZE random source file ..." >&2
head -c "$BYTES" /dev/urandom >"$WORK/src.bin"
cat "$WORK/src.bin" >/dev/null          # in the page cache for every run

"$SHARDFS" -f "$STORE" "$MNT" 2>>"$WORK/daemon.log" &
DPID=$!
wait_mounted "$MNT" "$DPID" 6 "$WORK/daemon.log" || exit 1

# declare CKPT NAME DTYPE SHAPE: a fresh checkpoint with one tensor
declare_tensor() {
	mkdir -p "$MNT/$1/tensors"
	touch "$MNT/$1/tensors/$2"
	setfattr -n user.shardfs.dtype -v "$3" "$MNT/$1/tensors/$2"
	setfattr -n user.shardfs.shape -v "$4" "$MNT/$1/tensors/$2"
}

# Give every run the same memory to write into: drop the clean page cache
# (the last run's pages, the removed checkpoints') and read the source back
# in. Without it, rows vary 2-4x with what ran before them: on this VM the
# first touch of a guest page the host has not backed recently costs tens of
# microseconds, so a writer that gets recycled pages runs far faster than
# one that gets cold ones. BENCH_NO_DROP=1 skips it (needs root otherwise).
settle_memory() {
	[[ ${BENCH_NO_DROP:-0} == 1 ]] && return 0
	echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || return 0
	cat "$WORK/src.bin" >/dev/null
}

# timed_dd COLUMN DEST: dd the source into DEST, seconds in LAST_S;
# COLUMN "synced" includes sync -f of the store filesystem
timed_dd() {
	local col=$1 dest=$2 t0 t1
	sync -f "$STORE"
	settle_memory
	t0=$(now)
	dd if="$WORK/src.bin" of="$dest" bs=1M status=none ||
		{ echo "bench_write.sh: dd into $dest failed; daemon log:" >&2; tail "$WORK/daemon.log" >&2; exit 1; }
	[[ $col == synced ]] && sync -f "$STORE"
	t1=$(now)
	LAST_S=$(echo "$t1 - $t0" | bc)
}

# one_run KIND COLUMN: one write of KIND (local, flat, box) into a fresh
# destination, removed afterwards; seconds in LAST_S
run=0
one_run() {
	local kind=$1 col=$2
	run=$((run + 1))
	case $kind in
	local)
		timed_dd "$col" "$STORE/local.bin"
		rm -f "$STORE/local.bin" ;;
	flat)
		declare_tensor "flat-$run" flat U8 "[$BYTES]"
		timed_dd "$col" "$MNT/flat-$run/tensors/flat"
		"$SHARDCTL" rm "$MNT/flat-$run" >/dev/null ;;
	box)
		declare_tensor "box-$run" box F32 "[$BOX_R,$((2 * BOX_C))]"
		timed_dd "$col" "$MNT/box-$run/tensors/box@:,0:$BOX_C"
		"$SHARDCTL" rm "$MNT/box-$run" >/dev/null ;;
	esac
}

for col in cached synced; do
	for kind in local flat box; do
		best=""
		for _ in $(seq "$REPS"); do
			one_run "$kind" "$col"
			if [[ -z $best ]] || (($(echo "$LAST_S < $best" | bc))); then
				best=$LAST_S
			fi
		done
		case $kind in
		local) what="local file (dd bs=1M)" ;;
		flat) what="mount, flat tensor (dd bs=1M into tensors/flat)" ;;
		box) what="mount, dim-1 box (dd bs=1M into tensors/box@:,0:$BOX_C)" ;;
		esac
		ROWS+=("$what|$col|$best")
	done
done
RSS=$(awk '/^VmHWM:/ {print $2}' "/proc/$DPID/status" 2>/dev/null || echo 0)
CPU=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' \
	"/proc/$DPID/stat" 2>/dev/null || echo 0)
stop_daemon

echo
echo "shardfs write benchmark: $SIZE per write, $(nproc) cores, $(uname -r)," \
	"store on $(df -T "$STORE" | awk 'NR == 2 {print $2}'), best of $REPS runs"
echo "cached: until dd closes its output (conv=fsync on neither side);" \
	"synced: plus sync -f of the store filesystem (both sides)"
echo
echo "| what | column | bytes | seconds | GB/s | ratio vs local file |"
echo "|---|---|---:|---:|---:|---:|"
for r in "${ROWS[@]}"; do
	IFS='|' read -r what col secs <<<"$r"
	base=""
	for l in "${ROWS[@]}"; do
		IFS='|' read -r lw lc ls <<<"$l"
		[[ $lw == local* && $lc == "$col" ]] && base=$ls
	done
	awk -v w="$what" -v c="$col" -v b="$BYTES" -v s="$secs" -v base="$base" \
		'BEGIN { printf "| %s | %s | %d | %.3f | %.2f | %.2f |\n", w, c, b, s, b / s / 1e9, base / s }'
done
echo
awk -v rss="$RSS" -v cpu="$CPU" \
	'BEGIN { printf "daemon: peak RSS %.1f MiB, CPU %s s (user + system, all mount runs)\n", rss / 1024, cpu }'
if grep -qiE 'error|AddressSanitizer' "$WORK/daemon.log"; then
	echo; echo "daemon log has errors:"; grep -iE 'error|AddressSanitizer' "$WORK/daemon.log" | head
fi
