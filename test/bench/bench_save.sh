#!/bin/bash
# bench_save.sh - a framework saving through the mount (issue 26, SPEC 8):
# torch 1.13's DCP save_state_dict from 2 gloo ranks through one daemon's
# mount against the same save to the store directly, and load_state_dict
# through the mount against the store, in the same run.
#
# Usage: test/bench/bench_save.sh [--bin DIR] [--reps N] [--keep] [MIB]
#   MIB       the checkpoint's size in MiB (default 2048)
#   --reps N  best of N runs per row (default 3)
#
# Rows (best of --reps; GB/s of checkpoint bytes; ratio to the row it is
# measured against, in this run):
#   save, store      save_state_dict straight into the store (FileSystemWriter
#                    fsyncs every file)
#   save, mount      the same into MOUNT/NAME (hashed as written)
#   shown            seconds from the save's return until the mount shows
#                    it complete and verified (the quiet period is part of
#                    it; median of the runs)
#   load, store      load_state_dict (one process) from the store
#   load, mount      the same from the mount (the framework's own files,
#                    checked against the write-time hashes)
# Needs Debian's python3-torch (torch 1.13). Prints a markdown table. Not a
# ctest test. Always unmounts, stops the daemon and (unless --keep)
# removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_save.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
bench_parse_args "$@"
MIB=${ARGS[0]:-2048}
[[ $MIB =~ ^[1-9][0-9]*$ ]] || { echo "$ME: MIB must be a positive number" >&2; exit 2; }
bench_need_tools
PY=/usr/bin/python3
WORKER=$HERE/bench_save_worker.py
$PY -c 'import torch' 2>/dev/null || { echo "$ME: needs $PY with torch (Debian's python3-torch)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sf-bench-save.XXXXXX)
STORE=$WORK/store
MNT=$WORK/mnt
DPID=""
cleanup() { stop_daemon; bench_remove_work; }
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$STORE" "$MNT" "$WORK/direct"

"$SHARDFS" "$STORE" "$MNT" 2>>"$WORK/daemon.log" &
DPID=$!
wait_mounted "$MNT" "$DPID" 6 "$WORK/daemon.log" || exit 1

# save DIR: 2 ranks; prints rank 0's seconds
save() {
	local init=$WORK/init.$RANDOM p0 p1 s
	rm -f "$init"
	$PY "$WORKER" save 1 2 "$init" "$1" "$MIB" >/dev/null &
	p1=$!
	s=$($PY "$WORKER" save 0 2 "$init" "$1" "$MIB")
	wait "$p1"
	echo "$s"
}

shown() { # MOUNT/NAME: until its state is committed (at most 120 s)
	local t=0
	while [[ $(getfattr --only-values -n user.shardfs.state "$1" 2>/dev/null) != committed ]]; do
		sleep 0.05
		t=$((t + 1))
		[[ $t -lt 2400 ]] || { echo "$ME: $1 not shown within 120 s" >&2; return 1; }
	done
}

min() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a < b) ? a : b }'; }

ss="" sm="" ls="" lm="" shs=()
for i in $(seq "$REPS"); do
	rm -rf "$WORK/direct/s"
	read -r s _ < <(save "$WORK/direct/s"); ss=$(min "$s" "$ss")
	l=$($PY "$WORKER" load "$WORK/direct/s" "$MIB"); ls=$(min "$l" "$ls")
	rm -rf "$WORK/direct/s"
	read -r s tend < <(save "$MNT/s$i"); sm=$(min "$s" "$sm")
	shown "$MNT/s$i"
	shs+=("$(awk -v a="$tend" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')")
	l=$($PY "$WORKER" load "$MNT/s$i" "$MIB"); lm=$(min "$l" "$lm")
	rm -rf "${MNT:?}/s$i"
done
sh=$(printf '%s\n' "${shs[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')

echo
echo "| row | GB/s | ratio | seconds |"
echo "|---|---:|---:|---:|"
awk -v n=$((MIB << 20)) -v ss="$ss" -v sm="$sm" -v sh="$sh" -v ls="$ls" -v lm="$lm" 'BEGIN {
	printf "| save, store | %.2f | 1.00 | %.2f |\n", n / ss / 1e9, ss
	printf "| save, mount | %.2f | %.2f | %.2f |\n", n / sm / 1e9, ss / sm, sm
	printf "| shown verified after the save returned | | | %.2f |\n", sh
	printf "| load, store | %.2f | 1.00 | %.2f |\n", n / ls / 1e9, ls
	printf "| load, mount | %.2f | %.2f | %.2f |\n", n / lm / 1e9, ls / lm, lm
}'
