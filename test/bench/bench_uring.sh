#!/bin/bash
# bench_uring.sh - shardfs's two transports (issue 29, 1): /dev/fuse's
# read/write loop against FUSE over io_uring, each against the FUSE
# ceiling daemon given the same transport.
#
# Usage: test/bench/bench_uring.sh [--bin DIR] [--ceiling PATH] [--reps N] [--keep] [SIZE]
#   SIZE      checkpoint size for `shardctl gen --layout llama` (default 1G)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --ceiling PATH  the fuse_ceiling binary (default: DIR/../test/bench/
#             fuse_ceiling); without it the ceiling rows are left out
#   --reps N  time every row N times, each on its own fresh daemon, and
#             report the fastest (default 3)
#   --keep    keep the temporary checkpoint and logs
# Needs root: it turns /sys/module/fuse/parameters/enable_uring on for the
# run (and puts the old value back at exit), and the cold rows write
# /proc/sys/vm/drop_caches (which drops the whole machine's clean page
# cache, so other work slows too).
#
# Rows, for each transport (dev, uring), every one on a fresh daemon:
#   ceiling  fuse_ceiling (-x uring for io_uring) serving files of the
#            tensor files' sizes from one buffer, first read: what the
#            transport itself allows
#   first    tensors/ (every tensor file) through a fresh shardfs mount,
#            the payload warm in the page cache (the daemon assembles and
#            verifies every block)
#   again    the same files read again (the mount's page cache: no request
#            reaches the daemon; the transport should not matter)
#   cold     nothing in the page cache: the payload and the mount dropped
#            before the mount
# each with one reader (one cat of all the files) and with four (the
# files dealt round-robin, by size, to four cats at once). The references,
# read in the same run by the same programs: dd bs=1M of the payload files
# one after another, warm and cold (after drop_caches); every ratio is to
# dd (the cold rows' to the cold dd), and the last column is the row's
# uring GB/s over its dev GB/s. Prints a markdown table. Not a ctest test.
# Always unmounts, stops the daemon, restores enable_uring and (unless
# --keep) removes its temporary data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_uring.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
SIZE=1G
bench_parse_args_ceiling "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
PY=/usr/bin/python3
bench_need_tools
[[ -n $CEILING ]] || CEILING=$BIN/../test/bench/fuse_ceiling
PARAM=/sys/module/fuse/parameters/enable_uring
[[ -w $PARAM ]] || { echo "$ME: needs root and a kernel with $PARAM (6.14+, CONFIG_FUSE_IO_URING)" >&2; exit 1; }
[[ -w /proc/sys/vm/drop_caches ]] || { echo "$ME: needs root (/proc/sys/vm/drop_caches)" >&2; exit 1; }
CEILING_SKIP=""
[[ -x $CEILING ]] || CEILING_SKIP="$CEILING not built"

WORK=$(mktemp -d /tmp/sfbench-uring-XXXXXX)
CKPT=$WORK/ckpt
MNT=$WORK/mnt
DPID=""
ROWS=()
declare -A BEST  # what -> "bytes|seconds" of the fastest repetition
OLD_PARAM=$(cat "$PARAM")

cleanup() {
	stop_daemon
	echo "$OLD_PARAM" >"$PARAM" 2>/dev/null || true
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo 1 >"$PARAM"

# read_rows WHAT READERS LIST: one cat of LIST's files (READERS 1) or four
# cats of LIST.0 .. LIST.3 at once (READERS 4); a table row
read_rows() {
	local what=$1 n=$2 list=$3 res t0 t1 bytes=0 f i pids=()
	if [[ $n == 1 ]]; then
		res=$(bench_cat_list "$list") || { echo "$ME: reading $what failed" >&2; exit 1; }
		bench_keep_row "$what" "${res% *}" "${res#* }"
		return
	fi
	t0=$(now)
	for i in 0 1 2 3; do
		xargs -d '\n' -a "$list.$i" cat >/dev/null &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || { echo "$ME: reading $what failed" >&2; exit 1; }; done
	t1=$(now)
	while IFS= read -r f; do bytes=$((bytes + $(stat -c %s "$f"))); done <"$list"
	bench_keep_row "$what" "$bytes" "$(echo "$t1 - $t0" | bc)"
}

drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	cat --version >/dev/null
	xargs --version >/dev/null
	dd --version >/dev/null
	bc </dev/null
}
rewarm() { xargs -d '\n' -a "$WORK/payloads" cat >/dev/null; }

# deal LIST: LIST.0 .. LIST.3, the files dealt by size, largest first, to
# the reader with the fewest bytes so far
deal() {
	$PY - "$1" <<'EOF'
import os, sys
lst = sys.argv[1]
paths = [l.rstrip("\n") for l in open(lst) if l.strip()]
sizes = {}
for p in paths:
    try:
        sizes[p] = os.stat(p).st_size
    except OSError:
        sizes[p] = 0
out, tot = [[] for _ in range(4)], [0] * 4
for p in sorted(paths, key=lambda p: -sizes[p]):
    i = tot.index(min(tot))
    out[i].append(p)
    tot[i] += sizes[p]
for i in range(4):
    with open("%s.%d" % (lst, i), "w") as f:
        f.write("".join(p + "\n" for p in out[i]))
EOF
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "generating a $SIZE llama checkpoint in $CKPT ..." >&2
"$SHARDCTL" gen --layout llama --ranks 4 --size "$SIZE" --seed 1 "$CKPT" >/dev/null
find "$CKPT" -path '*/rank-*' -type f | sort >"$WORK/payloads"
$PY "$HERE/bench_plan.py" "$CKPT" "$MNT" tensors >"$WORK/tensors"

# the tensor files' sizes, for the ceiling, from one untimed mount; the
# four readers' shares of the tensors and of the ceiling's files
bench_start_mount "$SHARDFS" -f -o transport=dev "$CKPT" "$MNT"
deal "$WORK/tensors"
$PY -c 'import os, sys
with open(sys.argv[2], "w") as o:
    for i, p in enumerate(l.strip() for l in open(sys.argv[1]) if l.strip()):
        o.write("%d t%05d\n" % (os.stat(p).st_size, i))' "$WORK/tensors" "$WORK/ceiling.list"
stop_daemon
awk -v m="$MNT" '{print m "/" $2}' "$WORK/ceiling.list" >"$WORK/ceiling"
# the ceiling's files dealt as the tensors are (same sizes, same order)
for i in 0 1 2 3; do
	awk -v m="$MNT" 'NR == FNR {n[$0] = FNR; next} {print m "/t" sprintf("%05d", n[$0] - 1)}' \
		"$WORK/tensors" "$WORK/tensors.$i" >"$WORK/ceiling.$i"
done

RAW="raw payload files (dd bs=1M)"
COLD_RAW="raw payload files (dd bs=1M), cold"
for _ in $(seq "$REPS"); do
	rewarm
	res=$(bench_dd_list "$WORK/payloads")
	bench_keep_row "$RAW" "${res% *}" "${res#* }"
	drop_caches
	res=$(bench_dd_list "$WORK/payloads")
	bench_keep_row "$COLD_RAW" "${res% *}" "${res#* }"
done

for _ in $(seq "$REPS"); do
	for tr in dev uring; do
		x=()
		[[ $tr == dev ]] || x=(-x uring)
		for n in 1 4; do
			r="reader"; [[ $n == 1 ]] || r="readers"
			if [[ -z $CEILING_SKIP ]]; then
				rewarm
				bench_start_mount "$CEILING" -f ${x[@]+"${x[@]}"} "$WORK/ceiling.list" "$MNT"
				read_rows "FUSE ceiling, first read, $n $r|$tr" $n "$WORK/ceiling"
				stop_daemon
			fi
			rewarm
			bench_start_mount "$SHARDFS" -f -o "transport=$tr" "$CKPT" "$MNT"
			read_rows "tensors/, first read, $n $r|$tr" $n "$WORK/tensors"
			read_rows "tensors/, again (page cache), $n $r|$tr" $n "$WORK/tensors"
			stop_daemon
			drop_caches
			bench_start_mount "$SHARDFS" -f -o "transport=$tr" "$CKPT" "$MNT"
			read_rows "tensors/, first read, $n $r, cold|$tr" $n "$WORK/tensors"
			stop_daemon
		done
	done
done

gbs() { awk -F'|' '{printf "%.6f", $1 / $2 / 1e9}' <<<"${BEST[$1]}"; }
raw=$(gbs "$RAW")
cold=$(gbs "$COLD_RAW")
echo
echo "shardfs transports: llama $SIZE, 4 ranks, $(nproc) cores, $(uname -r), best of $REPS, default threads"
echo "(load average at the start: $LOAD0; at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "(ratios to dd bs=1M of the raw payload files in this run, the cold rows' to the cold dd; uring/dev: the row's io_uring GB/s over its /dev/fuse GB/s)"
echo
echo "| what | transport | bytes | seconds | GB/s | ratio vs dd | uring/dev |"
echo "|---|---|---:|---:|---:|---:|---:|"
for what in "$RAW" "$COLD_RAW"; do
	IFS='|' read -r bytes secs <<<"${BEST[$what]}"
	awk -v w="$what" -v b="$bytes" -v s="$secs" 'BEGIN {
		printf "| %s | - | %d | %.3f | %.2f | 1.00 | |\n", w, b, s, b / s / 1e9 }'
done
for what in "${ROWS[@]}"; do
	[[ $what == *"|"* ]] || continue
	name=${what%|*}
	tr=${what##*|}
	ref=$raw
	[[ $name != *", cold" ]] || ref=$cold
	IFS='|' read -r bytes secs <<<"${BEST[$what]}"
	vs=""
	if [[ $tr == uring && -n ${BEST[$name|dev]+set} ]]; then
		vs=$(awk -v u="$(gbs "$what")" -v d="$(gbs "$name|dev")" 'BEGIN {printf "%.2f", u / d}')
	fi
	awk -v w="$name" -v t="$tr" -v b="$bytes" -v s="$secs" -v r="$ref" -v vs="$vs" 'BEGIN {
		g = b / s / 1e9; printf "| %s | %s | %d | %.3f | %.2f | %.2f | %s |\n", w, t, b, s, g, g / r, vs }'
done
[[ -z $CEILING_SKIP ]] || echo "FUSE ceiling rows left out: $CEILING_SKIP"
if grep -qiE 'error|AddressSanitizer' "$WORK/daemon.log"; then
	echo; echo "daemon log has errors:"; grep -iE 'error|AddressSanitizer' "$WORK/daemon.log" | head
fi
