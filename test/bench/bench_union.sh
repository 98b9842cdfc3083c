#!/bin/bash
# bench_union.sh - the live union under MPI (issue 26, 1): how long after
# a checkpoint appears in one daemon's store the other daemons show it.
#
# Usage: test/bench/bench_union.sh [--bin DIR] [--keep] [N [RANKS]]
#   N      checkpoints made to appear, one after the other (default 100)
#   RANKS  daemons (default 2; more than 2 oversubscribe a small machine)
#
# Starts `mpirun -np RANKS shardfs --mpi STORE%r MNT%r`, then N times:
# writes a small committed shardfs/1 checkpoint (shardctl gen, 2 ranks,
# 256 KiB) beside store 0 and renames it in (it appears at once, whole),
# and times until every other daemon's mount shows it committed (polled
# every 5 ms). Prints the median, 90th percentile and worst latency per
# daemon and over all. Not a ctest test. Always unmounts every mount,
# reaps mpirun and (unless --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_union.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
bench_parse_args "$@"
NCK=${ARGS[0]:-100}
RANKS=${ARGS[1]:-2}
[[ $NCK =~ ^[1-9][0-9]*$ && $RANKS =~ ^[2-9]$ ]] || { echo "$ME: N >= 1, RANKS 2..9" >&2; exit 2; }
bench_need_tools mpirun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

WORK=$(mktemp -d /tmp/sf-bench-union.XXXXXX)
MPID=""
MNTS=()
for r in $(seq 0 $((RANKS - 1))); do
	mkdir -p "$WORK/store$r" "$WORK/mnt$r"
	MNTS+=("$WORK/mnt$r")
done
cleanup() { stop_mounts "$MPID" 20 "${MNTS[@]}"; bench_remove_work; }
trap cleanup EXIT
trap 'exit 130' INT TERM

mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
	-np "$RANKS" "$SHARDFS" --mpi "$WORK/store%r" "$WORK/mnt%r" >"$WORK/mpirun.log" 2>&1 &
MPID=$!
for m in "${MNTS[@]}"; do
	wait_mounted "$m" "$MPID" 60 "$WORK/mpirun.log" || exit 1
done

mkdir -p "$WORK/stage"
: >"$WORK/lat.txt"
for i in $(seq "$NCK"); do
	"$SHARDCTL" gen --ranks 2 --size 256K --no-blobs "$WORK/stage/c$i" >/dev/null
	t0=$(now)
	mv "$WORK/stage/c$i" "$WORK/store0/c$i"
	for r in $(seq 1 $((RANKS - 1))); do
		n=0
		until [[ $(getfattr --only-values -n user.shardfs.state "$WORK/mnt$r/c$i" 2>/dev/null) == committed ]]; do
			sleep 0.005
			n=$((n + 1))
			[[ $n -lt 2000 ]] || { echo "$ME: c$i not shown by rank $r within 10 s" >&2; exit 1; }
		done
		echo "$r $(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }')" >>"$WORK/lat.txt"
	done
done

echo
echo "| daemon | checkpoints | median (ms) | p90 (ms) | worst (ms) |"
echo "|---|---:|---:|---:|---:|"
stats() { # label, then latencies on stdin
	sort -n | awk -v l="$1" '{ v[NR] = $1 * 1000 } END {
		printf "| %s | %d | %.0f | %.0f | %.0f |\n", l, NR, v[int((NR + 1) / 2)],
			v[int(NR * 0.9 + 0.999)], v[NR] }'
}
for r in $(seq 1 $((RANKS - 1))); do
	awk -v r="$r" '$1 == r { print $2 }' "$WORK/lat.txt" | stats "rank $r"
done
[[ $RANKS -le 2 ]] || awk '{ print $2 }' "$WORK/lat.txt" | stats "all"
