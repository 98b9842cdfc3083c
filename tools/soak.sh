#!/usr/bin/env bash
# tools/soak.sh - the long soak, outside CI: build (like tools/test.sh's
# main build) and run test/mount/test_soak.py for SECONDS (default 600):
# concurrent readers, writers, deletes and listings against one mount, with
# a kill -9 and restart of the daemon about every 75 s. Any further
# arguments go to test_soak.py (--seed N replays a run's random choices,
# --keep keeps its temp dir, --cache-mb N, --rss-cap-mb N, --crashes N,
# --readers N and --writers N: client threads, default 3 and 2, plus one
# deleter and one lister; --sample-s S: how often the daemon's RSS and
# descriptors are sampled, default 10).
#
#   tools/soak.sh [SECONDS] [test_soak.py options]
#
# The README's figure: 16 clients, one daemon for the whole run, on a
# shared machine under the idle scheduler:
#   chrt --idle 0 nice -n 19 tools/soak.sh 600 --readers 8 --writers 8 --crashes 0
#
# Environment: BUILD (build dir, default build-soak), JOBS (default nproc),
# SANITIZE=1 builds with AddressSanitizer + UBSan (default dir build-soak-asan).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
secs=600
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
	secs=$1
	shift
fi
jobs=${JOBS:-$(nproc)}
"$top/tools/deps.sh" --minimal
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
if [ "${SANITIZE:-0}" = 1 ]; then
	build=${BUILD:-$top/build-soak-asan}
	cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DSHARDFS_SANITIZE=ON \
		-DSHARDFS_WITH_MPI=OFF -DSHARDFS_WITH_CUDA=OFF >/dev/null
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
	export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
	build=${BUILD:-$top/build-soak}
	cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$jobs" --target shardfs shardctl
exec /usr/bin/python3 "$top/test/mount/test_soak.py" --bin "$build/tools" \
	--duration "$secs" "$@"
