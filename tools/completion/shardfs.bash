# bash completion for shardfs(1)                         -*- shell-script -*-
#
# Options (as `shardfs --help` lists them; test/unit/test_completion.sh
# checks they agree), --log-level's levels, the usual FUSE mount options
# after -o (comma-separated: each completes on its own), and directories
# for STORE and MOUNTPOINT. Installed as
# share/bash-completion/completions/shardfs; or source this file.

_shardfs()
{
	local cur prev head
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()

	case $prev in
	--log-level)
		COMPREPLY=($(compgen -W "error warn info debug" -- "$cur"))
		return ;;
	--transport)
		COMPREPLY=($(compgen -W "auto dev uring" -- "$cur"))
		return ;;
	-o)
		# complete the last of a comma-separated list
		head=
		[[ $cur == *,* ]] && head=${cur%,*},
		COMPREPLY=($(compgen -P "$head" -W "ro rw allow_other allow_root
			default_permissions auto_unmount max_read= fsname= subtype=
			cache_mb= no_verify log_level= log_file= nonempty open_wait=
			transport= no_default_permissions" \
			-- "${cur##*,}"))
		compopt -o nospace 2>/dev/null
		return ;;
	--cache-mb | --commit-timeout | --peer-timeout | --open-wait)
		return ;;
	--log-file)
		compopt -o filenames 2>/dev/null
		COMPREPLY=($(compgen -f -- "$cur"))
		return ;;
	esac
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "-f -d -s -o --no-verify --cache-mb --direct-io --log-level
			--log-file --nonempty --open-wait --transport --no-default-permissions --mpi --commit-timeout --peer-timeout
			-h --help -V --version" -- "$cur"))
		return
	fi
	compopt -o filenames 2>/dev/null
	COMPREPLY=($(compgen -d -- "$cur"))
}

complete -F _shardfs shardfs
