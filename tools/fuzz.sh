#!/usr/bin/env bash
# tools/fuzz.sh - long fuzzing, outside CI: build every libFuzzer target of
# test/fuzz/ with clang and run each for a while from its committed corpus.
#
#   tools/fuzz.sh [--time SECONDS] [--jobs N] [TARGET...]
#     TARGET     manifest, slice, st_header, journal, mpi_wire, torchsave, pickle, zip (default: all)
#     --time S   seconds per target (default 300)
#     --jobs N   parallel fuzzing jobs per target (default 1)
#
# Installs what is missing (tools/deps.sh: clang among the test packages),
# builds into build-fuzz/, and fuzzes a scratch copy of each corpus, so the
# committed corpus/ is never changed. Prints a table (target, executions,
# corpus growth, crashes). Every crash, leak or timeout input is kept under
# the work directory it names; exit status 1 if there was any. Not part of
# tools/test.sh: ctest only replays the corpora (fuzz_*_replay).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
secs=300
jobs=1
targets=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--time) secs=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
	-*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
	*) targets+=("$1"); shift ;;
	esac
done
[[ $secs =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --time wants seconds" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]?$ ]] || { echo "fuzz.sh: --jobs wants 1..99" >&2; exit 2; }
all=(manifest slice st_header journal mpi_wire torchsave pickle zip index hf_meta megatron paddle dcp)
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
for t in "${targets[@]}"; do
	[[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target $t (${all[*]})" >&2; exit 2; }
done

bash "$top/tools/deps.sh"
CC=clang cmake -S "$top" -B "$top/build-fuzz" -DSHARDFS_FUZZ=ON \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$top/build-fuzz" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

work=$(mktemp -d /tmp/shardfs-fuzz-XXXXXX)
echo "fuzz.sh: work directory $work" >&2
bad=0
rows=()
for t in "${targets[@]}"; do
	corpus=$work/$t/corpus
	mkdir -p "$corpus" "$work/$t/artifacts"
	cp "$top/test/fuzz/corpus/$t/"* "$corpus/"
	extra=()
	maxlen=4096
	if [[ $t == manifest ]]; then
		cp "$top/test/corpus/manifests/valid/"*.json "$corpus/"
		extra=("$top/test/corpus/manifests/invalid")
		maxlen=8192
	fi
	[[ $t == dcp ]] && maxlen=16384 # the fsdp2 seed's metadata is 12 KB
	dict=()
	[[ -f $top/test/fuzz/$t.dict ]] && dict=("-dict=$top/test/fuzz/$t.dict")
	before=$(ls "$corpus" | wc -l)
	echo "fuzz.sh: fuzz_$t for $secs s ($jobs job(s))" >&2
	(cd "$work/$t" && "$top/build-fuzz/test/fuzz/fuzz_$t" "${dict[@]}" \
		-max_len=$maxlen -timeout=10 -rss_limit_mb=2048 \
		-max_total_time="$secs" -jobs="$jobs" -workers="$jobs" \
		-print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
		"$corpus" "${extra[@]}" >"$work/$t/log" 2>&1) || true
	# libFuzzer writes fuzz-N.log per job when -jobs > 1
	execs=$(cat "$work/$t/log" "$work/$t"/fuzz-*.log 2>/dev/null |
		awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}')
	after=$(ls "$corpus" | wc -l)
	crashes=$(ls "$work/$t/artifacts" | wc -l)
	((crashes == 0)) || bad=1
	rows+=("| fuzz_$t | $execs | $before -> $after | $crashes |")
done
# fuzz_journal's scratch checkpoints: a worker stopped by a crash or by
# -jobs' time limit cannot remove its own.
rm -rf /dev/shm/fuzz_journal-* "${TMPDIR:-/tmp}"/fuzz_journal-*

echo
echo "shardfs fuzzing: $secs s per target, $jobs job(s), $(nproc) cores"
echo
echo "| target | executions | corpus files | crashes |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
if ((bad)); then
	echo
	echo "crash inputs: $work/*/artifacts/ (logs: $work/*/log); fix, then add each to test/fuzz/corpus/TARGET/ as crash-WHAT.*"
	exit 1
fi
rm -rf "$work"
