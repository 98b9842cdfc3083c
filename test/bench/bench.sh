#!/bin/bash
# bench.sh - read throughput of shardfs against raw reads of the payloads.
#
# Usage: test/bench/bench.sh [--bin DIR] [--ceiling PATH] [--reps N] [--keep] [SIZE]
#   SIZE      checkpoint size for `shardctl gen --layout llama` (default 2G)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --ceiling PATH  the fuse_ceiling binary (default: DIR/../test/bench/
#             fuse_ceiling, which the same build makes); when it is not
#             there the FUSE ceiling row is left out with a line saying why
#   --reps N  time every row N times (each fresh-mount row on its own fresh
#             daemon) and report the fastest (default 3; single runs vary
#             2-3x on a shared 2-core machine)
#   --keep    keep the temporary checkpoint and logs (printed at the end)
#   BENCH_QUICK=1 in the environment: a 256M smoke run
#   BENCH_COLD=1 in the environment: also the cold rows below (root: they
#             write /proc/sys/vm/drop_caches, which drops the whole
#             machine's clean page cache, so other work slows too)
#
# Generates one checkpoint, reads every payload file once so the page cache
# is warm for both sides, then times (best of --reps runs, on this machine):
#   raw      the payload files with dd bs=1M, one after another, and with
#            one cat of them all (the reader of every row below: one
#            process for a row's files, so a row of many files pays no
#            start of a program per file); every row's two ratios are to
#            these two rows of the same run
#   hash     `shardctl verify`: every payload block read and hashed on one
#            thread; its user CPU is what checksums cost, and under the
#            table the ceiling plus that CPU bounds a verified first read
#            on a machine whose cores the two copies of a read keep busy
#   ceiling  files of the sizes of the tensor files (same count, same bytes)
#            through a fresh mount of fuse_ceiling, a daemon that replies
#            from one buffer in memory and does no work, with the transfer
#            settings shardfs uses: what FUSE itself allows a first read;
#            then the same files replying with real bytes, each a range of
#            a copy of the payload (its files one after another) sent from
#            a shared mapping of it (-x file, as shardfs sends), and that
#            with every reply hashed first (-x hash, shardfs's XXH3): the
#            work of a daemon that verifies and does nothing else, the
#            bound of a verified first read; and both ceilings (the
#            pattern, the payload's bytes hashed) of the other fresh rows'
#            own files: one file of model.safetensors' size, files of the
#            dim-1 slices' sizes
#   tensors/ every tensor file, model.safetensors, and one slice path per
#            shard box of each dim-1-sharded weight, each first through a
#            fresh mount (the daemon assembles) and then again (kernel page
#            cache, keep_cache: the faster of two re-reads, because the
#            first one also moves every page of the mount's cache to the
#            active list, where the payload's pages, read many times, already
#            are: 505,176 pgactivate for 2 GB, 0.30 s against 0.24 s for the
#            next); and tensors/ again on a --no-verify mount
#   cold     (BENCH_COLD=1) the same with nothing in the page cache: before
#            each side `sync; echo 3 > /proc/sys/vm/drop_caches`, then the
#            reader's own programs read back in (untimed); dd bs=1M of the
#            payload files one after another (the reference) and all at
#            once (what the disk gives several streams), cat of them cold,
#            and tensors/, model.safetensors and the dim-1 slices through a
#            fresh mount; their ratios are to the cold dd and cat rows of
#            the same run
# Before every fresh mount of the page-cache rows the payload files are
# read once more, untimed (memory left untouched for minutes costs more to
# touch again on this VM). No special memory settings unless
# BENCH_STEADY_MEMORY=1 (benchlib.sh; the title line says which). Prints
# a markdown table (what, bytes, seconds, GB/s, ratio vs dd, ratio vs cat,
# and for a row below its target, 0.8 of dd or 0.95 of the cold dd, the
# one sentence why: benchlib.sh bench_why), each fresh-mount row's ratio to the FUSE ceiling
# and to the hashed ceilings of the payload's bytes, then each mount's
# start-up time (start to mountpoint ready), the daemon's peak RSS (VmHWM)
# and its CPU time (user + system): the smallest start-up time and CPU
# time and the largest peak RSS over the repetitions. Not a ctest test.
# Always unmounts, stops the daemon and (unless --keep) removes its
# temporary data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
SIZE=2G
[[ ${BENCH_QUICK:-0} == 1 ]] && SIZE=256M
bench_parse_args_ceiling "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
PY=/usr/bin/python3
bench_need_tools
[[ -n $CEILING ]] || CEILING=$BIN/../test/bench/fuse_ceiling
CEILING_SKIP=""
[[ -x $CEILING ]] ||
	CEILING_SKIP="$CEILING not built (make fuse_ceiling, or --ceiling PATH)"
[[ -z $CEILING_SKIP ]] ||
	echo "bench.sh: skipping the FUSE ceiling row: $CEILING_SKIP" >&2

WORK=$(mktemp -d /tmp/sfbench-XXXXXX)
CKPT=$WORK/ckpt
MNT=$WORK/mnt
DPID=""          # the running daemon, if any
ROWS=()          # table rows (what), in first-seen order
declare -A BEST  # what -> "bytes|seconds" of the fastest repetition
MOUNTS=()        # mount rows (what), in first-seen order
declare -A MBEST # what -> "ms|rss_kb|cpu_s" over the repetitions

cleanup() {
	stop_daemon
	bench_restore_memory
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bench_steady_memory "$ME"

# start_mount LABEL COMMAND...: run COMMAND (a daemon in the foreground
# that mounts $MNT), wait for the mount, record its start-up time
start_mount() {
	local label=$1; shift
	mkdir -p "$MNT"
	local t0; t0=$(now)
	"$@" 2>>"$WORK/daemon.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 6 "$WORK/daemon.log" || exit 1
	MOUNT_MS=$(echo "($(now) - $t0) * 1000" | bc)
	MOUNT_LABEL=$label
}

# start_daemon LABEL [OPTS...]: fresh shardfs mount of $CKPT at $MNT
start_daemon() {
	local label=$1; shift
	start_mount "$label" "$SHARDFS" -f "$@" "$CKPT" "$MNT"
}

# end_daemon: record the daemon's peak RSS and CPU time, unmount
end_daemon() {
	local rss cpu
	rss=$(awk '/^VmHWM:/ {print $2}' "/proc/$DPID/status" 2>/dev/null || echo 0)
	# utime + stime (fields 14, 15 of /proc/PID/stat; comm has no spaces here)
	cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' \
		"/proc/$DPID/stat" 2>/dev/null || echo 0)
	keep_mount "$MOUNT_LABEL" "$MOUNT_MS" "$rss" "$cpu"
	stop_daemon
}

# keep_mount WHAT MS RSS_KB CPU_S: smallest start-up and CPU time, largest
# peak RSS
keep_mount() {
	local what=$1 ms=$2 rss=$3 cpu=$4 oms orss ocpu
	if [[ -z ${MBEST[$what]+set} ]]; then
		MOUNTS+=("$what")
	else
		IFS='|' read -r oms orss ocpu <<<"${MBEST[$what]}"
		[[ $(echo "$oms < $ms" | bc) == 1 ]] && ms=$oms
		((orss > rss)) && rss=$orss
		[[ $(echo "$ocpu < $cpu" | bc) == 1 ]] && cpu=$ocpu
	fi
	MBEST[$what]="$ms|$rss|$cpu"
}

# timed_read WHAT LISTFILE [dd]: read the listed files with one cat of them
# all (with dd bs=1M, one after another), add a table row
timed_read() {
	local what=$1 list=$2 res
	if [[ ${3:-} == dd ]]; then res=$(bench_dd_list "$list"); else res=$(bench_cat_list "$list"); fi ||
		{ echo "bench.sh: reading $what failed" >&2; exit 1; }
	bench_keep_row "$what" "${res% *}" "${res#* }"
}

# ceiling_read LABEL ROW PATHS LIST [-x EXP]...: one timed first read of
# PATHS through a fresh fuse_ceiling serving LIST (payload rewarmed first)
ceiling_read() {
	local label=$1 row=$2 paths=$3 list=$4
	shift 4
	rewarm
	start_mount "$label (fresh read only)" "$CEILING" -f "$@" "$list" "$MNT"
	timed_read "$row" "$paths"
	end_daemon
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "generating a $SIZE llama checkpoint in $CKPT ..." >&2
t0=$(now)
"$SHARDCTL" gen --layout llama --ranks 4 --size "$SIZE" --seed 1 "$CKPT" >/dev/null
echo "generated in $(echo "$(now) - $t0" | bc) s" >&2

find "$CKPT" -path '*/rank-*' -type f | sort >"$WORK/payloads"
# Warm the page cache; again (untimed) before every fresh mount of the
# page-cache rows: on this VM memory left untouched for minutes can cost
# many times more to touch again, and the ceiling's buffer is always new.
CONCAT=$WORK/payload.cat # the payload files one after another (the
			# backing of the ceilings that reply with real bytes)
rewarm() {
	cat $(cat "$WORK/payloads") >/dev/null
	[[ ! -e $CONCAT ]] || cat "$CONCAT" >/dev/null
}
# backed LIST OUT: LIST ("SIZE NAME" lines) with consecutive ranges of
# $CONCAT as the files' backing, for fuse_ceiling -x file
backed() {
	awk -v cat="$CONCAT" -v size="$(stat -c %s "$CONCAT")" '
		off + $1 > size + 0 {off = 0; twice = 1}
		{printf "%s %s\t%s\t%d\n", $1, $2, cat, off; off += $1}
		END {if (twice) print "bench.sh: a ceiling serves some payload bytes twice" > "/dev/stderr"}' \
		"$1" >"$2"
}
rewarm

# raw: dd bs=1M over every payload file, and one cat of them all
RAW_DD="raw payload files (dd bs=1M)"
RAW_CAT="raw payload files (cat)"
rawbytes=0
while read -r f; do rawbytes=$((rawbytes + $(stat -c %s "$f"))); done <"$WORK/payloads"
for _ in $(seq "$REPS"); do
	timed_read "$RAW_DD" "$WORK/payloads" dd
	timed_read "$RAW_CAT" "$WORK/payloads"
done

# What checksums cost alone: shardctl verify reads (pread) and hashes
# (XXH3) every payload block on one thread; its user CPU is the hash.
HASH_ROW="every payload block read and hashed (shardctl verify, one thread)"
HASH_CPU=""
for _ in $(seq "$REPS"); do
	t0=$(now)
	u=$($PY -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print("%.3f" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime)' \
		"$SHARDCTL" verify "$CKPT") || { echo "bench.sh: shardctl verify failed" >&2; exit 1; }
	t1=$(now)
	bench_keep_row "$HASH_ROW" "$rawbytes" "$(echo "$t1 - $t0" | bc)"
	[[ -z $HASH_CPU || $(echo "$u < $HASH_CPU" | bc) == 1 ]] && HASH_CPU=$u
done

$PY "$HERE/bench_plan.py" "$CKPT" "$MNT" tensors >"$WORK/tensors"
$PY "$HERE/bench_plan.py" "$CKPT" "$MNT" slices >"$WORK/slices"
echo "$MNT/model.safetensors" >"$WORK/st"
[[ -s $WORK/slices ]] || echo "bench.sh: no dim-1-sharded weights found" >&2

# The FUSE ceiling: one flat file per tensor file, of its size (the BYTES
# column of `shardctl info`), read by the same reader on a fresh daemon.
CEILING_ROW="FUSE ceiling (daemon replies from one cached buffer, no work), fresh mount"
if [[ -z $CEILING_SKIP ]]; then
	"$SHARDCTL" info "$CKPT" |
		awk '/^NAME / {on = 1; next} on && NF == 0 {exit}
		     on {printf "%s t%05d\n", $NF, n++}' >"$WORK/ceiling.list"
	awk -v m="$MNT" '{print m "/" $2}' "$WORK/ceiling.list" >"$WORK/ceiling"
	if [[ $(wc -l <"$WORK/ceiling") != $(wc -l <"$WORK/tensors") ]]; then
		echo "bench.sh: shardctl info lists $(wc -l <"$WORK/ceiling") tensors," \
			"bench_plan.py $(wc -l <"$WORK/tensors")" >&2
		exit 1
	fi
	# The same files replying with real bytes: each one a range of a copy
	# of the payload (the payload files one after another in one file, so
	# that no range straddles two; no byte is served twice), sent from a
	# shared mapping of it as shardfs sends its own (not from a buffer in
	# the CPU's cache), and then with each reply hashed first: the work
	# of a verifying daemon and nothing else, the measured bound of a
	# verified first read.
	cat $(cat "$WORK/payloads") >"$CONCAT"
	backed "$WORK/ceiling.list" "$WORK/ceiling-file.list"
	CEIL_SRC_ROW="FUSE ceiling replying with the payload's bytes (mapped), fresh mount"
	CEIL_HASH_ROW="FUSE ceiling replying with the payload's bytes, each reply hashed (XXH3), fresh mount"
	for _ in $(seq "$REPS"); do
		ceiling_read "FUSE ceiling" "$CEILING_ROW" \
			"$WORK/ceiling" "$WORK/ceiling.list"
		ceiling_read "FUSE ceiling, the payload's bytes" "$CEIL_SRC_ROW" \
			"$WORK/ceiling" "$WORK/ceiling-file.list" -x file
		ceiling_read "FUSE ceiling, the payload's bytes, hashed" "$CEIL_HASH_ROW" \
			"$WORK/ceiling" "$WORK/ceiling-file.list" -x file -x hash
	done
	# The ceiling of the other fresh rows' own files: one file of
	# model.safetensors' size, and files of the dim-1 slices' sizes (a
	# few MB each: per-file costs weigh more than in the tensor files).
	# Their sizes come from one untimed shardfs mount.
	start_mount "sizes (untimed)" "$SHARDFS" -f "$CKPT" "$MNT"
	$PY -c 'import os, sys
st, sl, out_st, out_sl = sys.argv[1:]
with open(out_st, "w") as o:
    o.write("%d model.safetensors\n" % os.stat(open(st).read().strip()).st_size)
with open(out_sl, "w") as o:
    for i, p in enumerate(l.strip() for l in open(sl) if l.strip()):
        o.write("%d s%05d\n" % (os.stat(p).st_size, i))' \
		"$WORK/st" "$WORK/slices" "$WORK/ceiling-st.list" "$WORK/ceiling-slices.list" ||
		{ echo "bench.sh: sizing the slices failed" >&2; exit 1; }
	stop_daemon
	awk -v m="$MNT" '{print m "/" $2}' "$WORK/ceiling-st.list" >"$WORK/ceiling-st"
	awk -v m="$MNT" '{print m "/" $2}' "$WORK/ceiling-slices.list" >"$WORK/ceiling-slices"
	backed "$WORK/ceiling-st.list" "$WORK/ceiling-st-file.list"
	backed "$WORK/ceiling-slices.list" "$WORK/ceiling-slices-file.list"
	CEIL_ST_ROW="FUSE ceiling, one file of model.safetensors' size, fresh mount"
	CEIL_SL_ROW="FUSE ceiling, files of the dim-1 slices' sizes ($(wc -l <"$WORK/slices")), fresh mount"
	CEIL_ST_HASH_ROW="FUSE ceiling, one file of model.safetensors' size replying with the payload's bytes, hashed, fresh mount"
	CEIL_SL_HASH_ROW="FUSE ceiling, files of the dim-1 slices' sizes replying with the payload's bytes, hashed, fresh mount"
	for _ in $(seq "$REPS"); do
		ceiling_read "FUSE ceiling, model.safetensors' size" "$CEIL_ST_ROW" \
			"$WORK/ceiling-st" "$WORK/ceiling-st.list"
		ceiling_read "FUSE ceiling, model.safetensors' size, the payload's bytes, hashed" \
			"$CEIL_ST_HASH_ROW" "$WORK/ceiling-st" \
			"$WORK/ceiling-st-file.list" -x file -x hash
		if [[ -s $WORK/slices ]]; then
			ceiling_read "FUSE ceiling, the slices' sizes" "$CEIL_SL_ROW" \
				"$WORK/ceiling-slices" "$WORK/ceiling-slices.list"
			ceiling_read "FUSE ceiling, the slices' sizes, the payload's bytes, hashed" \
				"$CEIL_SL_HASH_ROW" "$WORK/ceiling-slices" \
				"$WORK/ceiling-slices-file.list" -x file -x hash
		fi
	done
fi

for kind in tensors st slices; do
	case $kind in
	tensors) what="tensors/ (all tensors)" ;;
	st) what="model.safetensors" ;;
	slices) what="dim-1 slices ($(wc -l <"$WORK/slices") paths)" ;;
	esac
	for _ in $(seq "$REPS"); do
		rewarm
		start_daemon "$what"
		timed_read "$what, fresh mount" "$WORK/$kind"
		timed_read "$what, again (page cache)" "$WORK/$kind"
		timed_read "$what, again (page cache)" "$WORK/$kind"
		end_daemon
	done
done
for _ in $(seq "$REPS"); do
	rewarm
	start_daemon "tensors/ --no-verify" --no-verify
	timed_read "tensors/ --no-verify, fresh mount" "$WORK/tensors"
	timed_read "tensors/ --no-verify, again (page cache)" "$WORK/tensors"
	timed_read "tensors/ --no-verify, again (page cache)" "$WORK/tensors"
	end_daemon
done

# Cold rows: the payload (and the mount's page cache) dropped before each
# side. drop_caches also drops the programs, so they are read back in
# before the clock starts.
COLD_RAW="raw payload files (dd bs=1M), cold"
COLD_CAT="raw payload files (cat), cold"
drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	$PY -c 'import os, sys, time' </dev/null
	dd --version >/dev/null
	cat --version >/dev/null
	xargs --version >/dev/null
	bc </dev/null
}
if [[ ${BENCH_COLD:-0} == 1 ]]; then
	if [[ ! -w /proc/sys/vm/drop_caches ]]; then
		echo "bench.sh: BENCH_COLD=1 needs root (/proc/sys/vm/drop_caches); no cold rows" >&2
	else
		for _ in $(seq "$REPS"); do
			drop_caches
			timed_read "$COLD_RAW" "$WORK/payloads" dd
			drop_caches
			timed_read "$COLD_CAT" "$WORK/payloads"
			drop_caches
			t0=$(now)
			pids=()
			while read -r f; do
				dd if="$f" of=/dev/null bs=1M status=none &
				pids+=($!)
			done <"$WORK/payloads"
			wait "${pids[@]}"
			t1=$(now)
			bench_keep_row "raw payload files (one dd bs=1M per file, all at once), cold" \
				"$rawbytes" "$(echo "$t1 - $t0" | bc)"
			for kind in tensors st slices; do
				case $kind in
				tensors) what="tensors/ (all tensors)" ;;
				st) what="model.safetensors" ;;
				slices) what="dim-1 slices ($(wc -l <"$WORK/slices") paths)" ;;
				esac
				drop_caches
				start_daemon "$what, cold"
				timed_read "$what, fresh mount, cold" "$WORK/$kind"
				end_daemon
			done
		done
	fi
fi

rowgbs() { awk -F'|' '{printf "%.6f", $1 / $2 / 1e9}' <<<"${BEST[$1]}"; }
rawgbs=$(rowgbs "$RAW_DD")
catgbs=$(rowgbs "$RAW_CAT")
coldgbs=$rawgbs
coldcat=$catgbs
if [[ -n ${BEST[$COLD_RAW]+set} ]]; then
	coldgbs=$(rowgbs "$COLD_RAW")
	coldcat=$(rowgbs "$COLD_CAT")
fi
ceilr=""
[[ -z ${BEST[$CEILING_ROW]+set} ]] ||
	ceilr=$(awk -v g="$(rowgbs "$CEILING_ROW")" -v r="$rawgbs" 'BEGIN {printf "%.2f", g / r}')
echo
echo "shardfs read benchmark: llama $SIZE, 4 ranks, $(nproc) cores, $(uname -r), best of $REPS, $(bench_memory_label)"
echo "(load average at the start: $LOAD0; at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "(every row but the dd ones read by one cat of its files; ratios to dd bs=1M and to cat of the raw payload files in this run, the cold rows' to their cold runs; a row below its target, 0.8 of dd or 0.95 of the cold dd, says why)"
echo
echo "| what | bytes | seconds | GB/s | ratio vs dd | ratio vs cat | why below the target |"
echo "|---|---:|---:|---:|---:|---:|---|"
for what in "${ROWS[@]}"; do
	IFS='|' read -r bytes secs <<<"${BEST[$what]}"
	raw=$rawgbs
	cat=$catgbs
	if [[ $what == *", cold" ]]; then raw=$coldgbs; cat=$coldcat; fi
	r=$(awk -v b="$bytes" -v s="$secs" -v raw="$raw" 'BEGIN {printf "%.2f", b / s / 1e9 / raw}')
	awk -v w="$what" -v b="$bytes" -v s="$secs" -v raw="$raw" -v cat="$cat" \
		-v why="$(bench_why "$what" "$r" "$ceilr")" \
		'BEGIN { g = b / s / 1e9; printf "| %s | %d | %.3f | %.2f | %.2f | %.2f | %s |\n", w, b, s, g, g / raw, g / cat, why }'
done
echo
if [[ -n $CEILING_SKIP ]]; then
	echo "FUSE ceiling row left out: $CEILING_SKIP"
else
	# Fresh-mount rows against a ceiling row, GB/s over GB/s: the plain
	# ceiling; the one replying with the payload's bytes, hashed, of each
	# row's own files; the plain one of each row's own files (tensors/
	# and --no-verify: the tensor files'; model.safetensors: one file of
	# its size; the slices: files of their sizes). A row whose ceiling
	# was not measured is left out.
	gbs() { awk -F'|' '{printf "%.2f", $1 / $2 / 1e9}' <<<"${BEST[$1]}"; }
	ratio_line() {
		local line=$1 mode=$2 what base bytes secs cb cs
		for what in "${ROWS[@]}"; do
			[[ $what == *", fresh mount" && $what != "FUSE ceiling"* ]] || continue
			case $mode:$what in
			hashed:model.safetensors*) base=$CEIL_ST_HASH_ROW ;;
			"hashed:dim-1 slices"*) base=$CEIL_SL_HASH_ROW ;;
			hashed:*) base=$CEIL_HASH_ROW ;;
			same:model.safetensors*) base=$CEIL_ST_ROW ;;
			"same:dim-1 slices"*) base=$CEIL_SL_ROW ;;
			*) base=$CEILING_ROW ;;
			esac
			[[ -n ${BEST[$base]+set} ]] || continue
			IFS='|' read -r bytes secs <<<"${BEST[$what]}"
			IFS='|' read -r cb cs <<<"${BEST[$base]}"
			line+=$(awk -v w="${what%, fresh mount}" -v b="$bytes" -v s="$secs" \
				-v cb="$cb" -v cs="$cs" 'BEGIN { printf " %s %.2f;", w, (b / s) / (cb / cs) }')
		done
		echo "${line%;}"
	}
	ratio_line "fresh mounts vs the FUSE ceiling ($(gbs "$CEILING_ROW") GB/s):" plain
	[[ -z ${BEST[$CEIL_HASH_ROW]+set} ]] ||
		ratio_line "fresh mounts vs the FUSE ceiling of the same file sizes replying with the payload's bytes, hashed:" hashed
	ratio_line "fresh mounts vs the FUSE ceiling of the same file sizes:" same
	# The hash cannot overlap the two copies a first read already keeps
	# both cores busy with: the ceiling plus the hash's CPU bounds a
	# verified first read on a 2-core machine.
	awk -v c="${BEST[$CEILING_ROW]#*|}" -v h="$HASH_CPU" 'BEGIN {
		printf "checksums alone: %.3f s of CPU to hash every block; ceiling + hash = %.3f s, %.2f of the ceiling: what a verified first read reaches if the hash overlaps nothing\n", h, c + h, c / (c + h) }'
fi
[[ -z ${BEST[$COLD_RAW]+set} ]] ||
	echo "(rows ending in \"cold\": ratios to the cold raw rows; page cache dropped before each)"
echo
echo "| mount | start-up ms | daemon peak RSS MiB | daemon CPU s (its reads) |"
echo "|---|---:|---:|---:|"
for what in "${MOUNTS[@]}"; do
	IFS='|' read -r ms rss cpu <<<"${MBEST[$what]}"
	awk -v w="$what" -v ms="$ms" -v rss="$rss" -v cpu="$cpu" \
		'BEGIN { printf "| %s | %.0f | %.1f | %s |\n", w, ms, rss / 1024, cpu }'
done
if grep -qiE 'error|AddressSanitizer' "$WORK/daemon.log"; then
	echo; echo "daemon log has errors:"; grep -iE 'error|AddressSanitizer' "$WORK/daemon.log" | head
fi
