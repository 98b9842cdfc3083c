# bash completion for shardctl(1)                        -*- shell-script -*-
#
# Subcommands, each one's options (as `shardctl COMMAND --help` lists
# them; test/unit/test_completion.sh checks they agree), the values of
# --layout and --dtype, files for --safetensors, and directories for
# every other argument (checkpoints, stores, mounts). Installed as
# share/bash-completion/completions/shardctl; or source this file.

_shardctl_dirs()
{
	compopt -o filenames 2>/dev/null
	COMPREPLY=($(compgen -d -- "$1"))
}

_shardctl()
{
	local cur prev cmd opts
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()

	if [[ $COMP_CWORD -eq 1 ]]; then
		COMPREPLY=($(compgen -W "gen info diff copy verify index export commit rm
			--help --version" -- "$cur"))
		return
	fi
	cmd=${COMP_WORDS[1]}
	case $cmd in
	gen)
		opts="--layout --ranks --size --tensors --dtype --seed --block-size
			--ref --no-blobs --sparse --force --help" ;;
	info) opts="--json --ranks --help" ;;
	diff) opts="--stat --tensors --content --help" ;;
	index) opts="--block-size --progress --help" ;;
	export) opts="--safetensors --help" ;;
	copy) opts="--force --help" ;;
	verify | commit | rm) opts="--help" ;;
	*) return ;;
	esac

	case $prev in
	--layout)
		COMPREPLY=($(compgen -W "mixed llama fsdp replicated many" -- "$cur"))
		return ;;
	--dtype)
		COMPREPLY=($(compgen -W "F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16
			I8 U64 U32 U16 U8 BOOL" -- "$cur"))
		return ;;
	--safetensors)
		compopt -o filenames 2>/dev/null
		COMPREPLY=($(compgen -f -- "$cur"))
		return ;;
	--ref)
		_shardctl_dirs "$cur"
		return ;;
	--ranks | --size | --seed | --block-size | --tensors)
		# a value (gen's --ranks; info's --ranks takes none)
		[[ $cmd == gen || $prev != --ranks ]] && return ;;
	esac

	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$opts" -- "$cur"))
		return
	fi
	_shardctl_dirs "$cur"
}

complete -F _shardctl shardctl
