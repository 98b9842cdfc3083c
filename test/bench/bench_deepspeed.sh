#!/bin/bash
# bench_deepspeed.sh - a DeepSpeed ZeRO-3 checkpoint's fp32 weights to one
# safetensors file: through a shardfs mount against DeepSpeed's own
# zero_to_fp32 (issue 27).
#
# Usage: test/bench/bench_deepspeed.sh [--bin DIR] [--reps N] [--keep] [MIB]
#   MIB       fp32 weights of the checkpoint in MiB (default 2048; the
#             checkpoint on disk is about 3x: weights and Adam's moments)
#   --bin DIR directory with the shardfs and shardctl binaries
#             (default: $SHARDFS_BIN, else build/tools next to this tree)
#   --reps N  best of N runs per row (default 3)
#   --keep    keep the temporary data and logs
#   DS_PY=PYTHON in the environment: a python with deepspeed (and torch);
#             default /tmp/tv/bin/python, else python3
#
# Writes, with DeepSpeed on CPU (DS_ACCELERATOR=cpu, 4 gloo ranks under
# torchrun, bf16, ZeRO 3, AdamW with torch_adam, one step), a checkpoint
# DIR/latest + DIR/global_step1/ of square-ish Linear layers (odd sizes:
# every one padded over the 4 ranks). With every file in the page cache,
# it times (best of --reps):
#   zero_to_fp32  python -m deepspeed.utils.zero_to_fp32 DIR OUT
#                 --safe_serialization (wall, peak RSS)
#   shardfs       a fresh mount, then every fp32 weight (model.safetensors'
#                 entries but optimizer/ and module/) copied through a
#                 16 MiB buffer into one safetensors file
#                 (bench_deepspeed.py read; wall, peak RSS of the reader
#                 and of the daemon)
# checks that both files hold the same tensors byte for byte, and prints a
# markdown table. Not a ctest test. Always unmounts, stops the daemon and
# (unless --keep) removes its data, also on ^C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_deepspeed.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
REPS=3
bench_parse_args "$@"
MIB=${ARGS[0]:-2048}
[[ $MIB =~ ^[1-9][0-9]*$ ]] || { echo "$ME: MIB wants a positive number" >&2; exit 2; }
DS_PY=${DS_PY:-}
if [[ -z $DS_PY ]]; then
	if [[ -x /tmp/tv/bin/python ]]; then DS_PY=/tmp/tv/bin/python; else DS_PY=python3; fi
fi
PY=/usr/bin/python3
BPY=$HERE/bench_deepspeed.py
bench_need_tools
[[ -x /usr/bin/time ]] || { echo "$ME: needs /usr/bin/time" >&2; exit 1; }
DS_ACCELERATOR=cpu "$DS_PY" -c 'import deepspeed' 2>/dev/null ||
	{ echo "$ME: $DS_PY cannot import deepspeed (set DS_PY)" >&2; exit 1; }
TORCHRUN=$(dirname "$DS_PY")/torchrun
[[ -x $TORCHRUN ]] || { echo "$ME: needs $TORCHRUN" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sfbench-ds-XXXXXX)
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

mount_store() { # fresh daemon serving STORE at MNT
	"$SHARDFS" -f "$STORE" "$MNT" 2>>"$WORK/daemon.log" &
	DPID=$!
	wait_mounted "$MNT" "$DPID" 60 "$WORK/daemon.log" || exit 1
}
daemon_rss_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$DPID/status"; }
timed() { # timed FILE CMD...: FILE gets "wall_s rss_kib"
	local out=$1; shift
	/usr/bin/time -f '%e %M' -o "$out" "$@"
}
best() { sort -g | head -1; }

echo "writing a ZeRO-3 checkpoint of ${MIB} MiB of fp32 weights on 4 ranks ..." >&2
DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 "$TORCHRUN" --nproc_per_node 4 \
	--master_port 29677 "$BPY" write "$STORE/ck" "$MIB" >>"$WORK/ds.log" 2>&1 ||
	{ tail "$WORK/ds.log" >&2; exit 1; }
rm -f "$STORE/ck/zero_to_fp32.py" "$STORE/ck/zero_to_torch.py"
CK_BYTES=$(du -cb "$STORE"/ck/*/* | tail -1 | cut -f1)
find "$STORE" -type f -exec cat {} + >/dev/null

declare -A T R
for _ in $(seq "$REPS"); do
	rm -rf "$WORK/z2f"
	timed "$WORK/t" env DS_ACCELERATOR=cpu "$DS_PY" -m deepspeed.utils.zero_to_fp32 \
		"$STORE/ck" "$WORK/z2f" --safe_serialization >>"$WORK/ds.log" 2>&1
	sync -f "$WORK/z2f"
	T[z]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[z]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	rm -f "$WORK/out.safetensors"
	t0=$(now)
	mount_store
	t1=$(now)
	T[mnt]+="$(echo "$t1 - $t0" | bc)"$'\n'
	timed "$WORK/t" sh -c "'$PY' '$BPY' read '$MNT/ck' '$WORK/out.safetensors' && sync -f '$WORK/out.safetensors'"
	T[sf]+="$(cut -d' ' -f1 "$WORK/t")"$'\n'; R[sf]+="$(cut -d' ' -f2 "$WORK/t")"$'\n'
	R[d]+="$(daemon_rss_kib)"$'\n'
	stop_daemon
	Z=$(ls "$WORK"/z2f/*.safetensors)
	[[ $(echo "$Z" | wc -l) == 1 ]] || { echo "$ME: zero_to_fp32 wrote several shards: $Z" >&2; exit 1; }
	$PY "$BPY" same "$Z" "$WORK/out.safetensors" >&2 ||
		{ echo "$ME: the mount's weights differ from zero_to_fp32's" >&2; exit 1; }
done

b() { printf '%s' "${T[$1]}" | best; }
mx() { printf '%s' "${R[$1]}" | sort -g | tail -1; }
OUT_BYTES=$(stat -c %s "$WORK/out.safetensors")
z_s=$(b z); z_r=$(mx z); sf_s=$(b sf); sf_r=$(mx sf); d_r=$(mx d)
printf '\n%s MiB of fp32 weights, ZeRO 3 on 4 ranks (deepspeed %s), %s bytes of checkpoint files, %s bytes of safetensors; best of %s\n\n' \
	"$MIB" "$(DS_ACCELERATOR=cpu "$DS_PY" -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null)" \
	"$CK_BYTES" "$OUT_BYTES" "$REPS"
echo "| fp32 weights to one safetensors file | seconds | GB/s | peak RSS MiB | time vs zero_to_fp32 | RSS vs zero_to_fp32 |"
echo "|---|---:|---:|---:|---:|---:|"
printf '| zero_to_fp32 --safe_serialization | %.2f | %.2f | %d | 1.00 | 1.00 |\n' "$z_s" \
	"$(echo "$OUT_BYTES / $z_s / 1000000000" | bc -l)" "$((z_r / 1024))"
printf '| shardfs: read through a fresh mount (reader + daemon) | %.2f | %.2f | %d + %d | %.2f | %.3f |\n' \
	"$sf_s" "$(echo "$OUT_BYTES / $sf_s / 1000000000" | bc -l)" "$((sf_r / 1024))" \
	"$((d_r / 1024))" "$(echo "$sf_s / $z_s" | bc -l)" "$(echo "($sf_r + $d_r) / $z_r" | bc -l)"
printf '\nmount until served (not in the row above): %.2f s\n' "$(b mnt)"
