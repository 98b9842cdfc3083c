#!/bin/bash
# bench_dcp.sh - PyTorch DCP checkpoints through shardfs against torch's
# own consolidation and against the same tensors in shardfs/1 (issue 11).
#
# Usage: test/bench/bench_dcp.sh [--bin DIR] [--reps N] [--keep] [MIB [NTENSORS]]
#   MIB       size of the 4-rank DCP checkpoint in MiB (default 2048)
#   NTENSORS  tensors of the many-tensor checkpoint (default 10000)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --reps N  best of N runs per row (default 3)
#   --keep    keep the temporary data and logs
#   BENCH_QUICK=1 in the environment: 256 MiB and 2,000 tensors
#
# Needs Debian's python3-torch (torch 1.13) and /usr/bin/time. Writes, with
# torch 1.13 and 4 gloo ranks, a DCP checkpoint of 4 F32 tensors (two
# ShardedTensors split on dim 0, two on dim 1); writes the same tensors
# through a shardfs mount as a shardfs/1 checkpoint (4 row boxes each); and
# a one-process DCP checkpoint of NTENSORS small tensors. With every file in
# the page cache, it times (best of --reps):
#   raw         cat of the DCP files into one file on the same file system
#   torch       torch 1.13's way to one file: load_state_dict into whole
#               tensors in one process, then torch.save (wall, peak RSS)
#   cp          cp of the mount's model.safetensors (fresh mount) into one
#               file (wall; peak RSS of cp and of the daemon), with the
#               default block cache and with --cache-mb 32
#   adapter     model.safetensors read with dd bs=1M through a fresh
#               mount, DCP against the same tensors in shardfs/1 (the
#               adapter's cost), each against dd bs=1M and cat of the
#               .distcp files (the same tensor bytes) read in the same run
#               from the page cache; a row below 0.8 of dd says why
#   first ls    mount of the NTENSORS checkpoint until `ls tensors/` returns
# and prints markdown tables. Not a ctest test. Always unmounts, stops the
# daemon and (unless --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
ME=bench_dcp.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
bench_parse_args "$@"
MIB=${ARGS[0]:-2048}
NT=${ARGS[1]:-10000}
if [[ ${BENCH_QUICK:-0} == 1 ]]; then MIB=${ARGS[0]:-256}; NT=${ARGS[1]:-2000}; fi
PY=/usr/bin/python3
TORCHPY=$HERE/bench_dcp_torch.py
bench_need_tools
[[ -x /usr/bin/time ]] || { echo "$ME: needs /usr/bin/time" >&2; exit 1; }
$PY -c 'import torch' 2>/dev/null || { echo "$ME: needs Debian's python3-torch" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sfbench-dcp-XXXXXX)
STORE=$WORK/store
MNT=$WORK/mnt
DPID=""
mkdir -p "$STORE" "$MNT"
cleanup() {
	stop_daemon
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mount_store() { # mount_store STORE [OPTS]: fresh daemon serving STORE at MNT
	local store=$1; shift
	"$SHARDFS" -f "$@" "$store" "$MNT" 2>>"$WORK/daemon.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 60 "$WORK/daemon.log" || exit 1
}
daemon_rss_mib() { awk '/^VmHWM:/ {printf "%.0f", $2 / 1024}' "/proc/$DPID/status"; }
# timed FILE CMD...: run CMD under /usr/bin/time; FILE gets "wall_s rss_kib"
timed() {
	local out=$1; shift
	/usr/bin/time -f '%e %M' -o "$out" "$@"
}
best() { sort -g | head -1; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }

echo "writing a ${MIB} MiB 4-rank DCP checkpoint with torch 1.13 ..." >&2
$PY "$TORCHPY" write "$STORE/dcp" "$MIB" 2>>"$WORK/torch.log"
echo "writing ${NT} tensors with torch 1.13 ..." >&2
mkdir -p "$WORK/many"
$PY "$TORCHPY" many "$WORK/many/ck" "$NT" 2>>"$WORK/torch.log"
echo "writing the same tensors as shardfs/1 ..." >&2
mkdir -p "$WORK/sfstore"
mount_store "$WORK/sfstore"
$PY "$TORCHPY" shardfs "$STORE/dcp" "$MNT" sf1 2>>"$WORK/torch.log"
stop_daemon
DCP_BYTES=$(du -cb "$STORE"/dcp/* "$STORE"/dcp/.metadata | tail -1 | cut -f1)
printf '%s\n' "$STORE"/dcp/__*.distcp >"$WORK/distcp"
DISTCP_BYTES=$(du -cb "$STORE"/dcp/__*.distcp | tail -1 | cut -f1)
warm "$STORE/dcp" "$WORK/sfstore/sf1"

declare -A T R
for _ in $(seq "$REPS"); do
	# raw: cat of the DCP files into one file
	rm -f "$WORK/out"
	timed "$WORK/t" sh -c "cat '$STORE'/dcp/__*.distcp > '$WORK/out' && sync -f '$WORK/out'"
	T[raw]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[raw]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	rm -f "$WORK/out"
	# torch's consolidation
	timed "$WORK/t" $PY "$TORCHPY" consolidate "$STORE/dcp" "$WORK/out" 2>>"$WORK/torch.log"
	sync -f "$WORK/out"
	T[torch]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[torch]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	rm -f "$WORK/out"
	warm "$STORE/dcp"
	# cp of model.safetensors through a fresh mount
	mount_store "$STORE"
	timed "$WORK/t" sh -c "cp '$MNT/dcp/model.safetensors' '$WORK/out' && sync -f '$WORK/out'"
	T[cp]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[cp]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	R[daemon]+="$(daemon_rss_mib)"$'\n'
	ST_BYTES=$(stat -c %s "$WORK/out")
	stop_daemon
	rm -f "$WORK/out"
	# the same with a 32 MiB block cache (--cache-mb 32)
	mount_store "$STORE" --cache-mb 32
	timed "$WORK/t" sh -c "cp '$MNT/dcp/model.safetensors' '$WORK/out' && sync -f '$WORK/out'"
	T[cp32]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[cp32]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	R[daemon32]+="$(daemon_rss_mib)"$'\n'
	cmp -s "$WORK/out" <(cat "$MNT/dcp/model.safetensors") ||
		{ echo "$ME: two reads of model.safetensors differ" >&2; exit 1; }
	stop_daemon
	rm -f "$WORK/out"
	# the adapter's cost: model.safetensors to /dev/null, DCP vs shardfs/1,
	# against dd bs=1M and cat of the .distcp files (page cache)
	warm "$STORE/dcp" "$WORK/sfstore/sf1"
	res=$(bench_dd_list "$WORK/distcp") || exit 1
	T[dd]+="${res#* }"$'\n'
	res=$(bench_cat_list "$WORK/distcp") || exit 1
	T[cat]+="${res#* }"$'\n'
	mount_store "$STORE"
	t0=$(now); dd if="$MNT/dcp/model.safetensors" of=/dev/null bs=1M status=none; t1=$(now)
	T[st_dcp]+="$(echo "$t1 - $t0" | bc)"$'\n'
	stop_daemon
	mount_store "$WORK/sfstore"
	t0=$(now); dd if="$MNT/sf1/model.safetensors" of=/dev/null bs=1M status=none; t1=$(now)
	T[st_sf1]+="$(echo "$t1 - $t0" | bc)"$'\n'
	stop_daemon
	# first ls of the many-tensor checkpoint
	t0=$(now)
	mount_store "$WORK/many"
	n=$(ls "$MNT/ck/tensors" | wc -l)
	t1=$(now)
	T[ls]+="$(echo "$t1 - $t0" | bc)"$'\n'
	stop_daemon
	[[ $n == "$NT" ]] || { echo "$ME: tensors/ lists $n, not $NT" >&2; exit 1; }
done

b() { printf '%s' "${T[$1]}" | best; }
mx() { printf '%s' "${R[$1]}" | sort -g | tail -1; }
raw=$(b raw)
printf '\n%s MiB 4-rank DCP checkpoint (torch %s), %s bytes of files; best of %s\n\n' \
	"$MIB" "$($PY -c 'import torch; print(torch.__version__)')" "$DCP_BYTES" "$REPS"
echo "| to one file | seconds | GB/s | peak RSS MiB | time vs torch |"
echo "|---|---:|---:|---:|---:|"
torch_s=$(b torch)
row() { # row WHAT SECONDS BYTES RSS
	printf '| %s | %.2f | %.2f | %s | %.2f |\n' "$1" "$2" \
		"$(echo "$3 / $2 / 1000000000" | bc -l)" "$4" "$(echo "$2 / $torch_s" | bc -l)"
}
row "cat of the .distcp files (raw, no conversion)" "$raw" "$DCP_BYTES" \
	"$(( $(mx raw) / 1024 ))"
row "torch 1.13: load_state_dict (whole tensors) + torch.save" "$torch_s" \
	"$DCP_BYTES" "$(( $(mx torch) / 1024 ))"
row "cp MNT/ck/model.safetensors (fresh mount)" "$(b cp)" "$ST_BYTES" \
	"$(( $(mx cp) / 1024 )) (cp) + $(mx daemon) (daemon)"
row "cp MNT/ck/model.safetensors (fresh mount, --cache-mb 32)" "$(b cp32)" "$ST_BYTES" \
	"$(( $(mx cp32) / 1024 )) (cp) + $(mx daemon32) (daemon)"
echo
echo "(model.safetensors read with dd bs=1M; ratios to dd bs=1M and to cat of the .distcp files, the same tensor bytes, from the page cache in this run; no special memory settings; a row below 0.8 of dd says why)"
echo
echo "| model.safetensors, fresh mount | seconds | GB/s | ratio vs dd | ratio vs cat | ratio vs shardfs/1 | why below the target |"
echo "|---|---:|---:|---:|---:|---:|---|"
ddg=$(echo "$DISTCP_BYTES / $(b dd) / 1000000000" | bc -l)
catg=$(echo "$DISTCP_BYTES / $(b cat) / 1000000000" | bc -l)
strow() { # strow WHAT SECONDS
	local g r
	g=$(echo "$ST_BYTES / $2 / 1000000000" | bc -l)
	r=$(printf '%.2f' "$(echo "$g / $ddg" | bc -l)")
	printf '| %s | %.3f | %.2f | %s | %.2f | %.2f | %s |\n' "$1" "$2" "$g" "$r" \
		"$(echo "$g / $catg" | bc -l)" "$(echo "$(b st_sf1) / $2" | bc -l)" \
		"$(bench_why "$1, fresh mount" "$r")"
}
printf '| dd bs=1M of the .distcp files | %.3f | %.2f | 1.00 | %.2f | - |  |\n' "$(b dd)" "$ddg" \
	"$(echo "$ddg / $catg" | bc -l)"
printf '| cat of the .distcp files | %.3f | %.2f | %.2f | 1.00 | - |  |\n' "$(b cat)" "$catg" \
	"$(echo "$catg / $ddg" | bc -l)"
strow "shardfs/1, same tensors" "$(b st_sf1)"
strow "DCP through the adapter" "$(b st_dcp)"
echo
printf '| %s-tensor DCP checkpoint | seconds |\n|---|---:|\n' "$NT"
printf '| daemon start to the end of the first `ls tensors/` | %.3f |\n' "$(b ls)"
