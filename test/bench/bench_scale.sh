#!/bin/bash
# bench_scale.sh - mounting and listing checkpoints of many shards, and
# checkpoints of many terabytes (issue 12, item 7).
#
# Usage: test/bench/bench_scale.sh [--bin DIR] [--ceiling PATH] [--reps N] [--keep] [SHARDS...]
#   SHARDS    shard counts of the many-tensor checkpoints (default 10000
#             100000 1000000): SHARDS/8 small tensors (BF16 [32, 64]) of 8
#             ranks each, `shardctl gen --layout many`
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --ceiling PATH  the fuse_ceiling binary (default: DIR/../test/bench/
#             fuse_ceiling); without it the ceiling columns are left out
#   --reps N  runs of each row; times are the fastest, RSS the largest
#             (default 3)
#   --keep    keep the generated checkpoints and logs
#   BENCH_QUICK=1 in the environment: 10000 and 50000 shards, and 256M
#             against 256G sparse, one run each
#
# For every checkpoint, a fresh daemon each run, timed from its start:
#   first ls    until `ls MNT/ck/` returns (the manifest parsed and
#               validated, the tree built, the mount up)
#   ls -lR      `ls -lR MNT/ck/tensors/` right after (every entry stat'ed:
#               readdirplus, plus ls's own xattr lookups of each file)
#   find        `find MNT | wc -l` after that
#   ceiling     the same `ls -lR` of a fresh mount of fuse_ceiling -x ls
#               (a daemon that does no work: READDIRPLUS with attributes
#               and GETXATTR answered ENODATA from memory, as shardfs
#               answers them) serving files of the same names and sizes,
#               run right after each shardfs run: what FUSE's round trips
#               alone cost a listing on this machine (GNU ls asks for two
#               xattrs of every file), the bound `ls -lR` cannot beat
# with the manifest's size, the daemon's CPU seconds up to the first ls
# (utime + stime: less at the mercy of other load than wall time), and its
# peak RSS (VmHWM) after the first ls and at the end. Then the same
# mount-to-first-ls for a sparse `--layout llama` checkpoint of 2G and one
# of 2T (`shardctl gen --sparse`: zero tensors in payload files with holes,
# so 2 TB take seconds and megabytes to make): what a checkpoint's size
# costs at mount is only its checksum list. Prints markdown tables and the
# load average seen (timings on a busy machine mean little; CPU and RSS
# less so). Not a ctest test. Always unmounts, stops the daemon and (unless
# --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_scale.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
bench_parse_args_ceiling "$@"
[[ -n $CEILING ]] || CEILING=$BIN/../test/bench/fuse_ceiling
CEILING_SKIP=""
[[ -x $CEILING ]] ||
	CEILING_SKIP="$CEILING not built (make fuse_ceiling, or --ceiling PATH)"
SHARDS=(10000 100000 1000000)
SPARSE=(2G 2T)
if [[ ${BENCH_QUICK:-0} == 1 ]]; then
	SHARDS=(10000 50000)
	SPARSE=(256M 256G)
	REPS=1
fi
[[ ${#ARGS[@]} -ge 1 ]] && SHARDS=("${ARGS[@]}")
for n in "${SHARDS[@]}"; do
	[[ $n =~ ^[1-9][0-9]*$ ]] && ((n % 8 == 0 && n / 8 <= 1048574)) ||
		{ echo "$ME: shard counts must be multiples of 8, at most 8388592" >&2; exit 2; }
done
bench_need_tools bc
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

WORK=$(mktemp -d /tmp/sfbench-scale-XXXXXX)
MNT=$WORK/mnt
DPID=""
mkdir -p "$MNT"
cleanup() {
	stop_daemon
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

best() { sort -g | head -1; }
most() { sort -g | tail -1; }
hwm_mib() { awk '/^VmHWM:/ {printf "%.0f", $2 / 1024}' "/proc/$DPID/status"; }
cpu_s() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$DPID/stat"; }

# run_once STORE: a fresh daemon on STORE; sets T_LS (start to the end of
# the first `ls MNT/ck/`), CPU_LS, RSS_LS, T_LSR, T_FIND, N_FIND, RSS_END.
# With WHAT=ls only the first part.
run_once() {
	local store=$1 t0 t1 i
	t0=$(now)
	"$SHARDFS" -f "$store" "$MNT" 2>>"$WORK/daemon.log" &
	DPID=$!
	for i in $(seq 12000); do
		mounted "$MNT" && break
		kill -0 "$DPID" 2>/dev/null || { tail "$WORK/daemon.log" >&2; exit 1; }
		sleep 0.005
	done
	mounted "$MNT" || { echo "$ME: not mounted after 60 s" >&2; exit 1; }
	ls "$MNT/ck/" >/dev/null
	t1=$(now)
	T_LS=$(echo "$t1 - $t0" | bc)
	CPU_LS=$(cpu_s)
	RSS_LS=$(hwm_mib)
	if [[ ${WHAT:-all} == all ]]; then
		t0=$(now)
		ls -lR "$MNT/ck/tensors/" >/dev/null
		t1=$(now)
		T_LSR=$(echo "$t1 - $t0" | bc)
		t0=$(now)
		N_FIND=$(find "$MNT" | wc -l)
		t1=$(now)
		T_FIND=$(echo "$t1 - $t0" | bc)
		[[ -s $WORK/ceiling.list ]] ||
			find "$MNT/ck/tensors" -type f -printf '%s %f\n' >"$WORK/ceiling.list"
	fi
	RSS_END=$(hwm_mib)
	stop_daemon
}

# run_ceiling: T_CEIL, `ls -lR` of a fresh fuse_ceiling -x ls mount of
# $WORK/ceiling.list (the tensors/ files of the last run_once, flat as
# they are: the many layout's names have no '/').
run_ceiling() {
	local t0 t1
	"$CEILING" -f -x ls "$WORK/ceiling.list" "$MNT" 2>>"$WORK/ceiling.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 60 "$WORK/ceiling.log" || exit 1
	t0=$(now)
	ls -lR "$MNT/" >/dev/null
	t1=$(now)
	T_CEIL=$(echo "$t1 - $t0" | bc)
	stop_daemon
}

[[ -z $CEILING_SKIP ]] || echo "$ME: leaving out the ceiling columns: $CEILING_SKIP" >&2
echo "| checkpoint | shards | manifest MB | mount to first \`ls\` s | daemon CPU to it s | \`ls -lR tensors/\` s | same on the FUSE ceiling s | speed vs ceiling | \`find\` entries | \`find\` s | peak RSS at first \`ls\` MiB | peak RSS at the end MiB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in "${SHARDS[@]}"; do
	nt=$((n / 8))
	store=$WORK/many-$n
	echo "generating $nt tensors x 8 ranks ..." >&2
	"$SHARDCTL" gen --layout many --tensors "$nt" --ranks 8 --size $((nt * 4096)) \
		--no-blobs "$store/ck" >&2
	mbytes=$(stat -c %s "$store/ck/manifest.json")
	cat "$store/ck/manifest.json" >/dev/null # in the page cache, as after gen
	tls="" cpu="" tlsr="" tceil="" tfind="" rls="" rend=""
	rm -f "$WORK/ceiling.list"
	for _ in $(seq "$REPS"); do
		run_once "$store"
		[[ $N_FIND == $((nt + 6)) ]] ||
			{ echo "$ME: find saw $N_FIND entries, not $((nt + 6))" >&2; exit 1; }
		tls+="$T_LS"$'\n' cpu+="$CPU_LS"$'\n' tlsr+="$T_LSR"$'\n'
		tfind+="$T_FIND"$'\n' rls+="$RSS_LS"$'\n' rend+="$RSS_END"$'\n'
		if [[ -z $CEILING_SKIP ]]; then
			run_ceiling
			tceil+="$T_CEIL"$'\n'
		fi
	done
	bl=$(printf '%s' "$tlsr" | best)
	bc_=-
	ratio=-
	if [[ -z $CEILING_SKIP ]]; then
		bc_=$(printf '%s' "$tceil" | best)
		ratio=$(printf '%.2f' "$(echo "$bc_ / $bl" | bc -l)")
		bc_=$(printf '%.3f' "$bc_")
	fi
	printf '| %s tensors x 8 ranks | %s | %.1f | %.3f | %.2f | %.3f | %s | %s | %s | %.3f | %s | %s |\n' \
		"$nt" "$n" "$(echo "$mbytes / 1000000" | bc -l)" \
		"$(printf '%s' "$tls" | best)" "$(printf '%s' "$cpu" | best)" \
		"$bl" "$bc_" "$ratio" "$N_FIND" "$(printf '%s' "$tfind" | best)" \
		"$(printf '%s' "$rls" | most)" "$(printf '%s' "$rend" | most)"
	[[ $KEEP == 1 ]] || rm -rf "$store"
done

echo
echo "| sparse checkpoint (llama, 4 ranks) | tensor bytes | shards | manifest MB | mount to first \`ls\` s | daemon CPU to it s | peak RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for size in "${SPARSE[@]}"; do
	store=$WORK/sparse-$size
	out=$("$SHARDCTL" gen --layout llama --ranks 4 --size "$size" --sparse "$store/ck")
	echo "$out" >&2
	nsh=$(echo "$out" | sed -n 's/.* \([0-9]*\) shards, \([0-9]*\) bytes.*/\1/p')
	nbytes=$(echo "$out" | sed -n 's/.* \([0-9]*\) shards, \([0-9]*\) bytes.*/\2/p')
	mbytes=$(stat -c %s "$store/ck/manifest.json")
	cat "$store/ck/manifest.json" >/dev/null
	tls="" cpu="" rls=""
	for _ in $(seq "$REPS"); do
		WHAT=ls run_once "$store"
		tls+="$T_LS"$'\n' cpu+="$CPU_LS"$'\n' rls+="$RSS_END"$'\n'
	done
	printf '| %s, sparse | %s | %s | %.1f | %.3f | %.2f | %s |\n' "$size" "$nbytes" "$nsh" \
		"$(echo "$mbytes / 1000000" | bc -l)" "$(printf '%s' "$tls" | best)" \
		"$(printf '%s' "$cpu" | best)" "$(printf '%s' "$rls" | most)"
	[[ $KEEP == 1 ]] || rm -rf "$store"
done
echo
echo "best of $REPS; load average $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
