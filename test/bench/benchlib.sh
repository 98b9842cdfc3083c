# benchlib.sh - what the single-daemon benchmark scripts share: stopping the
# daemon and unmounting, cleanup of the work directory on every exit.
# Sourced (not run). Expects: ME (script name for messages), MNT, WORK,
# KEEP (1: keep WORK), DPID (pid of the running daemon, or empty).
# Installs the EXIT/INT/TERM traps.

mounted() { grep -q " $MNT fuse" /proc/mounts; }

# Unmount, wait (bounded) for the daemon to exit, kill it if it does not.
stop_daemon() {
	if mounted; then
		fusermount3 -u "$MNT" 2>/dev/null || true
	fi
	if [[ -n $DPID ]]; then
		for _ in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$DPID" 2>/dev/null; then
			echo "$ME: daemon $DPID did not exit after unmount; killing" >&2
			kill -TERM "$DPID" 2>/dev/null || true; sleep 1
			kill -KILL "$DPID" 2>/dev/null || true
		fi
		wait "$DPID" 2>/dev/null || true
		DPID=""
	fi
	if mounted; then umount -l "$MNT" || true; fi
}

cleanup() {
	stop_daemon
	if [[ $KEEP == 1 ]]; then
		echo "kept: $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
