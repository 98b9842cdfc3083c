#!/usr/bin/env bash
# tools/crash_trials.sh - kill -9 trials, outside CI: build (like
# tools/soak.sh) and run test/mount/crash_trials.py for TRIALS trials
# (default 100): writers through one mount, a SIGKILL of the daemon (or of
# a writer) at a random moment, restart, every committed checkpoint checked
# byte for byte and with `shardctl verify`, every unfinished one resumed or
# discarded. Prints a table; exit 1 on any failed check. Further arguments
# go to crash_trials.py (--seed N replays a run's random choices, not its
# timing; --keep-committed N; --keep keeps its temp dir).
#
#   tools/crash_trials.sh [TRIALS] [crash_trials.py options]
#
# On a shared machine run it under the idle scheduler:
#   chrt --idle 0 nice -n 19 tools/crash_trials.sh 100
# Environment: BUILD (build dir, default build-soak), JOBS (default nproc).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
trials=100
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
	trials=$1
	shift
fi
"$top/tools/deps.sh" --minimal
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
build=${BUILD:-$top/build-soak}
cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target shardfs shardctl
exec /usr/bin/python3 "$top/test/mount/crash_trials.py" --bin "$build/tools" \
	--trials "$trials" "$@"
