#!/bin/bash
# bench_mpi.sh - MPI mode: remote-heavy reads against the single-process
# read of the same checkpoint, and the collective commit of many tensors.
#
# Usage: test/bench/bench_mpi.sh [--bin DIR] [--keep] [--reps N] [SIZE [NTENSORS]]
#   SIZE      checkpoint size for `shardctl gen --layout llama --ranks 4`
#             (default 1G)
#   NTENSORS  tensors in the commit benchmark (default 10000)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --keep    keep the temporary stores and logs (printed at the end)
#   --reps N  reads: best of N fresh mounts for each row (default 3)
#   BENCH_QUICK=1 in the environment: 128M and 1000 tensors
#   BENCH_MPI_ONLY=read or =commit: run only that part
#   BENCH_MPI_OPTS: extra shardfs options for the commit cluster, e.g.
#             "--log-level info" (the log then shows the merge time)
#   BENCH_MPI_READ_OPTS: extra shardfs options for the read cluster, e.g.
#             "--log-level info" (each rank's log line at exit then counts
#             its remote reads asked ahead and on demand); with --keep the
#             logs stay in WORK/mpirun-readN.log
#   BENCH_MPI_MCA: extra mpirun options for the read cluster, e.g.
#             "--mca btl_vader_single_copy_mechanism none" (the row then
#             says so)
#
# Read: one 4-rank checkpoint is generated, then split into 4 node-local
# stores (each with manifest.json and only its own rank-0000R/), and every
# payload file is read once so the page cache is warm on both sides. Timed,
# best of N each: every tensors/ file read start to end through a fresh
# single-process mount of the unsplit store, and the same through rank 0 of
# a fresh `mpirun -np 4 shardfs --mpi STORE%r MNT%r` (3 of 4 shards of each
# tensor are fetched from peers over MPI; all 4 daemons share this
# machine). Right before each timed read a helper touches 512 MiB and
# exits, for both rows alike: on this VM memory freed more than about 2 s
# earlier goes back to the host and costs up to 20x more to touch again
# (pre-faulting 256 MiB, the reading daemon's block pool: 0.03 s right after
# a free, 0.4-0.8 s a few seconds later), and the 4-daemon cluster takes
# seconds longer to start than one daemon, so without it the MPI row paid
# that more often than the single one. Under the table: the CPU seconds the
# daemons spent during the best read of each row (all 4 daemons for MPI,
# rank 0's part named).
# Commit: NTENSORS tiny F32 [4, 8] tensors, each split in 4 dim-0 boxes, one
# per rank, written by 4 writer processes (one per rank, through its own
# mount: create, 2 xattrs, one box write per tensor), then the 4
# `shardctl commit` run at once; timed from their start to the last exit.
# Then the same again into a second checkpoint, declared 1,000 tensors per
# setxattr of user.shardfs.declare on tensors/ before the box writes, each
# opened relative to an open tensors/ (openat: the checkpoint's own entry,
# never cached by the kernel, is not looked up again for every box).
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
REPS=3
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
NOTES=()         # lines printed under the table

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
	bench_restore_memory
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bench_steady_memory "$ME"

start_cluster() { # STOREPAT MNTPAT TAG [OPTS...]
	local spat=$1 mpat=$2 tag=$3 r mca=()
	shift 3
	for r in $(seq 0 $((N - 1))); do mkdir -p "${mpat//%r/$r}"; done
	MPAT=$mpat
	[[ $tag == read* ]] && read -r -a mca <<<"${BENCH_MPI_MCA:-}"
	mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
		"${mca[@]}" -np $N "$SHARDFS" --mpi "$@" "$spat" "$mpat" >"$WORK/mpirun-$tag.log" 2>&1 &
	MPID=$!
	for r in $(seq 0 $((N - 1))); do
		wait_mounted "${mpat//%r/$r}" "$MPID" 60 || {
			echo "bench_mpi.sh: cluster $tag did not mount; log:" >&2
			tail -20 "$WORK/mpirun-$tag.log" >&2
			exit 1
		}
	done
}

readall() { # DIR: dd bs=1M of every file under it; prints "BYTES SECONDS"
	find "$1" -type f | sort >"$WORK/readall.list"
	bench_dd_list "$WORK/readall.list"
}

cpu_ticks() { # PID...: utime + stime of those processes, in clock ticks
	local p t=0 f
	for p in "$@"; do
		read -r -a f < <(sed 's/^.*) //' "/proc/$p/stat")
		t=$((t + f[11] + f[12]))
	done
	echo "$t"
}
ticks_s() { printf '%.2f' "$(echo "$1 / $(getconf CLK_TCK)" | bc -l)"; }

# Touch 512 MiB (huge pages where the kernel gives them) and give it back,
# so that a daemon allocating memory next gets pages the VM has backed.
settle_memory() {
	"$PY" -c '
import mmap
n = 512 << 20
m = mmap.mmap(-1, n)
m.madvise(mmap.MADV_HUGEPAGE)
c = b"\x01" * (2 << 20)
for i in range(0, n, len(c)):
    m[i:i + len(c)] = c
'
}

# timed_read DIR PID...: readall DIR, and the CPU ticks PIDs spent meanwhile;
# prints "BYTES SECONDS TICKS..." (one TICKS per PID).
timed_read() {
	local dir=$1 p b=() a=() res
	shift
	settle_memory
	for p in "$@"; do b+=("$(cpu_ticks "$p")"); done
	res=$(readall "$dir")
	for p in "$@"; do a+=("$(( $(cpu_ticks "$p") - b[${#a[@]}] ))"); done
	echo "$res ${a[*]}"
}

# best_of ROWVAR "BYTES SECONDS TICKS...": keep the faster of the two.
best_of() {
	local -n cur=$1
	if [[ -z $cur ]] || (( $(echo "$(cut -d' ' -f2 <<<"$2") < $(cut -d' ' -f2 <<<"$cur")" | bc -l) )); then
		cur=$2
	fi
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

# the reference: dd bs=1M of the raw payload files (warm), best of N
ls -d "$FULL"/ck/rank-*/* | sort >"$WORK/raw.list"
RBEST=""
for rep in $(seq "$REPS"); do best_of RBEST "$(bench_dd_list "$WORK/raw.list")"; done
mkdir -p "$SMNT"
SBEST=""
MBEST=""
for rep in $(seq "$REPS"); do
	"$SHARDFS" -f "$FULL" "$SMNT" 2>"$WORK/single.log" &
	SPID=$!
	wait_mounted "$SMNT" "$SPID" 20 || { echo "bench_mpi.sh: single mount failed" >&2; exit 1; }
	best_of SBEST "$(timed_read "$SMNT/ck/tensors" "$SPID")"
	stop_single

	# shellcheck disable=SC2086
	start_cluster "$WORK/store%r" "$WORK/mnt-read-%r" "read$rep" ${BENCH_MPI_READ_OPTS:-}
	dpids=()     # the daemons, rank 0 first
	for p in $(pgrep -P "$MPID"); do
		if tr '\0' '\n' <"/proc/$p/environ" | grep -qx 'OMPI_COMM_WORLD_RANK=0'; then
			dpids=("$p" "${dpids[@]}")
		else
			dpids+=("$p")
		fi
	done
	res=$(timed_read "$WORK/mnt-read-0/ck/tensors" "${dpids[@]}")
	[[ ${res%% *} == "${SBEST%% *}" ]] ||
		{ echo "bench_mpi.sh: read ${res%% *} bytes via MPI, ${SBEST%% *} single" >&2; exit 1; }
	cmp -s <(cat "$FULL/ck/manifest.json") <(cat "$WORK/mnt-read-0/ck/manifest.json") ||
		{ echo "bench_mpi.sh: manifest differs through rank 0" >&2; exit 1; }
	best_of MBEST "$res"
	stop_cluster
done
read -r sbytes ssec sticks <<<"$SBEST"
read -r mbytes msec mticks <<<"$MBEST"
mtotal=0
for t in $mticks; do mtotal=$((mtotal + t)); done
read -r rbytes rsec <<<"$RBEST"
ROWS+=("raw payload files, dd bs=1M (page cache)|$rbytes|$rsec|-|$rsec")
ROWS+=("single process, tensors/ (all shards local)|$sbytes|$ssec|$ssec|$rsec")
what="4 MPI daemons, tensors/ via rank 0 (3/4 of shards remote)"
[[ -n ${BENCH_MPI_MCA:-} ]] && what+=", $BENCH_MPI_MCA"
ROWS+=("$what|$mbytes|$msec|$ssec|$rsec")
NOTES+=("daemon CPU during the best read: single process $(ticks_s "$sticks") s; 4 MPI daemons $(ticks_s "$mtotal") s (rank 0 $(ticks_s "${mticks%% *}") s)")
fi

# ---- commit of NT tiny tensors on 4 ranks ----
if [[ $ONLY != read ]]; then
for r in $(seq 0 $((N - 1))); do mkdir -p "$WORK/cstore$r"; done
start_cluster "$WORK/cstore%r" "$WORK/mnt-commit-%r" commit --commit-timeout 600 ${BENCH_MPI_OPTS:-}
WRITER='
import json, os, sys
mnt, rank, nt, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
root = os.path.join(mnt, "many-" + mode)
tdir = os.path.join(root, "tensors")
os.makedirs(tdir, exist_ok=True)
row = bytes([rank]) * 32          # one F32 row of 8 elements
if mode == "batch":
    # user.shardfs.declare: 1,000 declarations (about 40 KB) per setxattr
    for lo in range(0, nt, 1000):
        decl = {"t%06d" % i: {"dtype": "F32", "shape": [4, 8]}
                for i in range(lo, min(nt, lo + 1000))}
        os.setxattr(tdir, "user.shardfs.declare", json.dumps(decl).encode())
    # and opens relative to tensors/: no LOOKUP of the checkpoint (whose
    # entry the kernel never caches) per box
    dfd = os.open(tdir, os.O_RDONLY | os.O_DIRECTORY)
for i in range(nt):
    p = os.path.join(tdir, "t%06d" % i)
    if mode == "each":
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        os.setxattr(p, "user.shardfs.dtype", b"F32")
        os.setxattr(p, "user.shardfs.shape", b"[4,8]")
        fd = os.open("%s@%d:%d,:" % (p, rank, rank + 1), os.O_WRONLY)
    else:
        fd = os.open("t%06d@%d:%d,:" % (i, rank, rank + 1), os.O_WRONLY, dir_fd=dfd)
    try:
        os.write(fd, row)
    finally:
        os.close(fd)
'
want=$("$PY" -c 'import sys; sys.stdout.buffer.write(b"".join(bytes([r])*32 for r in range(4)))' | md5sum)
# write_and_commit MODE: the 4 writers, then the 4 commits, of checkpoint
# many-MODE; sets WSEC and CSEC and checks the committed bytes.
write_and_commit() {
	local mode=$1 r p t0 t1 t2 st got pids=()
	t0=$(date +%s.%N)
	for r in $(seq 0 $((N - 1))); do
		"$PY" -c "$WRITER" "$WORK/mnt-commit-$r" "$r" "$NT" "$mode" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || { echo "bench_mpi.sh: a writer failed" >&2; exit 1; }; done
	t1=$(date +%s.%N)
	pids=()
	for r in $(seq 0 $((N - 1))); do
		"$SHARDCTL" commit "$WORK/mnt-commit-$r/many-$mode" >"$WORK/commit-$r.out" 2>&1 &
		pids+=($!)
	done
	for p in "${pids[@]}"; do
		wait "$p" || { echo "bench_mpi.sh: a commit failed:" >&2; cat "$WORK"/commit-*.out >&2; exit 1; }
	done
	t2=$(date +%s.%N)
	st=$(getfattr --only-values -n user.shardfs.state "$WORK/mnt-commit-0/many-$mode" 2>/dev/null || echo "?")
	[[ $st == committed ]] || { echo "bench_mpi.sh: state after commit: $st" >&2; exit 1; }
	got=$(md5sum <"$WORK/mnt-commit-2/many-$mode/tensors/t$(printf %06d $((NT - 1)))")
	[[ $want == "$got" ]] || { echo "bench_mpi.sh: tensor bytes differ after commit" >&2; exit 1; }
	WSEC=$(echo "$t1 - $t0" | bc -l)
	CSEC=$(echo "$t2 - $t1" | bc -l)
}
write_and_commit each
wsec=$WSEC csec=$CSEC
write_and_commit batch
stop_cluster
ROWS+=("write $NT tensors x 4 box shards (4 writers, one per rank; create + 2 xattrs per tensor)|$((NT * 128))|$wsec|-")
ROWS+=("the same, declared 1,000 at a time (user.shardfs.declare), box writes opened relative to tensors/|$((NT * 128))|$WSEC|$wsec")
ROWS+=("commit of $NT tensors on 4 ranks (4 concurrent shardctl commit)|-|$csec|-")
ROWS+=("commit of the batch-declared checkpoint|-|$CSEC|$csec")
NOTES+=("ratios of the write and commit rows: against the first write and commit rows")
fi

# ---- table ----
echo
echo "shardfs MPI benchmark: $(nproc) CPUs, checkpoint $SIZE (llama, 4 ranks), $NT tensors committed;" \
	"reads best of $REPS, the rest one run; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "(reads: dd bs=1M of every file, each row's ratio to the single-process read and to dd of the raw payload files, in this run)"
echo
echo "| what | bytes | seconds | GB/s | ratio vs single process (write, commit: vs the first row) | ratio vs dd of the payload files |"
echo "|---|---:|---:|---:|---:|---:|"
for row in "${ROWS[@]}"; do
	IFS='|' read -r what bytes sec base raw <<<"$row"
	if [[ $bytes == - ]]; then
		gbs=-
	else
		gbs=$(printf '%.3f' "$(echo "$bytes / $sec / 1000000000" | bc -l)")
	fi
	if [[ $base == - ]]; then ratio=-; else ratio=$(printf '%.2fx' "$(echo "$base / $sec" | bc -l)"); fi
	if [[ -z $raw ]]; then rawr=-; else
		rawr=$(printf '%.2fx' "$(echo "$bytes / $sec / ($rbytes / $raw)" | bc -l)"); fi
	printf '| %s | %s | %.3f | %s | %s | %s |\n' "$what" "$bytes" "$sec" "$gbs" "$ratio" "$rawr"
done
[[ ${#NOTES[@]} -eq 0 ]] || { echo; printf '%s\n' "${NOTES[@]}"; }
