# benchlib.sh - what the benchmark scripts share: option parsing, the tool
# checks, waiting for a mount, stopping a daemon (or mpirun) and its
# mounts, and removing the work directory. Sourced (not run), after
# `set -euo pipefail`, by bench.sh, bench_write.sh and bench_mpi.sh.
# The sourcing script sets ME (its name for messages) first, and BIN to
# its default binary directory.

now() { date +%s.%N; }

# bench_parse_args "$@": --bin DIR (sets BIN), --keep (KEEP=1), --reps N
# (only when the script set REPS; 1..99), -h (the script's header comment).
# Positional arguments go to the array ARGS.
bench_parse_args() {
	BENCH_ARGV=${BENCH_ARGV-"$*"}
	KEEP=0
	ARGS=()
	while [[ $# -gt 0 ]]; do
		case $1 in
		--bin) BIN=$2; shift 2 ;;
		--keep) KEEP=1; shift ;;
		--reps)
			[[ -n ${REPS:-} ]] || { echo "$ME: unknown option $1" >&2; exit 2; }
			REPS=$2; shift 2
			[[ $REPS =~ ^[1-9][0-9]?$ ]] || { echo "$ME: --reps wants 1..99" >&2; exit 2; } ;;
		-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
		-*) echo "$ME: unknown option $1" >&2; exit 2 ;;
		*) ARGS+=("$1"); shift ;;
		esac
	done
	bench_header
}

# bench_header: what a table needs to be read later, printed once before
# it (docs/PERFORMANCE.md quotes these lines above each table): the
# script and its arguments, the date, the commit (and whether the tree
# had changes), the machine (CPU model, cores, memory, kernel) and the
# load when the run began. A table from a loaded machine says so.
bench_header() {
	[[ -z ${BENCH_HEADER_DONE:-} ]] || return 0
	BENCH_HEADER_DONE=1
	local top commit cpu mem load l3
	top=$(cd "$(dirname "$0")" && git rev-parse --show-toplevel 2>/dev/null || true)
	commit=unknown
	if [[ -n $top ]]; then
		commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
		[[ -z $(git -C "$top" status --porcelain --untracked-files=no 2>/dev/null) ]] ||
			commit="$commit (with uncommitted changes)"
	fi
	cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
	mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
	read -r load _ < /proc/loadavg
	l3=$(getconf LEVEL3_CACHE_SIZE 2>/dev/null || echo 0)
	[[ $l3 =~ ^[1-9][0-9]*$ ]] && l3=", L3 $((l3 / 1048576)) MiB" || l3=""
	echo "# $ME${BENCH_ARGV:+ $BENCH_ARGV}"
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
	echo "# ${cpu:-unknown CPU}, $(nproc) cores$l3, $mem, Linux $(uname -r), load $load at start"
}

# bench_parse_args_ceiling "$@": as bench_parse_args, and --ceiling PATH
# (sets CEILING; "" when not given) for the scripts that time the FUSE
# ceiling daemon.
bench_parse_args_ceiling() {
	BENCH_ARGV="$*"
	local rest=()
	CEILING=""
	while [[ $# -gt 0 ]]; do
		case $1 in
		--ceiling) [[ $# -ge 2 ]] || { echo "$ME: --ceiling wants a PATH" >&2; exit 2; }
			CEILING=$2; shift 2 ;;
		*) rest+=("$1"); shift ;;
		esac
	done
	bench_parse_args ${rest[@]+"${rest[@]}"}
}

# bench_need_tools [COMMAND...]: the built shardfs and shardctl in $BIN
# (sets SHARDFS, SHARDCTL), /dev/fuse, fusermount3 and any COMMAND named;
# exits 1 naming what is missing.
bench_need_tools() {
	local t
	SHARDFS=$BIN/shardfs
	SHARDCTL=$BIN/shardctl
	for t in "$SHARDFS" "$SHARDCTL"; do
		[[ -x $t ]] || { echo "$ME: $t not built (use --bin)" >&2; exit 1; }
	done
	[[ -e /dev/fuse ]] || { echo "$ME: needs /dev/fuse" >&2; exit 1; }
	for t in fusermount3 "$@"; do
		command -v "$t" >/dev/null || { echo "$ME: needs $t" >&2; exit 1; }
	done
}

mounted() { grep -q " $1 fuse" /proc/mounts; }

# The reader of every row and its references (issue 29, 4): each ratio is
# to dd bs=1M and to cat of the raw payload files read in the same run,
# by the same programs a user would run, never by a Python reader.
# bench_dd_list LIST: dd bs=1M of every file named in LIST (one path a
# line), one after another; prints "BYTES SECONDS" (BYTES: the files'
# sizes, read after the clock stops); exit 1 if a dd fails (an EIO).
bench_dd_list() {
	local f t0 t1 bytes=0
	t0=$(now)
	while IFS= read -r f; do
		[[ -z $f ]] || dd if="$f" of=/dev/null bs=1M status=none || return 1
	done <"$1"
	t1=$(now)
	while IFS= read -r f; do
		[[ -z $f ]] || bytes=$((bytes + $(stat -c %s "$f")))
	done <"$1"
	echo "$bytes $(echo "$t1 - $t0" | bc)"
}

# bench_cat_list LIST: as bench_dd_list, with one cat of all the files.
bench_cat_list() {
	local f t0 t1 bytes=0
	t0=$(now)
	xargs -d '\n' -a "$1" cat >/dev/null || return 1
	t1=$(now)
	while IFS= read -r f; do
		[[ -z $f ]] || bytes=$((bytes + $(stat -c %s "$f")))
	done <"$1"
	echo "$bytes $(echo "$t1 - $t0" | bc)"
}

# bench_why WHAT RATIO [CEILING_RATIO]: the one sentence a row below its
# target gets (empty at or above it). Targets: 0.95 of the cold dd for a
# cold row, 0.8 of dd otherwise (issue 29's loader goals). CEILING_RATIO:
# the FUSE ceiling's ratio to dd in the same run, when measured.
bench_why() {
	local what=$1 r=$2 c=${3:-} target=0.8
	[[ $what != *cold* ]] || target=0.95
	[[ $(echo "$r < $target" | bc -l) == 1 ]] || return 0
	local cs=""
	[[ -z $c ]] || cs=" (the FUSE ceiling here: $c of dd)"
	case $what in
	raw*readfiles*|raw*fuse_reader*)
		echo "a Python reader, kept to compare with older tables: not a target row" ;;
	raw*) echo "the raw reference itself, read another way" ;;
	*"shardctl verify"*)
		echo "XXH3 of every block on one thread: the cost of checksums, not a read" ;;
	"FUSE ceiling"*)
		echo "FUSE's own limit: a daemon that does no work still pays a copy into each reply and one into the mount's page cache, per request of at most 1 MiB" ;;
	*cold*)
		echo "a cold read through FUSE waits for the disk one request of at most 1 MiB at a time per reader, behind the same copies as a first read$cs" ;;
	*direct-io*again*|*O_DIRECT*again*)
		echo "direct I/O: the kernel caches nothing, so a re-read crosses FUSE to the daemon as a first read does$cs" ;;
	*"again"*)
		echo "re-read from the mount's own page cache, the kernel's copy alone as for dd: below the target only in a disturbed run (rerun it quiet)" ;;
	*)
		echo "a first read crosses FUSE: every byte is copied into a reply and again into the mount's page cache, in requests of at most 1 MiB, so it cannot reach dd of the page cache$cs" ;;
	esac
}

# wait_mounted MNT PID SECONDS [LOG]: until MNT is a FUSE mount; 1 (with
# LOG's tail) if PID exits first or SECONDS pass.
wait_mounted() {
	local i
	for i in $(seq $(($3 * 50))); do
		mounted "$1" && return 0
		kill -0 "$2" 2>/dev/null || {
			echo "$ME: process $2 exited before $1 was mounted" >&2
			[[ -n ${4:-} ]] && tail "$4" >&2
			return 1
		}
		sleep 0.02
	done
	echo "$ME: $1 not mounted after $3 s" >&2
	return 1
}

# reap_pid PID SECONDS: wait up to SECONDS for PID to exit, then TERM, then
# KILL it; always reaps it.
reap_pid() {
	local i
	for i in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$1" 2>/dev/null; then
		echo "$ME: process $1 did not exit after unmount; killing" >&2
		kill -TERM "$1" 2>/dev/null || true; sleep 1
		kill -KILL "$1" 2>/dev/null || true
	fi
	wait "$1" 2>/dev/null || true
}

# stop_mounts PID SECONDS MNT...: unmount every MNT, reap PID (the daemon
# or mpirun serving them; may be empty), and lazily unmount whatever is
# still mounted.
stop_mounts() {
	local pid=$1 secs=$2 m
	shift 2
	for m in "$@"; do
		if mounted "$m"; then fusermount3 -u "$m" 2>/dev/null || true; fi
	done
	[[ -z $pid ]] || reap_pid "$pid" "$secs"
	for m in "$@"; do
		if mounted "$m"; then umount -l "$m" || true; fi
	done
}

# The single-daemon scripts: DPID serves MNT.
stop_daemon() {
	stop_mounts "${DPID:-}" 10 "$MNT"
	DPID=""
}

# bench_remove_work: remove WORK, or name it when --keep was given. For the
# script's EXIT trap, after it stopped its daemons.
bench_remove_work() {
	if [[ $KEEP == 1 ]]; then
		echo "kept: $WORK"
	else
		rm -rf "$WORK"
	fi
}

# bench_steady_memory: keep the guest's free memory backed by the host for
# the run, only when BENCH_STEADY_MEMORY=1 is in the environment (a special
# setting: the main tables are taken without it, and a table taken with
# it says so; bench_memory_label). Otherwise one line says it was not. On a VM whose balloon device reports free pages to the host
# (virtio-balloon free page reporting: this machine's kernel reports any
# freed 2 MiB block almost at once), every page a fresh mount's page cache
# takes from the free lists may first cost the host a fault and a zeroing;
# which rows pay it is chance, so a row varied 2-3x and the daemon's CPU
# time with it. As root, where /sys/module/page_reporting exists, this
# raises page_reporting_order above the largest order (nothing is reported
# any more), then touches the free memory less 1 GiB once (anonymous,
# freed at once) so that it is all backed; bench_restore_memory (from the
# EXIT trap) puts the order back. Elsewhere a line says the rows may vary.
PRO=/sys/module/page_reporting/parameters/page_reporting_order
PRO_OLD=""
bench_steady_memory() {
	local me=$1 free_kb
	if [[ ${BENCH_STEADY_MEMORY:-0} != 1 ]]; then
		echo "$me: memory as it is (no special settings; BENCH_STEADY_MEMORY=1 pauses free page reporting for a labelled table)" >&2
		return 0
	fi
	if [[ ! -w $PRO ]]; then
		echo "$me: free page reporting left as it is (no writable $PRO): rows may vary with the host's memory" >&2
		return 0
	fi
	PRO_OLD=$(cat "$PRO")
	echo 11 >"$PRO" || { PRO_OLD=""; return 0; }
	free_kb=$(awk '/^MemFree:/ {print $2}' /proc/meminfo)
	if ((free_kb > 2 * 1048576)); then
		/usr/bin/python3 -c 'import mmap, sys
n = int(sys.argv[1]) << 10
m = mmap.mmap(-1, n)
for i in range(0, n, 4096):
    m[i] = 1' "$((free_kb - 1048576))" || true
	fi
	echo "$me: free page reporting to the host paused for the run (page_reporting_order $PRO_OLD -> 11; restored at exit)" >&2
}

# bench_memory_label: the memory settings a table was taken with, for its
# title line.
bench_memory_label() {
	if [[ -n $PRO_OLD ]]; then
		echo "with free page reporting paused (BENCH_STEADY_MEMORY=1)"
	else
		echo "no special memory settings"
	fi
}

bench_restore_memory() {
	[[ -z $PRO_OLD ]] || echo "$PRO_OLD" >"$PRO" || true
	PRO_OLD=""
}

# bench_keep_row WHAT BYTES SECONDS: remember the fastest run of a table
# row in the caller's BEST (declare -A: what -> "bytes|seconds"), adding
# WHAT to the caller's ROWS (first-seen order) the first time.
bench_keep_row() {
	local what=$1 bytes=$2 secs=$3
	if [[ -z ${BEST[$what]+set} ]]; then
		ROWS+=("$what")
	elif [[ $(echo "$secs >= ${BEST[$what]#*|}" | bc) == 1 ]]; then
		return
	fi
	BEST[$what]="$bytes|$secs"
}

# bench_start_mount CMD...: run the daemon CMD (its stderr to
# $WORK/daemon.log) in the background as DPID and wait up to 6 s for $MNT
# to be mounted (exit 1 otherwise).
bench_start_mount() {
	mkdir -p "$MNT"
	"$@" 2>>"$WORK/daemon.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 6 "$WORK/daemon.log" || exit 1
}
