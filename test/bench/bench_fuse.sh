#!/bin/bash
# bench_fuse.sh - attempts to move FUSE's own limit (issue 12, items 3 and
# 4), each one its own row, against the raw read and the FUSE ceiling of
# the same run.
#
# Usage: test/bench/bench_fuse.sh [--bin DIR] [--ceiling PATH] [--reps N] [--keep] [SIZE]
#   SIZE      checkpoint size for `shardctl gen --layout llama` (default 2G)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --ceiling PATH  the fuse_ceiling binary (default: DIR/../test/bench/
#             fuse_ceiling)
#   --reps N  time every row N times, each on its own fresh daemon, and
#             report the fastest (default 3)
#   --keep    keep the temporary checkpoint and logs (printed at the end)
#   BENCH_QUICK=1 in the environment: a 256M run
#   BENCH_FUSE_ONLY=ceiling|shardfs|folios: one part of the table only
#
# Needs root: a row raises fs.fuse.max_pages_limit, one fs.pipe-max-size
# for the run (both restored at the end), passthrough needs CAP_SYS_ADMIN;
# free page reporting to the host is paused for the run only with
# BENCH_STEADY_MEMORY=1 (benchlib.sh bench_steady_memory; the title says).
#
# Generates one checkpoint, reads every payload file once so the page cache
# is warm, and times each row with one cat of its files, or, where a row
# names a way of reading cat has not (O_DIRECT, an mmap reader, another
# read size), with fuse_reader.py:
#   raw       the payload files: dd bs=1M and cat (the ratio bases), and
#             fuse_reader (1 MiB and 16 MiB reads, for its own rows)
#   ceiling   fuse_ceiling (a daemon that does no work) serving files of
#             the tensor files' sizes with shardfs's transfer settings, and
#             with each experiment of fuse_ceiling -x: notify_store pushing
#             ahead of the reader, bigger requests, direct_io (1 MiB reads;
#             16 MiB reads in 16 MiB requests; O_DIRECT 16 MiB reads split
#             into 1 MiB requests in flight together), direct_io with
#             FUSE_DIRECT_IO_ALLOW_MMAP and an mmap reader, and passthrough
#             (the payload files themselves, mapped by the kernel); then
#             one file per payload file replying with its real bytes, from
#             a mapping of it (-x file) and spliced from it (-x splice, at
#             the default and a raised fs.pipe-max-size), against the
#             pattern on the same four files
#   shardfs   tensors/ and model.safetensors through shardfs (fresh mount,
#             then again), by default and with --direct-io; 1 MiB and
#             64 KiB reads, O_DIRECT 16 MiB reads, an mmap reader
#   folios    re-reads against the page cache's folio sizes: the raw files
#             cached in 4 KiB folios and in large ones, and the mount (STORE
#             the checkpoint itself: read-only, no_open; and a store of
#             checkpoints: an OPEN, RELEASE and GETATTR for every file), and
#             4096 files of 64 KiB through fuse_ceiling with and without
#             those round trips
# Prints a markdown table: what, bytes, seconds, GB/s, ratio vs dd and vs
# cat of the payload files and vs the FUSE ceiling row (fresh mount) of
# this run, a note, and for a row below its target (0.8 of dd) the one
# sentence why (benchlib.sh bench_why), and the average
# folio size (pages) of the page cache behind the folio rows. Not a ctest
# test. Always unmounts, stops the daemon, restores the sysctl and (unless
# --keep) removes its temporary data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_fuse.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
SIZE=2G
[[ ${BENCH_QUICK:-0} == 1 ]] && SIZE=256M
ONLY=${BENCH_FUSE_ONLY:-}
bench_parse_args_ceiling "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
PY=/usr/bin/python3
READER="$PY $HERE/fuse_reader.py"
bench_need_tools
[[ -n $CEILING ]] || CEILING=$BIN/../test/bench/fuse_ceiling
[[ -x $CEILING ]] || { echo "$ME: $CEILING not built (make fuse_ceiling)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "$ME: needs root (sysctl, passthrough)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sfbench-fuse-XXXXXX)
STORE=$WORK/store        # a store holding the one checkpoint
CKPT=$STORE/ckpt
MNT=$WORK/mnt
DPID=""
ROWS=()
declare -A BEST  # what -> "bytes|seconds"
declare -A NOTE  # what -> extra column text
MPL=/proc/sys/fs/fuse/max_pages_limit
MPL_OLD=""

PMS=/proc/sys/fs/pipe-max-size
PMS_OLD=""

cleanup() {
	stop_daemon
	[[ -z $MPL_OLD ]] || echo "$MPL_OLD" >"$MPL" || true
	[[ -z $PMS_OLD ]] || echo "$PMS_OLD" >"$PMS" || true
	bench_restore_memory
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bench_steady_memory "$ME"

# timed_read WHAT LISTFILE [READER OPTIONS]: one cat of the files, or
# fuse_reader.py with the options given (dd: dd bs=1M file after file)
timed_read() {
	local what=$1 list=$2 res
	shift 2
	if [[ $# == 0 ]]; then
		res=$(bench_cat_list "$list")
	elif [[ $1 == dd ]]; then
		res=$(bench_dd_list "$list")
	else
		res=$($READER "$@" <"$list")
	fi || { echo "$ME: reading $what failed" >&2; exit 1; }
	bench_keep_row "$what" "${res% *}" "${res#* }"
}

# ceiling_row WHAT READER_OPTS -- CEILING_OPTS: a fresh fuse_ceiling of
# the tensor files' sizes (or of the payload files, pt.list, for -x
# passthrough, file or splice, or with the word pt among CEILING_OPTS),
# read once, REPS times
ceiling_row() {
	local what=$1 ropts=() copts=() list=$WORK/ceiling.list paths=$WORK/ceiling
	shift
	while [[ $# -gt 0 && $1 != -- ]]; do ropts+=("$1"); shift; done
	shift
	copts=("$@")
	if [[ " ${copts[*]} " == *" passthrough "* || " ${copts[*]} " == *" file "* ||
	      " ${copts[*]} " == *" splice "* || " ${copts[*]} " == *" pt "* ]]; then
		local o kept=()
		for o in ${copts[@]+"${copts[@]}"}; do [[ $o == pt ]] || kept+=("$o"); done
		copts=(${kept[@]+"${kept[@]}"})
		list=$WORK/pt.list
		paths=$WORK/pt
	fi
	for _ in $(seq "$REPS"); do
		bench_start_mount "$CEILING" -f "${copts[@]}" "$list" "$MNT"
		timed_read "$what" "$paths" ${ropts[@]+"${ropts[@]}"}
		stop_daemon
	done
}

# small_rows WHAT CEILING_OPTS: 4096 files of 64 KiB on a fresh
# fuse_ceiling, read twice (again: from the page cache), REPS times
small_rows() {
	local what=$1
	shift
	for _ in $(seq "$REPS"); do
		bench_start_mount "$CEILING" -f "$@" "$WORK/small.list" "$MNT"
		timed_read "$what, fresh mount" "$WORK/small"
		timed_read "$what, again" "$WORK/small"
		stop_daemon
	done
}

# shardfs_rows WHAT LISTFILE [READER OPTIONS] [-- SHARDFS OPTIONS]: a
# fresh mount read twice ("again": from the mount's page cache, or with
# --direct-io from the daemon again), REPS times
shardfs_rows() {
	local what=$1 list=$2 ropts=()
	shift 2
	while [[ $# -gt 0 && $1 != -- ]]; do ropts+=("$1"); shift; done
	[[ $# -gt 0 ]] && shift
	for _ in $(seq "$REPS"); do
		bench_start_mount "$SHARDFS" -f "$@" "$CKPT" "$MNT"
		timed_read "$what, fresh mount" "$list" ${ropts[@]+"${ropts[@]}"}
		timed_read "$what, again" "$list" ${ropts[@]+"${ropts[@]}"}
		stop_daemon
	done
}

# mmap_refused WHAT CEILING_OPTS: a row noting how mapping a file of a
# fresh fuse_ceiling with those options fails (none when it works)
mmap_refused() {
	local what=$1
	shift
	bench_start_mount "$CEILING" -f "$@" "$WORK/ceiling.list" "$MNT"
	if ! head -1 "$WORK/ceiling" | $READER --mmap >/dev/null 2>"$WORK/mmap.err"; then
		ROWS+=("$what")
		NOTE[$what]="refused: $(sed 's/^[^]]*\] //' "$WORK/mmap.err" | head -1)"
	fi
	stop_daemon
}

# folios FILE...: the average folio size, in pages, of the page cache
# behind the files (mapped and touched; /proc/self/pagemap and
# /proc/kpageflags, root)
folios() {
	$PY - "$@" <<'EOF'
import ctypes, mmap, os, struct, sys
pages = heads = tails = 0
pm = open("/proc/self/pagemap", "rb", buffering=0)
kf = open("/proc/kpageflags", "rb", buffering=0)
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    size = os.fstat(fd).st_size
    if size == 0:
        os.close(fd)
        continue
    m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    c = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(c)
    for i in range(0, size, 4096):
        m[i]
    n = (size + 4095) // 4096
    pm.seek(base // 4096 * 8)
    ents = struct.unpack("%dQ" % n, pm.read(8 * n))
    for e in ents:
        if not e >> 63:
            continue
        kf.seek((e & ((1 << 55) - 1)) * 8)
        fl = struct.unpack("Q", kf.read(8))[0]
        pages += 1
        heads += bool(fl & (1 << 15))
        tails += bool(fl & (1 << 16))
    del c
    m.close()
print("%.1f" % (pages / max(1, pages - tails)))
EOF
}

echo "generating a $SIZE llama checkpoint in $CKPT ..." >&2
"$SHARDCTL" gen --layout llama --ranks 4 --size "$SIZE" --seed 1 "$CKPT" >/dev/null
find "$CKPT" -path '*/rank-*' -type f | sort >"$WORK/payloads"
# The payload files in the page cache as a cold read leaves them (read
# back through readahead, in large folios), not as the generator's writes
# left them: raw reads vary 2-3x with the folio sizes.
$PY -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' \
	$(cat "$WORK/payloads")
cat $(cat "$WORK/payloads") >/dev/null

rawbytes=0
while read -r f; do rawbytes=$((rawbytes + $(stat -c %s "$f"))); done <"$WORK/payloads"
RAW="raw payload files (dd bs=1M)"
RAW_CAT="raw payload files (cat)"
for _ in $(seq "$REPS"); do
	timed_read "$RAW" "$WORK/payloads" dd
	timed_read "$RAW_CAT" "$WORK/payloads"
	timed_read "raw payload files (fuse_reader)" "$WORK/payloads" --bs $((1 << 20))
	timed_read "raw payload files (fuse_reader, 16 MiB reads)" "$WORK/payloads" --bs $((16 << 20))
done

$PY "$HERE/bench_plan.py" "$CKPT" "$MNT" tensors >"$WORK/tensors"
echo "$MNT/model.safetensors" >"$WORK/st"
"$SHARDCTL" info "$CKPT" |
	awk '/^NAME / {on = 1; next} on && NF == 0 {exit}
	     on {printf "%s t%05d\n", $NF, n++}' >"$WORK/ceiling.list"
awk -v m="$MNT" '{print m "/" $2}' "$WORK/ceiling.list" >"$WORK/ceiling"
# passthrough: one file per payload file, mapped onto it
n=0
while read -r f; do
	printf '%s p%02d\t%s\n' "$(stat -c %s "$f")" "$n" "$f"
	n=$((n + 1))
done <"$WORK/payloads" >"$WORK/pt.list"
awk -v m="$MNT" '{print m "/" $2}' "$WORK/pt.list" | cut -f1 >"$WORK/pt"

CEIL="FUSE ceiling (shardfs's settings), fresh mount"
SIXTEEN=$((16 << 20))
if [[ -z $ONLY || $ONLY == ceiling ]]; then
	ceiling_row "$CEIL" --
	ceiling_row "ceiling, replies from 256 MiB (DRAM, not CPU cache)" -- -x src=256
	ceiling_row "ceiling + notify_store pushing the rest of each file" -- -x store
	ceiling_row "ceiling + notify_store pushing 8 MiB ahead" -- -x store=8
	MPL_OLD=$(cat "$MPL")
	echo 4096 >"$MPL"
	ceiling_row "ceiling, 4 MiB requests, 16 MiB readahead" -- -x pages=1024 -x ra=16384
	ceiling_row "ceiling, direct_io, 1 MiB reads" -- -x dio
	ceiling_row "ceiling, direct_io, 1 MiB reads, replies from 256 MiB" -- -x dio -x src=256
	ceiling_row "ceiling, direct_io, 16 MiB reads and requests" --bs $SIXTEEN -- -x dio -x pages=4096
	ceiling_row "ceiling, direct_io, 16 MiB reads and requests, replies from 256 MiB" \
		--bs $SIXTEEN -- -x dio -x pages=4096 -x src=256
	ceiling_row "ceiling, O_DIRECT 16 MiB reads (async_dio: 16 x 1 MiB in flight)" \
		--bs $SIXTEEN --odirect --
	echo "$MPL_OLD" >"$MPL"
	MPL_OLD=""
	ceiling_row "ceiling, O_DIRECT 1 MiB reads" --odirect --
	ceiling_row "ceiling, 64 KiB reads" --bs $((64 << 10)) --
	ceiling_row "ceiling, direct_io, 64 KiB reads" --bs $((64 << 10)) -- -x dio
	ceiling_row "ceiling, mmap reader" --mmap --
	ceiling_row "ceiling, direct_io + DIRECT_IO_ALLOW_MMAP, mmap reader" --mmap -- -x dio -x mmap
	mmap_refused "mmap of direct_io without DIRECT_IO_ALLOW_MMAP" -x dio
	ceiling_row "passthrough: the payload files mapped by the kernel, fresh mount" -- -x passthrough
	# Real bytes instead of the cached pattern, on the same four files:
	# sent from a mapping of each payload file (as shardfs sends), and
	# spliced from its descriptor (the kernel copies page to page; libfuse
	# splices a reply only into a pipe that holds it whole, so
	# fs.pipe-max-size goes to 4 MiB for that row, and the default 1 MiB
	# row shows libfuse's fallback: a read into a buffer, then writev).
	ceiling_row "ceiling, one file per payload file (the cached pattern)" -- pt
	ceiling_row "ceiling, one file per payload file, replies from a mapping of it" -- -x file
	ceiling_row "ceiling, one file per payload file, replies spliced from it (pipe-max-size 1 MiB)" -- -x splice
	PMS_OLD=$(cat "$PMS")
	echo $((4 << 20)) >"$PMS"
	ceiling_row "ceiling, one file per payload file, replies spliced from it (pipe-max-size 4 MiB)" -- -x splice
	echo "$PMS_OLD" >"$PMS"
	PMS_OLD=""
fi

if [[ -z $ONLY || $ONLY == shardfs ]]; then
	K64=$((64 << 10))
	shardfs_rows "shardfs tensors/" "$WORK/tensors"
	shardfs_rows "shardfs tensors/ --direct-io" "$WORK/tensors" -- --direct-io
	shardfs_rows "shardfs model.safetensors" "$WORK/st"
	shardfs_rows "shardfs model.safetensors --direct-io" "$WORK/st" -- --direct-io
	shardfs_rows "shardfs tensors/, O_DIRECT 16 MiB reads" "$WORK/tensors" \
		--odirect --bs $SIXTEEN
	shardfs_rows "shardfs tensors/, 64 KiB reads" "$WORK/tensors" --bs $K64
	shardfs_rows "shardfs tensors/ --direct-io, 64 KiB reads" "$WORK/tensors" \
		--bs $K64 -- --direct-io
	shardfs_rows "shardfs model.safetensors, mmap reader" "$WORK/st" --mmap
	shardfs_rows "shardfs model.safetensors --direct-io, mmap reader" "$WORK/st" \
		--mmap -- --direct-io
fi

if [[ -z $ONLY || $ONLY == folios ]]; then
	# The same bytes cached in 4 KiB folios (a copy written 4 KiB at a
	# time) and in large folios (the copy dropped and read back through
	# readahead), against the mount's page cache.
	mkdir -p "$WORK/copy"
	while read -r f; do
		dd if="$f" of="$WORK/copy/$(basename "$(dirname "$f")")" bs=4k status=none
	done <"$WORK/payloads"
	ls -d "$WORK"/copy/* >"$WORK/copies"
	NOTE["raw copies, cached in 4 KiB folios"]="folio $(folios $(cat "$WORK/copies")) pages"
	for _ in $(seq "$REPS"); do
		timed_read "raw copies, cached in 4 KiB folios" "$WORK/copies"
	done
	$PY -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' \
		$(cat "$WORK/copies")
	cat $(cat "$WORK/copies") >/dev/null
	NOTE["raw copies, cached in large folios"]="folio $(folios $(cat "$WORK/copies")) pages"
	for _ in $(seq "$REPS"); do
		timed_read "raw copies, cached in large folios" "$WORK/copies"
	done
	NOTE["$RAW"]="folio $(folios $(cat "$WORK/payloads")) pages"
	# small files: what a file costs beyond its bytes
	for i in $(seq 0 4095); do printf '65536 s%04d\n' "$i"; done >"$WORK/small.list"
	awk -v m="$MNT" '{print m "/" $2}' "$WORK/small.list" >"$WORK/small"
	mkdir -p "$WORK/smallraw"
	$PY -c 'import os, sys
d = sys.argv[1]; b = os.urandom(65536)
for i in range(4096):
    with open(os.path.join(d, "s%04d" % i), "wb") as f: f.write(b)' "$WORK/smallraw"
	ls -d "$WORK"/smallraw/* >"$WORK/smallraw.list"
	cat $(cat "$WORK/smallraw.list") >/dev/null
	for _ in $(seq "$REPS"); do
		timed_read "raw, 4096 files of 64 KiB" "$WORK/smallraw.list"
	done
	small_rows "ceiling, 4096 files of 64 KiB (OPEN, RELEASE, GETATTR each)"
	small_rows "ceiling, 4096 files of 64 KiB, read-only + no_open" -x noopen
	bench_start_mount "$SHARDFS" -f "$CKPT" "$MNT"
	$READER <"$WORK/tensors" >/dev/null
	for _ in $(seq "$REPS"); do
		timed_read "shardfs tensors/, again (mount's page cache)" "$WORK/tensors"
		timed_read "shardfs tensors/, again, 16 MiB reads" "$WORK/tensors" --bs $SIXTEEN
	done
	NOTE["shardfs tensors/, again (mount's page cache)"]="folio $(folios $(cat "$WORK/tensors")) pages"
	stop_daemon
	# the same checkpoint mounted as a store of checkpoints (writable:
	# every open is an OPEN, RELEASE and GETATTRs round trip)
	sed "s|^$MNT/|$MNT/ckpt/|" "$WORK/tensors" >"$WORK/tensors.store"
	bench_start_mount "$SHARDFS" -f "$STORE" "$MNT"
	$READER <"$WORK/tensors.store" >/dev/null
	for _ in $(seq "$REPS"); do
		timed_read "shardfs tensors/, again, STORE a directory of checkpoints" \
			"$WORK/tensors.store"
	done
	stop_daemon
fi

rawgbs=$(echo "${BEST[$RAW]}" | awk -F'|' '{printf "%.6f", $1 / $2 / 1e9}')
catgbs=$(echo "${BEST[$RAW_CAT]}" | awk -F'|' '{printf "%.6f", $1 / $2 / 1e9}')
cgbs=""
ceilr=""
if [[ -n ${BEST[$CEIL]+set} ]]; then
	cgbs=$(echo "${BEST[$CEIL]}" | awk -F'|' '{printf "%.6f", $1 / $2 / 1e9}')
	ceilr=$(awk -v c="$cgbs" -v r="$rawgbs" 'BEGIN {printf "%.2f", c / r}')
fi
echo
echo "FUSE limit experiments: llama $SIZE, 4 ranks, $(nproc) cores, $(uname -r)," \
	"best of $REPS, load $(cut -d' ' -f1-3 /proc/loadavg), $(bench_memory_label)"
echo "(rows read by one cat of their files unless they name another reader (fuse_reader.py); ratios to dd bs=1M and to cat of the payload files in this run; a row below 0.8 of dd says why)"
echo
echo "| what | bytes | seconds | GB/s | ratio vs dd | ratio vs cat | ratio vs ceiling | note | why below the target |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---|"
for what in "${ROWS[@]}"; do
	[[ -n $what ]] || continue
	if [[ -z ${BEST[$what]+set} ]]; then
		echo "| $what | - | - | - | - | - | - | ${NOTE[$what]:-} | |"
		continue
	fi
	IFS='|' read -r bytes secs <<<"${BEST[$what]}"
	r=$(awk -v b="$bytes" -v s="$secs" -v raw="$rawgbs" 'BEGIN {printf "%.2f", b / s / 1e9 / raw}')
	why=$(bench_why "$what" "$r" "$ceilr")
	[[ $what != ceiling* && $what != passthrough* ]] ||
		why=$(bench_why "FUSE ceiling" "$r")
	awk -v w="$what" -v b="$bytes" -v s="$secs" -v raw="$rawgbs" -v cat="$catgbs" -v c="$cgbs" \
		-v note="${NOTE[$what]:-}" -v why="$why" 'BEGIN { g = b / s / 1e9;
		cr = c == "" ? "-" : sprintf("%.2f", g / c);
		printf "| %s | %d | %.3f | %.2f | %.2f | %.2f | %s | %s | %s |\n", w, b, s, g, g / raw, g / cat, cr, note, why }'
done
if grep -qiE 'error|AddressSanitizer' "$WORK/daemon.log"; then
	echo; echo "daemon log has errors:"; grep -iE 'error|AddressSanitizer' "$WORK/daemon.log" | head
fi
