#!/bin/bash
# gpu_session.sh - issue 29 (5): everything one lent GPU session measures,
# in one run of at most ~10 minutes on a bare machine (an H200 with 16
# cores, maybe without libfuse3, fuse3 or a droppable page cache, maybe
# without a network).
#
# Usage: test/bench/gpu_session.sh [--bin DIR] [--keep] [SIZE]
#   SIZE       tensor bytes of the 4-rank llama checkpoint (default 8G;
#              BENCH_QUICK=1: 2G)
#   --bin DIR  prebuilt shardctl, shardfs, shardfs-load-gpu (and
#              DIR/../test/bench/gpu_baseline); default: build them here
#   GPU_SESSION_S   seconds the whole run may take (default 540): rows
#              that would start past it are left out, saying so
#   GPU_SESSION_MOCK=LOADER  a rehearsal without a device: LOADER (the
#              mock-runtime build, gpu/tests' shardfs-load-gpu-mock) stands
#              in for shardfs-load-gpu, nothing is installed, the Python
#              rows are left out, and the table says it is no measurement
#
# Steps: (1) a CUDA device, else exit 77 with the reason, before anything
# else; (2) installs what is missing and can be installed (apt: the build
# dependencies, libfuse3-dev, fuse3; pip: safetensors, fastsafetensors
# when torch with CUDA is there), each bounded, a failure only noted;
# (3) builds shardctl, shardfs (when libfuse3 is there), shardfs-load-gpu
# and gpu_baseline, without MPI; (4) writes the checkpoint with `shardctl
# gen` and the same tensors as one plain model.safetensors (`shardctl
# export --safetensors`); (5) mounts the store when /dev/fuse and
# fusermount3 work; (6) measures, the files in the page cache ("warm";
# "cold" rows too when /proc/sys/vm/drop_caches is writable), every mount
# row on a fresh mount:
#   pinned H2D         gpu_baseline: cudaMemcpy from pinned memory (the bound)
#   loader, plain file shardfs-load-gpu FILE (best of 3)
#   loader, mount      shardfs-load-gpu --no-direct MNT/ck/model.safetensors
#   loader, direct     shardfs-load-gpu MNT/ck/model.safetensors (the direct
#                      path: bytes direct / through the mount reported)
#   safetensors        safetensors.torch.load_file(F, device="cuda:0"), plain
#                      file and the mount's
#   fastsafetensors    its loader (nogds) of the same files
# and prints one markdown table: GB/s and the ratio to the pinned H2D
# bound. Where no mount works, the mount rows are left out and the table
# says why; where the build fails, only the Python rows of a plain file
# written here (numpy) remain. Always unmounts and removes its data.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
ME=gpu_session.sh
T_START=$(date +%s)
BUDGET=${GPU_SESSION_S:-540}
MOCK=${GPU_SESSION_MOCK:-}
SIZE=8G
[[ ${BENCH_QUICK:-0} == 1 ]] && SIZE=2G
BIN=""
KEEP=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--bin) BIN=$(cd "$2" && pwd) || exit 2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
	-*) echo "$ME: unknown option $1" >&2; exit 2 ;;
	*) SIZE=$1; shift ;;
	esac
done
NOTES=()   # sentences printed under the table
note() { NOTES+=("$*"); echo "$ME: $*" >&2; }
left() { echo $((BUDGET - ($(date +%s) - T_START))); }

# (1) a device, before anything is installed or built
if [[ -z $MOCK ]]; then
	if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
		why="nvidia-smi lists no GPU"
		command -v nvidia-smi >/dev/null || why="no nvidia-smi"
		ls /dev/nvidia[0-9]* >/dev/null 2>&1 || why="$why, no /dev/nvidia*"
		echo "SKIP: no CUDA device ($why): nothing to measure here"
		exit 77
	fi
	DEV=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
else
	[[ -x $MOCK ]] || { echo "$ME: GPU_SESSION_MOCK=$MOCK is not executable" >&2; exit 2; }
	DEV="MOCK runtime (host memory; no device)"
fi

WORK=$(mktemp -d /tmp/sf-gpu-session.XXXXXX)
STORE=$WORK/store
MNT=$WORK/mnt
DPID=""
mounted() { grep -q " $1 fuse" /proc/mounts; }
stop_daemon() {
	if mounted "$MNT"; then fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true; fi
	if [[ -n $DPID ]]; then
		for _ in $(seq 50); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$DPID" 2>/dev/null || true
		wait "$DPID" 2>/dev/null || true
	fi
	DPID=""
}
cleanup() {
	stop_daemon
	if [[ $KEEP == 1 ]]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$STORE" "$MNT"

# (2) installs: bounded, never fatal (the machine may have no network)
PY=$(command -v python3 || true)
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
NET=0
[[ -z $MOCK ]] && timeout 5 getent hosts deb.debian.org pypi.org >/dev/null 2>&1 && NET=1
[[ -n $MOCK || $NET == 1 ]] || note "no network (no name resolves): nothing installed, what is there is used"
if [[ $NET == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
	want=()
	for p in cmake make gcc pkg-config libjansson-dev libxxhash-dev libzstd-dev \
		libfuse3-dev fuse3 attr python3 python3-numpy; do
		have_pkg "$p" || want+=("$p")
	done
	if [[ ${#want[@]} -gt 0 ]]; then
		echo "$ME: installing ${want[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		timeout 60 apt-get update -q >/dev/null 2>&1 || true
		timeout 150 apt-get install -y -q --no-install-recommends "${want[@]}" >/dev/null 2>&1 ||
			note "apt-get could not install all of: ${want[*]} (no network or no such package); going on with what is there"
	fi
fi
PY=$(command -v python3 || true)
TORCH=0
if [[ -z $MOCK && -n $PY ]] &&
	"$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	TORCH=1
	for m in safetensors fastsafetensors; do
		"$PY" -c "import $m" 2>/dev/null && continue
		pip=("$PY" -m pip install -q --retries 0 --timeout 10 "$m")
		[[ $NET == 1 ]] && { timeout 90 "${pip[@]}" >/dev/null 2>&1 ||
			timeout 90 "${pip[@]}" --break-system-packages >/dev/null 2>&1; }
		"$PY" -c "import $m" 2>/dev/null || note "no $m for python3 (pip could not install it): its rows are left out"
	done
elif [[ -z $MOCK ]]; then
	note "no python3 with torch and CUDA: the safetensors and fastsafetensors rows are left out"
fi

# (3) build (or --bin)
if [[ -z $BIN ]]; then
	BUILD=$WORK/build
	BIN=$BUILD/tools
	if command -v cmake >/dev/null &&
		timeout 120 cmake -S "$TOP" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
			-DSHARDFS_WITH_MPI=OFF >"$WORK/cmake.log" 2>&1; then
		targets=(shardctl shardfs-load-gpu gpu_baseline)
		grep -q "fuse3" "$BUILD/CMakeCache.txt" 2>/dev/null && targets+=(shardfs)
		timeout 300 cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" \
			>"$WORK/build.log" 2>&1 || {
			note "the build failed ($(grep -m1 -i error "$WORK/build.log" | cut -c1-160)); trying its targets one by one"
			for t in "${targets[@]}"; do
				timeout 200 cmake --build "$BUILD" -j "$(nproc)" --target "$t" >>"$WORK/build.log" 2>&1 ||
					note "$t did not build"
			done
		}
	else
		note "cmake could not configure shardfs here ($(tail -3 "$WORK/cmake.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)): no shardfs rows"
	fi
fi
SHARDCTL=$BIN/shardctl
SHARDFS=$BIN/shardfs
LOADER=${MOCK:-$BIN/shardfs-load-gpu}
BASE=$BIN/../test/bench/gpu_baseline
# without cmake's build (libfuse3 or zstd missing), or a stub build (cmake
# found no CUDA toolkit): the loader and the baseline by hand, from the few
# sources they need (jansson, xxhash, the CUDA runtime)
if [[ -z $MOCK && -x $LOADER ]] && "$LOADER" /dev/null 2>&1 | grep -q "built without CUDA"; then
	note "cmake built the CUDA stub (no toolkit found): building the loader by hand"
	LOADER=$WORK/none
fi
if [[ -z $MOCK && ! -x $LOADER ]]; then
	CUDA=${CUDA_HOME:-/usr/local/cuda}
	H=$WORK/hand
	mkdir -p "$H"
	if (cd "$TOP" && gcc -O2 -std=gnu11 -D_GNU_SOURCE -Icore -Igpu -I"$CUDA/include" \
		tools/load_gpu.c gpu/sf_gpu.c gpu/sf_gpu_direct.c core/sf_whereis.c \
		core/sf_st_header.c core/sf_error.c core/sf_array.c core/sf_checksum.c \
		core/sf_parse.c core/sf_dtype.c core/sf_io.c -L"$CUDA/lib64" -lcudart \
		-Wl,-rpath,"$CUDA/lib64" -ljansson -lxxhash -lpthread -o "$H/shardfs-load-gpu") >"$H/log" 2>&1; then
		LOADER=$H/shardfs-load-gpu
		note "shardfs-load-gpu built by hand (cmake's build did not make it)"
	else
		note "shardfs-load-gpu could not be built by hand either: $(grep -m1 -i error "$H/log" | cut -c1-160)"
	fi
	if [[ ! -x $BASE ]] && (cd "$TOP" && gcc -O2 -I"$CUDA/include" test/bench/gpu_baseline.c \
		-L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lcudart -o "$H/gpu_baseline") >>"$H/log" 2>&1; then
		BASE=$H/gpu_baseline
	fi
fi

# (4) the data: a checkpoint and the same tensors as one plain file
FILE=$WORK/model.safetensors
CKPT=0
if [[ -x $SHARDCTL ]]; then
	if "$SHARDCTL" gen --layout llama --ranks 4 --size "$SIZE" --block-size 4M \
		"$STORE/ck" >/dev/null 2>"$WORK/gen.log" &&
		"$SHARDCTL" export --safetensors "$FILE" "$STORE/ck" >/dev/null 2>>"$WORK/gen.log"; then
		CKPT=1
	else
		note "shardctl gen/export failed: $(tail -1 "$WORK/gen.log")"
	fi
fi
if [[ ! -s $FILE && -n $PY ]]; then
	note "no checkpoint: a plain safetensors file of random BF16 tensors written with Python instead"
	"$PY" - "$FILE" "$SIZE" <<'PY' || true
import json, os, struct, sys
size = sys.argv[2]
n = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]] if size[-1] in "KMG" else int(size)
per = 64 << 20
hdr, off, i = {}, 0, 0
while off < n:
    k = min(per, n - off) // 2 * 2
    hdr["w.%05d" % i] = {"dtype": "BF16", "shape": [k // 2], "data_offsets": [off, off + k]}
    off += k
    i += 1
j = json.dumps(hdr).encode()
j += b" " * ((8 - len(j) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(j)) + j)
    block = os.urandom(per)
    left = off
    while left:
        f.write(block[:min(per, left)])
        left -= min(per, left)
PY
fi
[[ -s $FILE ]] || { echo "$ME: no file to load (no shardctl, no python3)" >&2; exit 1; }
BYTES=$(stat -c %s "$FILE")
cat "$FILE" >/dev/null

# (5) the mount
MOUNT=0
start_daemon() {
	"$SHARDFS" "$STORE" "$MNT" 2>>"$WORK/daemon.log" &
	DPID=$!
	for _ in $(seq 300); do
		mounted "$MNT" && return 0
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.02
	done
	stop_daemon
	return 1
}
if [[ $CKPT == 1 && -x $SHARDFS && -e /dev/fuse ]] && command -v fusermount3 >/dev/null; then
	if start_daemon && [[ -s $MNT/ck/model.safetensors ]]; then
		MOUNT=1
		stop_daemon
	else
		note "the store did not mount ($(tail -1 "$WORK/daemon.log" 2>/dev/null)): no mount rows"
	fi
else
	why=""
	[[ $CKPT == 1 ]] || why="no checkpoint"
	[[ -x $SHARDFS ]] || why="${why:+$why, }no shardfs binary (libfuse3 missing?)"
	[[ -e /dev/fuse ]] || why="${why:+$why, }no /dev/fuse"
	command -v fusermount3 >/dev/null || why="${why:+$why, }no fusermount3"
	note "no mount ($why): the mount and direct rows are left out, a plain file is measured"
fi
COLD=0   # (a rehearsal leaves a shared machine's page cache alone)
[[ -z $MOCK && -w /proc/sys/vm/drop_caches ]] && echo 1 >/proc/sys/vm/drop_caches 2>/dev/null && COLD=1
[[ $COLD == 1 || -n $MOCK ]] || note "the page cache cannot be dropped here: warm rows only"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# (6) the rows: "what|cache|bytes|seconds"
ROWS=()
row() { ROWS+=("$1|$2|$3|$4"); }
H2D=""
if [[ -x $BASE ]]; then
	base=$("$BASE" "$FILE" 2>&1)
	H2D=$(awk '$1 == "pinned_h2d" {print $2 / $3}' <<<"$base")
	while read -r name b s; do
		case $name in
		pinned_h2d) row "pinned H2D cudaMemcpy (the bound)" - "$b" "$s" ;;
		read) row "file read, 64 MiB preads, one thread" warm "$b" "$s" ;;
		esac
	done <<<"$base"
else
	note "gpu_baseline not built: no pinned H2D row (ratios left out)"
fi

# one loader run: prints "BYTES SECONDS DIRECT MOUNT"; 1 on failure
loader_run() {
	local out
	out=$("$LOADER" "$@" 2>&1) || { echo "$ME: loader $*: $(tail -2 <<<"$out")" >&2; return 1; }
	awk '/^whole load:/ {b = $3; s = $6}
	     /^direct path:/ {d = $3; m = $7}
	     END {print b, s, d + 0, m + 0}' <<<"$out"
}
# best of N: "BYTES SECONDS DIRECT MOUNT" of the fastest run; each run
# on a fresh mount when MNTROW=1, after a drop when CACHE=cold
best_of() {
	local n=$1 best="" r
	shift
	for _ in $(seq "$n"); do
		(($(left) > 20)) || { note "time budget spent: a row cut short"; break; }
		[[ ${MNTROW:-0} == 1 ]] && { start_daemon || return 1; }
		[[ ${CACHE:-warm} == cold ]] && drop
		r=$(loader_run "$@") || { [[ ${MNTROW:-0} == 1 ]] && stop_daemon; return 1; }
		[[ ${MNTROW:-0} == 1 ]] && stop_daemon
		if [[ -z $best ]] || awk -v a="$r" -v b="$best" 'BEGIN {split(a, x, " "); split(b, y, " "); exit !(x[2] < y[2])}'; then
			best=$r
		fi
	done
	[[ -n $best ]] && echo "$best"
}
loader_row() { # LABEL CACHE N ARGS...
	local label=$1 cache=$2 n=$3 r
	shift 3
	r=$(CACHE=$cache best_of "$n" "$@") || { note "$label ($cache): failed"; return; }
	[[ -n $r ]] || return
	set -- $r
	if [[ $label == *"direct path"* ]]; then
		label="$label ($(awk -v d="$3" -v m="$4" 'BEGIN {printf "%.0f%% direct", 100 * d / (d + m > 0 ? d + m : 1)}'))"
	fi
	row "$label" "$cache" "$1" "$2"
}
if [[ -x $LOADER ]]; then
	out=$("$LOADER" --verify "$FILE" 2>&1 | grep '^verify:') ||
		note "loader --verify on the plain file: $out"
	loader_row "shardfs-load-gpu, plain file" warm 3 "$FILE"
	if [[ $MOUNT == 1 ]]; then
		MNTROW=1 loader_row "shardfs-load-gpu --no-direct, mount" warm 2 --no-direct "$MNT/ck/model.safetensors"
		MNTROW=1 loader_row "shardfs-load-gpu, mount, direct path" warm 2 "$MNT/ck/model.safetensors"
		start_daemon && {
			v=$("$LOADER" --verify "$MNT/ck/model.safetensors" 2>&1 | grep -E '^(verify|direct path):' | tr '\n' ' ')
			note "direct path, --verify: $v"
			stop_daemon
		}
	fi
	if [[ $COLD == 1 ]]; then
		loader_row "shardfs-load-gpu, plain file" cold 1 "$FILE"
		[[ $MOUNT == 1 ]] && MNTROW=1 loader_row "shardfs-load-gpu --no-direct, mount" cold 1 --no-direct "$MNT/ck/model.safetensors"
		[[ $MOUNT == 1 ]] && MNTROW=1 loader_row "shardfs-load-gpu, mount, direct path" cold 1 "$MNT/ck/model.safetensors"
	fi
else
	note "no shardfs-load-gpu: its rows are left out"
fi

# the Python loaders: one run, its seconds on stdout ("BYTES SECONDS")
py_load() { # KIND FILE
	timeout 300 "$PY" - "$1" "$2" <<'PY'
import os, sys, time
import torch
kind, path = sys.argv[1], sys.argv[2]
torch.cuda.init()
torch.zeros(1, device="cuda:0")
torch.cuda.synchronize()
t0 = time.perf_counter()
if kind == "safetensors":
    from safetensors.torch import load_file
    d = load_file(path, device="cuda:0")
    n = sum(t.numel() * t.element_size() for t in d.values())
else:
    import fastsafetensors as fs
    try:
        loader = fs.SafeTensorsFileLoader(fs.SingleGroup(), torch.device("cuda:0"), nogds=True)
    except TypeError:
        loader = fs.SafeTensorsFileLoader(device="cuda:0", nogds=True)
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    d = {k: fb.get_tensor(k) for k in list(fb.key_to_rank_lidx.keys())}
    n = sum(t.numel() * t.element_size() for t in d.values())
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(n, dt)
PY
}
py_row() { # KIND LABEL CACHE FILE MNTROW REPS
	local kind=$1 label=$2 cache=$3 f=$4 m=$5 reps=$6 best="" r
	for _ in $(seq "$reps"); do
		(($(left) > 40)) || { note "time budget spent: $label ($cache) cut short"; break; }
		[[ $m == 1 ]] && { start_daemon || return; }
		[[ $cache == cold ]] && drop
		r=$(py_load "$kind" "$f" 2>"$WORK/py.log" | tail -1)
		[[ $m == 1 ]] && stop_daemon
		[[ $r =~ ^[0-9]+\ [0-9.e-]+$ ]] || { note "$label: failed: $(tail -1 "$WORK/py.log")"; return; }
		if [[ -z $best ]] || awk -v a="$r" -v b="$best" 'BEGIN {split(a, x, " "); split(b, y, " "); exit !(x[2] < y[2])}'; then
			best=$r
		fi
	done
	[[ -n $best ]] && row "$label" "$cache" ${best% *} ${best#* }
}
if [[ $TORCH == 1 ]]; then
	for kind in safetensors fastsafetensors; do
		"$PY" -c "import $kind" 2>/dev/null || continue
		lab="safetensors.torch.load_file(device=cuda:0)"
		[[ $kind == fastsafetensors ]] && lab="fastsafetensors SafeTensorsFileLoader (nogds)"
		py_row "$kind" "$lab, plain file" warm "$FILE" 0 2
		[[ $MOUNT == 1 ]] && py_row "$kind" "$lab, mount" warm "$MNT/ck/model.safetensors" 1 1
		[[ $COLD == 1 ]] && py_row "$kind" "$lab, plain file" cold "$FILE" 0 1
	done
fi

# the table
echo "# $ME $SIZE: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$TOP" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# ${DEV}; $(nproc) cores, $(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), Linux $(uname -r)"
echo "# $BYTES bytes in model.safetensors; mount: $([[ $MOUNT == 1 ]] && echo yes || echo no); cold rows: $([[ $COLD == 1 ]] && echo yes || echo no)"
[[ -n $MOCK ]] && echo "# MOCK REHEARSAL: no device; the numbers measure nothing"
echo
echo "| what | cache | bytes | seconds | GB/s | ratio to pinned H2D |"
echo "|---|---|---:|---:|---:|---:|"
for r in "${ROWS[@]}"; do
	IFS='|' read -r what cache b s <<<"$r"
	awk -v w="$what" -v c="$cache" -v b="$b" -v s="$s" -v h="${H2D:-0}" 'BEGIN {
		rate = (s > 0) ? b / s : 0
		ratio = (h > 0) ? sprintf("%.2f", rate / h) : "-"
		printf("| %s | %s | %d | %.3f | %.2f | %s |\n", w, c, b, s, rate / 1e9, ratio) }'
done
echo
for n in "${NOTES[@]}"; do echo "- $n"; done
echo "(run took $(($(date +%s) - T_START)) s)"
