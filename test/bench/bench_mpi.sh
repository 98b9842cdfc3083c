#!/bin/bash
# bench_mpi.sh - MPI mode: remote-heavy reads against the single-process
# read of the same checkpoint, and the collective commit of many tensors.
#
# Usage: test/bench/bench_mpi.sh [--bin DIR] [--keep] [SIZE [NTENSORS]]
#   SIZE      checkpoint size for `shardctl gen --layout llama --ranks 4`
#             (default 1G)
#   NTENSORS  tensors in the commit benchmark (default 10000)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --keep    keep the temporary stores and logs (printed at the end)
#   BENCH_QUICK=1 in the environment: 128M and 1000 tensors
#   BENCH_MPI_ONLY=read or =commit: run only that part
#   BENCH_MPI_OPTS: extra shardfs options for the commit cluster, e.g.
#             "--log-level info" (the log then shows the merge time)
#
# Read: one 4-rank checkpoint is generated, then split into 4 node-local
# stores (each with manifest.json and only its own rank-0000R/), and every
# payload file is read once so the page cache is warm on both sides. Timed,
# one run each: every tensors/ file read start to end through a fresh
# single-process mount of the unsplit store, and the same through rank 0 of
# `mpirun -np 4 shardfs --mpi STORE%r MNT%r` (3 of 4 shards of each tensor
# are fetched from peers over MPI; all 4 daemons share this machine).
# Commit: NTENSORS tiny F32 [4, 8] tensors, each split in 4 dim-0 boxes, one
# per rank, written by 4 writer processes (one per rank, through its own
# mount: create, 2 xattrs, one box write per tensor), then the 4
# `shardctl commit` run at once; timed from their start to the last exit.
# Prints a markdown table (what, bytes, seconds, GB/s, ratio). Not a ctest
# test. Always unmounts every mount, reaps mpirun and (unless --keep)
# removes its temporary data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_mpi.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
SIZE=1G
NT=10000
if [[ ${BENCH_QUICK:-0} == 1 ]]; then SIZE=128M; NT=1000; fi
bench_parse_args "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
[[ ${#ARGS[@]} -ge 2 ]] && NT=${ARGS[1]}
[[ $NT =~ ^[0-9]+$ && $NT -ge 1 && $NT -le 1000000 ]] ||
	{ echo "bench_mpi.sh: NTENSORS must be 1..1000000" >&2; exit 2; }
PY=/usr/bin/python3
bench_need_tools mpirun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1

WORK=$(mktemp -d /tmp/sfbench-mpi-XXXXXX)
N=4
SMNT=$WORK/mnt-single
SPID=""          # single-process daemon
MPID=""          # mpirun of the current cluster
MPAT=""          # its mountpoint pattern
ROWS=()          # "what|bytes|seconds|ratio-to-row" rows

stop_single() {
	stop_mounts "$SPID" 10 "$SMNT"
	SPID=""
}

stop_cluster() {
	local r mnts=()
	[[ -n $MPAT ]] || return 0
	for r in $(seq 0 $((N - 1))); do mnts+=("${MPAT//%r/$r}"); done
	stop_mounts "$MPID" 30 "${mnts[@]}"
	MPID=""
	MPAT=""
}

cleanup() {
	stop_single
	stop_cluster
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster() { # STOREPAT MNTPAT TAG [OPTS...]
	local spat=$1 mpat=$2 tag=$3 r
	shift 3
	for r in $(seq 0 $((N - 1))); do mkdir -p "${mpat//%r/$r}"; done
	MPAT=$mpat
	mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
		-np $N "$SHARDFS" --mpi "$@" "$spat" "$mpat" >"$WORK/mpirun-$tag.log" 2>&1 &
	MPID=$!
	for r in $(seq 0 $((N - 1))); do
		wait_mounted "${mpat//%r/$r}" "$MPID" 60 || {
			echo "bench_mpi.sh: cluster $tag did not mount; log:" >&2
			tail -20 "$WORK/mpirun-$tag.log" >&2
			exit 1
		}
	done
}

readall() { # DIR: read every file under it; prints "BYTES SECONDS"
	find "$1" -type f | sort | "$PY" "$HERE/readfiles.py"
}

# ---- read: single process vs 4 daemons, most shards remote ----
ONLY=${BENCH_MPI_ONLY:-}
[[ -z $ONLY || $ONLY == read || $ONLY == commit ]] ||
	{ echo "bench_mpi.sh: BENCH_MPI_ONLY must be read or commit" >&2; exit 2; }
if [[ $ONLY != commit ]]; then
FULL=$WORK/full
"$SHARDCTL" gen --layout llama --ranks $N --size "$SIZE" "$FULL/ck" >/dev/null
for r in $(seq 0 $((N - 1))); do
	d=$WORK/store$r/ck
	mkdir -p "$d"
	for e in "$FULL/ck"/*; do
		b=$(basename "$e")
		case $b in
		rank-*) [[ $b == $(printf 'rank-%05d' "$r") ]] && cp -r "$e" "$d/" ;;
		*) cp -r "$e" "$d/" ;;
		esac
	done
done
cat "$FULL"/ck/rank-*/* "$WORK"/store*/ck/rank-*/* >/dev/null  # warm page cache

mkdir -p "$SMNT"
"$SHARDFS" -f "$FULL" "$SMNT" 2>"$WORK/single.log" &
SPID=$!
wait_mounted "$SMNT" "$SPID" 20 || { echo "bench_mpi.sh: single mount failed" >&2; exit 1; }
read -r sbytes ssec < <(readall "$SMNT/ck/tensors")
stop_single
ROWS+=("single process, tensors/ (all shards local)|$sbytes|$ssec|$ssec")

start_cluster "$WORK/store%r" "$WORK/mnt-read-%r" read
read -r mbytes msec < <(readall "$WORK/mnt-read-0/ck/tensors")
[[ $mbytes == "$sbytes" ]] || { echo "bench_mpi.sh: read $mbytes bytes via MPI, $sbytes single" >&2; exit 1; }
cmp -s <(cat "$FULL/ck/manifest.json") <(cat "$WORK/mnt-read-0/ck/manifest.json") ||
	{ echo "bench_mpi.sh: manifest differs through rank 0" >&2; exit 1; }
stop_cluster
ROWS+=("4 MPI daemons, tensors/ via rank 0 (3/4 of shards remote)|$mbytes|$msec|$ssec")
fi

# ---- commit of NT tiny tensors on 4 ranks ----
if [[ $ONLY != read ]]; then
for r in $(seq 0 $((N - 1))); do mkdir -p "$WORK/cstore$r"; done
start_cluster "$WORK/cstore%r" "$WORK/mnt-commit-%r" commit --commit-timeout 600 ${BENCH_MPI_OPTS:-}
WRITER='
import os, sys
mnt, rank, nt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
root = os.path.join(mnt, "many")
os.makedirs(os.path.join(root, "tensors"), exist_ok=True)
row = bytes([rank]) * 32          # one F32 row of 8 elements
for i in range(nt):
    p = os.path.join(root, "tensors", "t%06d" % i)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
    os.setxattr(p, "user.shardfs.dtype", b"F32")
    os.setxattr(p, "user.shardfs.shape", b"[4,8]")
    fd = os.open("%s@%d:%d,:" % (p, rank, rank + 1), os.O_WRONLY)
    try:
        os.write(fd, row)
    finally:
        os.close(fd)
'
t0=$(date +%s.%N)
pids=()
for r in $(seq 0 $((N - 1))); do
	"$PY" -c "$WRITER" "$WORK/mnt-commit-$r" "$r" "$NT" &
	pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "bench_mpi.sh: a writer failed" >&2; exit 1; }; done
t1=$(date +%s.%N)
pids=()
for r in $(seq 0 $((N - 1))); do
	"$SHARDCTL" commit "$WORK/mnt-commit-$r/many" >"$WORK/commit-$r.out" 2>&1 &
	pids+=($!)
done
for p in "${pids[@]}"; do
	wait "$p" || { echo "bench_mpi.sh: a commit failed:" >&2; cat "$WORK"/commit-*.out >&2; exit 1; }
done
t2=$(date +%s.%N)
st=$(getfattr --only-values -n user.shardfs.state "$WORK/mnt-commit-0/many" 2>/dev/null || echo "?")
[[ $st == committed ]] || { echo "bench_mpi.sh: state after commit: $st" >&2; exit 1; }
want=$("$PY" -c 'import sys; sys.stdout.buffer.write(b"".join(bytes([r])*32 for r in range(4)))' | md5sum)
got=$(md5sum <"$WORK/mnt-commit-2/many/tensors/t$(printf %06d $((NT - 1)))")
[[ $want == "$got" ]] || { echo "bench_mpi.sh: tensor bytes differ after commit" >&2; exit 1; }
stop_cluster
wsec=$(echo "$t1 - $t0" | bc -l)
csec=$(echo "$t2 - $t1" | bc -l)
ROWS+=("write $NT tensors x 4 box shards (4 writers, one per rank)|$((NT * 128))|$wsec|-")
ROWS+=("commit of $NT tensors on 4 ranks (4 concurrent shardctl commit)|-|$csec|-")
fi

# ---- table ----
echo
echo "shardfs MPI benchmark: $(nproc) CPUs, checkpoint $SIZE (llama, 4 ranks), $NT tensors committed; one run each"
echo
echo "| what | bytes | seconds | GB/s | ratio vs single process |"
echo "|---|---:|---:|---:|---:|"
for row in "${ROWS[@]}"; do
	IFS='|' read -r what bytes sec base <<<"$row"
	if [[ $bytes == - ]]; then
		gbs=-
	else
		gbs=$(printf '%.3f' "$(echo "$bytes / $sec / 1000000000" | bc -l)")
	fi
	if [[ $base == - ]]; then ratio=-; else ratio=$(printf '%.2fx' "$(echo "$base / $sec" | bc -l)"); fi
	printf '| %s | %s | %.3f | %s | %s |\n' "$what" "$bytes" "$sec" "$gbs" "$ratio"
done
