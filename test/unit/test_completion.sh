#!/bin/bash
# test_completion.sh BIN_DIR COMPLETION_DIR - the bash completions of
# shardctl and shardfs (tools/completion/*.bash), sourced into this shell
# and called as bash would call them (COMP_WORDS and COMP_CWORD set by
# hand): subcommands, options, option values, directories; and every
# option the programs' --help lists is offered (so the completions follow
# the programs). Exit 0 when every check passes, 1 otherwise.
set -u
bin=$1
comp=$2
fails=0
checks=0

# shellcheck source=/dev/null
source "$comp/shardctl.bash" || { echo "FAIL: cannot source shardctl.bash"; exit 1; }
# shellcheck source=/dev/null
source "$comp/shardfs.bash" || { echo "FAIL: cannot source shardfs.bash"; exit 1; }

# complete FUNC WORD...: COMPREPLY for the last word, one per line, sorted
complete_words()
{
	local fn=$1
	shift
	COMP_WORDS=("$@")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMPREPLY=()
	"$fn"
	printf '%s\n' "${COMPREPLY[@]}" | sort
}

# expect DESCRIPTION WANT GOT: WANT and GOT are newline-separated lists
expect()
{
	checks=$((checks + 1))
	if [ "$2" != "$3" ]; then
		echo "FAIL: $1: got [$(echo "$3" | tr '\n' ' ')], want [$(echo "$2" | tr '\n' ' ')]"
		fails=$((fails + 1))
	fi
}

# contains DESCRIPTION ITEM GOT
contains()
{
	checks=$((checks + 1))
	if ! grep -qxF -- "$2" <<<"$3"; then
		echo "FAIL: $1: '$2' not offered (got [$(echo "$3" | tr '\n' ' ')])"
		fails=$((fails + 1))
	fi
}

lines() { printf '%s\n' "$@" | sort; }

# options a --help text names
help_options() { grep -oP -- '(?<![\w-])(--[a-zA-Z][\w-]*|-[a-zA-Z](?![\w-]))' | sort -u; }

tmp=$(mktemp -d /tmp/sfcomp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ckpt-a" "$tmp/ckpt-b" "$tmp/other"
touch "$tmp/ckpt-file"

# shardctl
expect "subcommands" "$(lines gen info diff copy verify index export commit rm)" \
	"$(complete_words _shardctl shardctl "" | grep -v '^-')"
expect "subcommand prefix" "$(lines diff)" "$(complete_words _shardctl shardctl di)"
expect "diff options" "$(lines --stat)" "$(complete_words _shardctl shardctl diff --st)"
expect "gen --layout" "$(lines mixed llama fsdp replicated many)" \
	"$(complete_words _shardctl shardctl gen --layout "")"
expect "gen --dtype prefix" "$(lines F16 F32 F64 F8_E4M3 F8_E5M2)" \
	"$(complete_words _shardctl shardctl gen --dtype F)"
expect "gen --ranks takes a number" "" "$(complete_words _shardctl shardctl gen --ranks "")"
expect "info: directories only" "$(lines "$tmp/ckpt-a" "$tmp/ckpt-b")" \
	"$(complete_words _shardctl shardctl info "$tmp/ck")"
expect "info --ranks then a directory" "$(lines "$tmp/ckpt-a" "$tmp/ckpt-b")" \
	"$(complete_words _shardctl shardctl info --ranks "$tmp/ck")"
expect "diff B: directories" "$(lines "$tmp/ckpt-a" "$tmp/ckpt-b")" \
	"$(complete_words _shardctl shardctl diff "$tmp/other" "$tmp/ck")"
expect "export --safetensors: files too" "$(lines "$tmp/ckpt-a" "$tmp/ckpt-b" "$tmp/ckpt-file")" \
	"$(complete_words _shardctl shardctl export --safetensors "$tmp/ck")"
contains "top-level --version" --version "$(complete_words _shardctl shardctl --)"

# every option of every subcommand's --help is offered
for cmd in $(complete_words _shardctl shardctl "" | grep -v '^-'); do
	offered=$(complete_words _shardctl shardctl "$cmd" -)$'\n'$(complete_words _shardctl shardctl "$cmd" --)
	for opt in $("$bin/shardctl" "$cmd" --help | help_options); do
		[ "$opt" = -h ] && continue   # --help is offered; -h is its alias
		contains "shardctl $cmd: option from --help" "$opt" "$offered"
	done
done
for cmd in $("$bin/shardctl" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p'); do
	contains "shardctl --help command" "$cmd" "$(complete_words _shardctl shardctl "")"
done

# shardfs
expect "shardfs --log-level" "$(lines debug error info warn)" \
	"$(complete_words _shardfs shardfs --log-level "")"
expect "shardfs -o list" "$(lines ro,allow_other ro,allow_root)" \
	"$(complete_words _shardfs shardfs -o ro,allow_)"
expect "shardfs --log" "$(lines --log-file --log-level)" "$(complete_words _shardfs shardfs --log)"
expect "shardfs STORE" "$(lines "$tmp/ckpt-a" "$tmp/ckpt-b")" \
	"$(complete_words _shardfs shardfs -f "$tmp/ck")"
offered=$(complete_words _shardfs shardfs -)
for opt in $("$bin/shardfs" --help | help_options); do
	contains "shardfs: option from --help" "$opt" "$offered"
done

if [ $fails -ne 0 ]; then
	echo "$fails of $checks checks FAILED"
	exit 1
fi
echo "all $checks checks passed"
