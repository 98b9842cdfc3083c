#!/usr/bin/env bash
# tools/test.sh - the test command: install what is missing, build, run
# every test ring. Run from anywhere as root on Debian 12.
#
#  1. main build (MPI and the CUDA toolkit when present): every ctest ring
#     (unit, corpus, fuzz replay, mount, mpi, e2e, gpu; GPU tests skip
#     with a reason when no device is present)
#  2. AddressSanitizer + UBSan build: unit, corpus, fuzz replay, mount
#  3. stub build (no MPI, no CUDA): builds, and the stub tests and the
#     MPI wire-format test (it needs no MPI) pass
#
# Environment: JOBS (parallel build jobs, default nproc), SKIP_SANITIZE=1,
# SKIP_STUB=1 to leave out stages 2 and 3 during development.
# tools/test.sh --interop runs tools/interop.sh after the rest: the
# frameworks' fixtures written again with current releases from PyPI and
# mounted (several GB of downloads; not in CI).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-$(nproc)}
interop=0
for a in "$@"; do
	case $a in
	--interop) interop=1 ;;
	*) echo "tools/test.sh: unknown argument $a (only --interop)" >&2; exit 2 ;;
	esac
done
"$top/tools/deps.sh"
# libfuse needs the fuse module; the mount ring skips (and says so) without it
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PATH="$PATH:/usr/local/cuda/bin"

stage() { printf '\n==== %s ====\n' "$*"; }
status=0

stage "build (main)"
cmake -S "$top" -B "$top/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$top/build" -j "$jobs"
stage "test (main)"
(cd "$top/build" && ctest --output-on-failure -j 2 --timeout 600) || status=1

if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
	stage "build (ASan + UBSan)"
	cmake -S "$top" -B "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug \
		-DSHARDFS_SANITIZE=ON -DSHARDFS_WITH_MPI=OFF -DSHARDFS_WITH_CUDA=OFF
	cmake --build "$top/build-asan" -j "$jobs"
	stage "test (ASan + UBSan)"
	(cd "$top/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j 2 --timeout 600 -L 'unit|corpus|fuzz|mount') || status=1
fi

if [ "${SKIP_STUB:-0}" != 1 ]; then
	stage "build (stubs: no MPI, no CUDA)"
	cmake -S "$top" -B "$top/build-stub" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DSHARDFS_WITH_MPI=OFF -DSHARDFS_WITH_CUDA=OFF
	cmake --build "$top/build-stub" -j "$jobs"
	stage "test (stubs)"
	(cd "$top/build-stub" && ctest --output-on-failure -j 2 -R 'stub|mpi_wire') || status=1
fi

if [ "$interop" = 1 ]; then
	stage "interop (tools/interop.sh)"
	BUILD="$top/build" "$top/tools/interop.sh" || status=1
fi

stage "result"
if [ $status -eq 0 ]; then echo "tools/test.sh: all stages passed"; else echo "tools/test.sh: FAILED"; fi
exit $status
