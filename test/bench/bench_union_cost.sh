#!/bin/bash
# bench_union_cost.sh - what the live union costs a daemon (issue 26, 1):
# memory per checkpoint name it knows and per (file, holder) pair of the
# file lists it fetched, and the time to fetch a list.
#
# Usage: test/bench/bench_union_cost.sh [--bin DIR] [--keep] [C [F]]
#   C  checkpoints made to appear in store 1 (default 1000)
#   F  files in each (default 100; empty, under data/, so no format shows
#      them: every daemon still judges each one, fetching its list)
#
# Two runs of `mpirun -np 2 shardfs --mpi STORE%r MNT%r`: one with the
# default list cache and one with SHARDFS_INV_CACHE=1 (names only, the
# lists dropped after each judgement). Each run: rank 0's RSS once
# mounted, then the C x F files written into store 1 (beside it, renamed
# in), then rank 0's RSS once it knows every name and has judged each (its CPU time stands still; the counts are what
# rank 0 logs at unmount). Prints the growth per name and per cached
# pair. Not a ctest test. Always unmounts every mount,
# reaps mpirun and (unless --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_union_cost.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
bench_parse_args "$@"
NC=${ARGS[0]:-1000}
NF=${ARGS[1]:-100}
[[ $NC =~ ^[1-9][0-9]*$ && $NF =~ ^[1-9][0-9]*$ && $((NC * NF)) -le 2000000 ]] ||
	{ echo "$ME: C, F >= 1, C x F <= 2,000,000" >&2; exit 2; }
bench_need_tools mpirun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

WORK=$(mktemp -d /tmp/sf-bench-ucost.XXXXXX)
MPID=""
MNTS=("$WORK/mnt0" "$WORK/mnt1")
cleanup() { stop_mounts "$MPID" 20 "${MNTS[@]}"; bench_remove_work; }
trap cleanup EXIT
trap 'exit 130' INT TERM

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }

# The pid of the daemon of rank $1 under mpirun $MPID.
rank_pid() {
	local p
	for p in $(pgrep -f -- "$WORK/store%r" || true); do
		if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
			grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# run LABEL CACHE: one run; appends "LABEL rss0 rss1 names pairs fetched"
# to $WORK/rows.
run() {
	local label=$1 cache=$2 p0 r0 r1 names pairs fetched n=0
	rm -rf "$WORK/store0" "$WORK/store1" "$WORK/stage"
	mkdir -p "$WORK/store0" "$WORK/store1" "$WORK/mnt0" "$WORK/mnt1" "$WORK/stage"
	SHARDFS_INV_CACHE=$cache mpirun --allow-run-as-root --bind-to none \
		--mca btl self,vader -x SHARDFS_INV_CACHE -np 2 \
		"$SHARDFS" --mpi --log-level info --log-file "$WORK/$label.%r.log" \
		"$WORK/store%r" "$WORK/mnt%r" >"$WORK/$label.log" 2>&1 &
	MPID=$!
	for m in "${MNTS[@]}"; do
		wait_mounted "$m" "$MPID" 60 "$WORK/$label.log" || exit 1
	done
	p0=$(rank_pid 0) || { echo "$ME: no rank 0 process" >&2; exit 1; }
	sleep 1
	r0=$(rss_kib "$p0")
	/usr/bin/python3 - "$WORK/stage" "$NC" "$NF" <<'PY'
import os, sys
stage, nc, nf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for c in range(nc):
    d = os.path.join(stage, "ck%05d" % c, "data")
    os.makedirs(d)
    for f in range(nf):
        open(os.path.join(d, "shard-%06d.bin" % f), "wb").close()
PY
	for d in "$WORK/stage"/*; do mv "$d" "$WORK/store1/"; done
	# rank 0 has judged every checkpoint when it is idle again (under 5%
	# of a core over 2 s: its 250 ms rounds alone take about 1%)
	local last=-100000 cur
	while :; do
		sleep 2
		cur=$(awk '{ print $14 + $15 }' "/proc/$p0/stat")
		[[ $((cur - last)) -ge 10 ]] || break
		last=$cur
		n=$((n + 1))
		[[ $n -lt 300 ]] || { echo "$ME: rank 0 still busy after 600 s" >&2; exit 1; }
	done
	r1=$(rss_kib "$p0")
	stop_mounts "$MPID" 60 "${MNTS[@]}"
	MPID=""
	read -r names pairs fetched < <(sed -n \
		's/.*inventory: \([0-9]*\) checkpoint names known, \([0-9]*\) (file, holder) pairs cached.* \([0-9]*\) lists fetched.*/\1 \2 \3/p' \
		"$WORK/$label.0.log" | tail -1)
	[[ -n ${names:-} ]] || { echo "$ME: rank 0 logged no inventory line" >&2; exit 1; }
	echo "$label $r0 $r1 $names $pairs $fetched" >>"$WORK/rows"
}

: >"$WORK/rows"
run cache-default ""
run cache-1 1

echo
echo "| run | names known | pairs cached | lists fetched | rank 0 RSS before (MiB) | after (MiB) | growth (MiB) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
awk '{ printf "| %s | %d | %d | %d | %.1f | %.1f | %.1f |\n", $1, $4, $5, $6, $2 / 1024, $3 / 1024, ($3 - $2) / 1024 }' "$WORK/rows"
awk 'NR == 1 { gd = $3 - $2; pd = $5 } NR == 2 { gn = $3 - $2; nn = $4 }
	END { if (nn > 0) printf "\nper name known: %.0f bytes; ", gn * 1024 / nn
	      if (pd > 0) printf "per cached (file, holder) pair: %.0f bytes\n", (gd - gn) * 1024 / pd }' "$WORK/rows"
