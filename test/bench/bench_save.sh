#!/bin/bash
# bench_save.sh - a framework saving through the mount (issue 26, SPEC 8):
# torch 1.13's DCP save_state_dict from 2 gloo ranks through one daemon's
# mount against the same save to the store directly, and load_state_dict
# through the mount against the store, in the same run.
#
# Usage: test/bench/bench_save.sh [--mpi] [--bin DIR] [--reps N] [--keep] [MIB]
#   MIB       the checkpoint's size in MiB (default 2048)
#   --reps N  best of N runs per row (default 3)
#   --mpi     two daemons with node-local stores instead (below)
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
#
# --mpi: `mpirun -np 2 shardfs --mpi WORK/store%r WORK/mnt%r` (store 0 and
# store 1 separate directories on the disk under /tmp, never /dev/shm: an
# fsync there would write nothing), one table, every row from this run:
#   save, stores     save_state_dict from 2 gloo ranks, rank r's files
#                    straight into a directory of its own beside store r
#                    (same file system; outside the stores, so the daemons
#                    do not pick them up meanwhile), rank 0's .metadata with
#                    its own files (DCP's coordinator writes it)
#   save, mounts     the same, rank r through daemon r's mount (its files
#                    go to store r, hashed as written); ratio stores/mounts
#   dd, stores       the FUSE write path without torch: 2 dd bs=1M
#                    conv=fsync at once, MIB/2 MiB each, into the stores;
#                    and again without fsync (into the page cache: the
#                    write path alone, the disk not waited for)
#   dd, mounts       the same through the mounts (a directory each, made
#                    through the mount, removed after)
#   shown            seconds from the save's return until daemon 0 AND
#                    daemon 1 both show it committed and verified = yes
#                    (median and worst of the runs)
#   load, store 1    load_state_dict (one process) of a checkpoint saved by
#                    2 ranks through daemon 1's mount, its files read
#                    straight from store 1
#   load, mount 0    the same through daemon 0's mount, where none of its
#                    files lie (each block fetched from daemon 1 over MPI,
#                    checked against its write-time hash); ratio
#                    store/mount. Cold (sync + drop_caches before each,
#                    root only) and warm (again right after).
#   dd, cold         the reference reader on the same files, cold: dd bs=1M
#                    of each from store 1, through daemon 0's mount, and
#                    through daemon 1's (its own store: FUSE without MPI)
# Each rank makes its directory before the clock (bench_save_worker.py);
# `sync` before each timed save and dd. The disk needs about 2 x MIB free
# (checked), memory about 2 x MIB for the load process.
# Needs Debian's python3-torch (torch 1.13), and mpirun for --mpi. Prints
# a markdown table. Not a ctest test. Always unmounts, stops the daemons
# and (unless --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_save.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
MPI=0
rest=()
for a in "$@"; do
	if [[ $a == --mpi ]]; then MPI=1; else rest+=("$a"); fi
done
BENCH_ARGV="$*"
bench_parse_args ${rest[@]+"${rest[@]}"}
MIB=${ARGS[0]:-2048}
[[ $MIB =~ ^[1-9][0-9]*$ ]] || { echo "$ME: MIB must be a positive number" >&2; exit 2; }
if [[ $MPI == 1 ]]; then bench_need_tools mpirun; else bench_need_tools; fi
PY=/usr/bin/python3
WORKER=$HERE/bench_save_worker.py
$PY -c 'import torch' 2>/dev/null || { echo "$ME: needs $PY with torch (Debian's python3-torch)" >&2; exit 1; }

# save DIR: 2 ranks (DIR with %r: rank r's own); prints rank 0's seconds
# and the wall clock when the save returned
save() {
	local init=$WORK/init.$RANDOM p1 s
	rm -f "$init"
	$PY "$WORKER" save 1 2 "$init" "$1" "$MIB" >/dev/null &
	p1=$!
	s=$($PY "$WORKER" save 0 2 "$init" "$1" "$MIB")
	wait "$p1"
	echo "$s"
}

min() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a < b) ? a : b }'; }

if [[ $MPI == 1 ]]; then
	# shellcheck source=bench_save_mpi.sh
	source "$HERE/bench_save_mpi.sh"
	exit 0
fi

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

shown() { # MOUNT/NAME: until its state is committed (at most 120 s)
	local t=0
	while [[ $(getfattr --only-values -n user.shardfs.state "$1" 2>/dev/null) != committed ]]; do
		sleep 0.05
		t=$((t + 1))
		[[ $t -lt 2400 ]] || { echo "$ME: $1 not shown within 120 s" >&2; return 1; }
	done
}

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
