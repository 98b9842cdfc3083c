#!/usr/bin/env bash
# tools/fuzz.sh - long fuzzing, outside CI: build every libFuzzer target of
# test/fuzz/ with clang and run each for a while from its committed corpus.
#
#   tools/fuzz.sh [--time SECONDS] [--runs N] [--jobs N] [TARGET...]
#     TARGET     manifest, slice, st_header, journal, mpi_wire, torchsave,
#                pickle, zip, index, hf_meta, hub, megatron, paddle, dcp
#                (default: all 14)
#     --time S   at most S seconds per target (default 300, or no limit
#                when --runs is given)
#     --runs N   stop each target after N executions (libFuzzer -runs; with
#                --jobs J each job runs N/J); with --time too, whichever
#                comes first. On a shared machine, count executions: run it
#                as `chrt --idle 0 nice -n 19 tools/fuzz.sh --runs 10000000`
#     --jobs N   parallel fuzzing jobs per target (default 1)
# SIGINT or SIGTERM stops the target running (libFuzzer prints its final
# stats), skips the rest and prints the table so far, the stopped target
# marked "(stopped)".
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
all=(manifest slice st_header journal mpi_wire torchsave pickle zip index hf_meta hub megatron paddle dcp)
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
stop=0
fpids=()   # the running fuzzer, then (once stopped) its descendants
descendants() {
	local p
	for p in $(pgrep -P "$1"); do
		echo "$p"
		descendants "$p"
	done
}
# Stop the running fuzzer and, with --jobs, its jobs (under a shell each);
# the loop then waits for all of them, records the row and ends.
trap 'stop=1; fpids+=($(descendants "${fpids[0]:-0}")); kill -TERM "${fpids[@]}" 2>/dev/null' INT TERM
for t in "${targets[@]}"; do
	((stop == 0)) || break
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
	par=()          # one job runs in this process, its stats in log
	((jobs == 1)) || par=(-jobs="$jobs" -workers="$jobs")
	t0=$SECONDS
	(cd "$work/$t" && exec "$top/build-fuzz/test/fuzz/fuzz_$t" "${dict[@]}" \
		-max_len=$maxlen -timeout=10 -rss_limit_mb=2048 "${limit[@]}" \
		-max_total_time="$secs" "${par[@]}" \
		-print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
		"$corpus" "${extra[@]}" >"$work/$t/log" 2>&1) &
	fpids=($!)
	# a trapped signal ends wait early: wait until the fuzzer is gone
	while kill -0 "${fpids[0]}" 2>/dev/null; do wait "${fpids[0]}" || true; done
	for p in "${fpids[@]:1}"; do    # stopped jobs still writing their stats
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	done
	fpids=()
	# -jobs runs each job in a child writing fuzz-N.log (the parent copies
	# it into its own log at the job's end, but not when stopped): count
	# the jobs' logs then, else this process's log
	logs=("$work/$t/log")
	((jobs == 1)) || logs=("$work/$t"/fuzz-*.log)
	execs=$(cat "${logs[@]}" 2>/dev/null |
		awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}')
	after=$(ls "$corpus" | wc -l)
	took=$((SECONDS - t0))
	crashes=$(ls "$work/$t/artifacts" | wc -l)
	((crashes == 0)) || bad=1
	mark=
	if ((stop)); then mark=" (stopped)"; fi
	rows+=("| fuzz_$t$mark | $execs | $took | $((execs / (took > 0 ? took : 1))) | $before -> $after | $crashes |")
	echo "fuzz.sh: $(date -u +%FT%TZ) ${rows[-1]}" >&2
	# The scratch directories of fuzz_journal, fuzz_megatron and
	# fuzz_paddle: a fuzzer stopped by a crash, a signal or -jobs' time
	# limit cannot remove its own. Only this target's, as soon as it
	# ends: another fuzz.sh running other targets keeps its own.
	case $t in
	journal) scratch=fuzz_journal-* ;;
	megatron) scratch=fuzz-megatron-* ;;
	paddle) scratch=fuzz_paddle.* ;;
	*) scratch= ;;
	esac
	if [[ -n $scratch ]]; then
		for d in /dev/shm "${TMPDIR:-/tmp}"; do
			rm -rf "$d"/$scratch
		done
	fi
done

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
