#!/usr/bin/env bash
# tools/fuzz.sh - long fuzzing, outside CI: build every libFuzzer target of
# test/fuzz/ with clang and run each for a while from its committed corpus.
#
#   tools/fuzz.sh [--time SECONDS] [--runs N] [--jobs N] [TARGET...]
#     TARGET     manifest, slice, st_header, journal, mpi_wire, torchsave,
#                pickle, zip, index, hf_meta, megatron, paddle, dcp
#                (default: all 13)
#     --time S   at most S seconds per target (default 300, or no limit
#                when --runs is given)
#     --runs N   stop each target after N executions (libFuzzer -runs; with
#                --jobs J each job runs N/J); with --time too, whichever
#                comes first. On a shared machine, count executions: run it
#                as `chrt --idle 0 nice -n 19 tools/fuzz.sh --runs 10000000`
#     --jobs N   parallel fuzzing jobs per target (default 1)
#
# Installs what is missing (tools/deps.sh: clang among the test packages),
# builds into build-fuzz/, and fuzzes a scratch copy of each corpus, so the
# committed corpus/ is never changed. Prints a table (target, executions,
# corpus growth, crashes); each row also goes to stderr as soon as its
# target ends, so a log of a long run shows progress. Every crash, leak or timeout input is kept under
# the work directory it names; exit status 1 if there was any. Not part of
# tools/test.sh: ctest only replays the corpora (fuzz_*_replay).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
secs=
runs=0
jobs=1
targets=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--time) secs=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
	-*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
	*) targets+=("$1"); shift ;;
	esac
done
[[ $runs =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --runs wants a count" >&2; exit 2; }
if [[ -z $secs ]]; then
	if ((runs > 0)); then secs=0; else secs=300; fi
elif ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
	echo "fuzz.sh: --time wants seconds" >&2; exit 2
fi
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
	limit=()
	((runs == 0)) || limit=("-runs=$(((runs + jobs - 1) / jobs))")
	echo "fuzz.sh: $(date -u +%FT%TZ) fuzz_$t: $(((runs)) && echo "$runs runs, ")${secs} s limit (0: none), $jobs job(s)" >&2
	t0=$SECONDS
	(cd "$work/$t" && "$top/build-fuzz/test/fuzz/fuzz_$t" "${dict[@]}" \
		-max_len=$maxlen -timeout=10 -rss_limit_mb=2048 "${limit[@]}" \
		-max_total_time="$secs" -jobs="$jobs" -workers="$jobs" \
		-print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
		"$corpus" "${extra[@]}" >"$work/$t/log" 2>&1) || true
	# -jobs runs each job in a child writing fuzz-N.log, and the parent
	# copies every job's log into its own at the job's end: count that one
	# only (counting both counted every execution twice)
	execs=$(cat "$work/$t/log" 2>/dev/null |
		awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}')
	after=$(ls "$corpus" | wc -l)
	took=$((SECONDS - t0))
	crashes=$(ls "$work/$t/artifacts" | wc -l)
	((crashes == 0)) || bad=1
	rows+=("| fuzz_$t | $execs | $took | $((execs / (took > 0 ? took : 1))) | $before -> $after | $crashes |")
	echo "fuzz.sh: $(date -u +%FT%TZ) ${rows[-1]}" >&2
done
# fuzz_journal's scratch checkpoints: a worker stopped by a crash or by
# -jobs' time limit cannot remove its own.
rm -rf /dev/shm/fuzz_journal-* "${TMPDIR:-/tmp}"/fuzz_journal-*

echo
echo "shardfs fuzzing, $(date -u +%F): $(((runs)) && echo "up to $runs executions and ")$( ((secs)) && echo "$secs s" || echo "no time limit") per target, $jobs job(s), $(nproc) cores, $(clang --version | head -1)"
echo
echo "| target | executions | seconds | exec/s | corpus files | crashes |"
echo "|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
if ((bad)); then
	echo
	echo "crash inputs: $work/*/artifacts/ (logs: $work/*/log); fix, then add each to test/fuzz/corpus/TARGET/ as crash-WHAT.*"
	exit 1
fi
rm -rf "$work"
