#!/bin/bash
# bench_gpu.sh - the GPU loader against the limits it is held to, on one
# machine with a CUDA device, in one run.
#
# Usage: test/bench/bench_gpu.sh [--bin DIR] [--keep] [SIZE]
#   SIZE      checkpoint size for `shardctl gen --layout llama` (default 4G)
#   --bin DIR directory with shardctl and shardfs-load-gpu (default:
#             $SHARDFS_BIN, else build/tools next to this tree); gpu_baseline
#             is looked for in DIR/../test/bench
#   BENCH_QUICK=1 in the environment: a 512M run
#
# Generates a 4-rank llama checkpoint, exports it with `shardctl export
# --safetensors` (the bytes of the mount's model.safetensors, in a real
# file), reads the file once so it is in the page cache, then measures:
#   pinned H2D   cudaMemcpy from a pinned buffer, the file's size (the limit)
#   file read    chunked preads of the file (page cache), by one thread,
#                and by the loader's reader pool with no device copies (its
#                "file reads alone" pass); the faster is the read rate
#   naive loop   pread into a pageable buffer + synchronous cudaMemcpy
#   loader       shardfs-load-gpu FILE (per file and --per-tensor), best of 3
#   torch        safetensors.torch.load_file(FILE, device="cuda:0"), when
#                python3 has torch and safetensors (best of 3)
# and checks the loader's copy once with --verify. Prints a markdown table
# with each rate's ratio to min(file read rate, pinned H2D), the issue's
# yardstick.
# Exits 77 with a reason when there is no CUDA device or no CUDA build. Not a
# ctest test.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ME=bench_gpu.sh
BIN=${SHARDFS_BIN:-$HERE/../../build/tools}
# shellcheck source=benchlib.sh
source "$HERE/benchlib.sh"
SIZE=4G
[[ ${BENCH_QUICK:-0} == 1 ]] && SIZE=512M
bench_parse_args "$@"
[[ ${#ARGS[@]} -ge 1 ]] && SIZE=${ARGS[0]}
SHARDCTL=$BIN/shardctl
LOADER=$BIN/shardfs-load-gpu
BASE=$BIN/../test/bench/gpu_baseline
for t in "$SHARDCTL" "$LOADER"; do
	[[ -x $t ]] || { echo "$ME: $t not built (use --bin)" >&2; exit 1; }
done
[[ -x $BASE ]] || { echo "SKIP: $BASE not built (a build without CUDA)"; exit 77; }

WORK=$(mktemp -d /tmp/sfbench-gpu-XXXXXX)
cleanup() { bench_remove_work; }
trap cleanup EXIT
trap 'exit 130' INT TERM

"$SHARDCTL" gen --layout llama --size "$SIZE" --ranks 4 "$WORK/ck" >/dev/null
"$SHARDCTL" export --safetensors "$WORK/model.safetensors" "$WORK/ck"
rm -rf "$WORK/ck"
FILE=$WORK/model.safetensors
cat "$FILE" >/dev/null

set +e
base=$("$BASE" "$FILE")
rc=$?
set -e
[[ $rc == 77 ]] && { echo "$base"; exit 77; }
[[ $rc == 0 ]] || { echo "$ME: gpu_baseline failed" >&2; exit 1; }

ROWS=()  # "what|bytes|seconds"
while read -r name bytes secs; do
	case $name in
	pinned_h2d) ROWS+=("pinned H2D cudaMemcpy (64 MiB pinned buffer)|$bytes|$secs") ;;
	read) ROWS+=("file read (64 MiB preads by one thread, page cache)|$bytes|$secs") ;;
	naive) ROWS+=("naive loop: pread + cudaMemcpy from pageable memory|$bytes|$secs") ;;
	esac
done <<<"$base"
h2d=$(awk '$1 == "pinned_h2d" {print $2 / $3}' <<<"$base")
rd=$(awk '$1 == "read" {print $2 / $3}' <<<"$base")

# faster A B: true when "bytes|seconds" A is a faster rate than B (or B empty)
faster() {
	[[ -z $2 ]] || awk -v a="$1" -v b="$2" 'BEGIN {
		split(a, x, "|"); split(b, y, "|"); exit !(x[1] / x[2] > y[1] / y[2]) }'
}

# best_load LABEL [OPTS]: fastest "whole load" of 3 loader runs; also keeps
# the fastest "file reads alone" pass in POOL
POOL=""
best_load() {
	local label=$1 best="" out w r
	shift
	for _ in 1 2 3; do
		out=$("$LOADER" "$@" "$FILE")
		w=$(awk '/^whole load:/ {print $3 "|" $6}' <<<"$out")
		r=$(awk '/^file reads alone:/ {print $4 "|" $7}' <<<"$out")
		faster "$w" "$best" && best=$w
		faster "$r" "$POOL" && POOL=$r
	done
	ROWS+=("$label|$best")
}
best_load "shardfs-load-gpu (one allocation per file)"
best_load "shardfs-load-gpu --per-tensor" --per-tensor
ROWS+=("file read (the loader's reader pool, no device copies)|$POOL")
pool=$(awk -v p="$POOL" 'BEGIN {split(p, x, "|"); print x[1] / x[2]}')
rd=$(awk -v a="$rd" -v b="$pool" 'BEGIN {print (a > b ? a : b)}')
"$LOADER" --verify "$FILE" | grep '^verify:' >"$WORK/verify"
grep -q '^verify: \([0-9]*\) of \1 tensors match' "$WORK/verify" ||
	{ echo "$ME: loader verify failed: $(cat "$WORK/verify")" >&2; exit 1; }

if python3 -c 'import torch, safetensors.torch; assert torch.cuda.is_available()' 2>/dev/null; then
	t=$(python3 - "$FILE" <<'PY'
import os, sys, time
import torch
from safetensors.torch import load_file
path = sys.argv[1]
best = 1e30
for _ in range(3):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    d = load_file(path, device="cuda:0")
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
    del d
    torch.cuda.empty_cache()
print(os.path.getsize(path), best)
PY
)
	ROWS+=("safetensors.torch.load_file(device=cuda:0)|${t% *}|${t#* }")
else
	echo "$ME: no torch+safetensors with CUDA in python3: torch row left out" >&2
fi

limit=$(awk -v a="$h2d" -v b="$rd" 'BEGIN {print (a < b ? a : b)}')
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "shardfs GPU load benchmark: llama $SIZE exported to model.safetensors," \
	"${dev:-CUDA device 0}, $(nproc) cores, best of 3"
echo
echo "| what | bytes | seconds | GB/s | ratio vs min(file read rate, pinned H2D) |"
echo "|---|---:|---:|---:|---:|"
for r in "${ROWS[@]}"; do
	IFS='|' read -r what bytes secs <<<"$r"
	awk -v w="$what" -v b="$bytes" -v s="$secs" -v l="$limit" \
		'BEGIN {printf "| %s | %d | %.3f | %.2f | %.2f |\n", w, b, s, b / s / 1e9, b / s / l}'
done
echo
cat "$WORK/verify"
