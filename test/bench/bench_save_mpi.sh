# bench_save_mpi.sh - bench_save.sh --mpi (issue 26, Speed): torch 1.13's
# save_state_dict from 2 gloo ranks, rank r through the mount of MPI
# daemon r (node-local stores), against the same save straight to the
# disks; the time until both daemons show it verified; load_state_dict
# through daemon 0 of files that lie in store 1 only, against store 1.
# Sourced (not run) by bench_save.sh after its options, tool checks and
# its save() and min(); the rows and their meaning are in bench_save.sh's
# header. Every row of the table is from this one run, best of REPS.

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1

WORK=$(mktemp -d /tmp/sf-bench-save-mpi.XXXXXX)
MNTS=("$WORK/mnt0" "$WORK/mnt1")
MPID=""
cleanup() {
	stop_mounts "$MPID" 30 "${MNTS[@]}"
	MPID=""
	bench_remove_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$WORK"/store0 "$WORK"/store1 "$WORK"/mnt0 "$WORK"/mnt1 "$WORK"/direct0 "$WORK"/direct1

# Room: one checkpoint (or dd pair) of MIB MiB lies on the disk at a time
# (each is removed before the next); twice that, 10% and 512 MiB to spare.
avail=$(df -m --output=avail "$WORK" | tail -1 | tr -d ' ')
need=$((MIB * 2 + MIB / 5 + 512))
[[ $avail -ge $need ]] || { echo "$ME: $WORK has $avail MiB free; $MIB MiB needs $need" >&2; exit 1; }

COLD=0
[[ -w /proc/sys/vm/drop_caches ]] && COLD=1
drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
	-np 2 "$SHARDFS" --mpi "$WORK/store%r" "$WORK/mnt%r" >"$WORK/mpirun.log" 2>&1 &
MPID=$!
for m in "${MNTS[@]}"; do
	wait_mounted "$m" "$MPID" 60 "$WORK/mpirun.log" || exit 1
done
DPIDS=()   # the daemons, rank 0 first
for p in $(pgrep -P "$MPID"); do
	r=$(tr '\0' '\n' <"/proc/$p/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
	[[ -n $r ]] && DPIDS[r]=$p
done
[[ ${#DPIDS[@]} -eq 2 ]] || { echo "$ME: did not find both daemons under mpirun $MPID" >&2; exit 1; }

cpu_ticks() { # utime + stime of both daemons, in clock ticks: "T0 T1"
	local p f out=()
	for p in "${DPIDS[@]}"; do
		read -r -a f < <(sed 's/^.*) //' "/proc/$p/stat")
		out+=($((f[11] + f[12])))
	done
	echo "${out[*]}"
}

# dd_pair DIR0 DIR1 [CONV]: a dd bs=1M (conv=CONV: fsync, or "" for
# none) of MIB/2 MiB into each at once; prints the seconds until both
# returned. Without fsync it times the write path alone (into the page
# cache), which the disk does not limit.
dd_pair() {
	local t0 t1 p0 p1 n=$(((MIB + 1) / 2)) conv=()
	[[ -z ${3-fsync} ]] || conv=("conv=${3-fsync}")
	t0=$(now)
	dd if=/dev/zero of="$1/dd.bin" bs=1M count=$n "${conv[@]}" status=none &
	p0=$!
	dd if=/dev/zero of="$2/dd.bin" bs=1M count=$n "${conv[@]}" status=none &
	p1=$!
	wait "$p0" || { echo "$ME: dd into $1 failed" >&2; return 1; }
	wait "$p1" || { echo "$ME: dd into $2 failed" >&2; return 1; }
	t1=$(now)
	echo "$t1 - $t0" | bc
}

# shown_at TEND PATH...: poll every PATH (10 ms) until it is committed and
# verified = yes; prints, per PATH, the seconds from TEND (a wall clock)
# until it was first seen so (at most 120 s).
shown_at() {
	$PY - "$@" <<'EOF'
import os, sys, time
tend, paths = float(sys.argv[1]), sys.argv[2:]
seen = {}
def done(p):
    try:
        return (os.getxattr(p, "user.shardfs.state") == b"committed" and
                os.getxattr(p, "user.shardfs.verified") == b"yes")
    except OSError:
        return False
while len(seen) < len(paths):
    for p in paths:
        if p not in seen and done(p):
            seen[p] = time.time() - tend
    if time.time() - tend > 120:
        sys.exit("not shown within 120 s: %s" % [p for p in paths if p not in seen])
    time.sleep(0.01)
print(" ".join("%.3f" % seen[p] for p in paths))
EOF
}

# gone PATH...: wait (at most 20 s) until none of them exists.
gone() {
	local p i
	for p in "$@"; do
		for i in $(seq 200); do [[ -e $p ]] || break; sleep 0.1; done
		[[ ! -e $p ]] || { echo "$ME: $p still there 20 s after rm -rf through the mount" >&2; return 1; }
	done
}

# ---- saves: rank r beside store r, and through daemon r's mount ----
ss="" sm="" ds="" dm="" dsn="" dmn="" shs=() sh0=() sh1=() cpu=""
direct_side() { # the save and the dd pairs straight to the disk
	local s
	sync
	read -r s _ < <(save "$WORK/direct%r/s"); ss=$(min "$s" "$ss")
	rm -rf "$WORK"/direct0/s "$WORK"/direct1/s
	sync
	s=$(dd_pair "$WORK/direct0" "$WORK/direct1"); ds=$(min "$s" "$ds")
	rm -f "$WORK"/direct0/dd.bin "$WORK"/direct1/dd.bin
	sync
	s=$(dd_pair "$WORK/direct0" "$WORK/direct1" ""); dsn=$(min "$s" "$dsn")
	rm -f "$WORK"/direct0/dd.bin "$WORK"/direct1/dd.bin
}
mount_side() { # I: the save s$I and the dd pairs through the mounts
	local i=$1 s tend c0 c1 a0 a1 t0 t1 r conv d
	sync
	read -r c0 c1 < <(cpu_ticks)
	read -r s tend < <(save "$WORK/mnt%r/s$i")
	read -r a0 a1 < <(cpu_ticks)
	[[ $s != "$(min "$s" "$sm")" ]] || cpu="$((a0 - c0)) $((a1 - c1))"
	sm=$(min "$s" "$sm")
	read -r t0 t1 < <(shown_at "$tend" "$WORK/mnt0/s$i" "$WORK/mnt1/s$i")
	sh0+=("$t0") sh1+=("$t1")
	shs+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (a > b) ? a : b }')")
	for r in 0 1; do
		[[ -n $(find "$WORK/store$r/s$i" -name "__${r}_*.distcp") ]] ||
			{ echo "$ME: store $r holds no file of rank $r in s$i" >&2; exit 1; }
	done
	rm -rf "${WORK:?}/mnt0/s$i"   # rotation through one mount: every store
	gone "$WORK/store0/s$i" "$WORK/store1/s$i"

	# a fresh name each time, removed once through mount 0 (on every
	# node): on f76697e an `rm -rf` of the same name through mount 1 right
	# after failed with EPERM, and a lookup there could join the removed
	# save again (so that a new mkdir of the name failed with EEXIST)
	for conv in fsync ""; do
		d=dd$i${conv:--nofsync}
		mkdir "$WORK/mnt0/$d" "$WORK/mnt1/$d"
		sync
		s=$(dd_pair "$WORK/mnt0/$d" "$WORK/mnt1/$d" "$conv")
		if [[ -n $conv ]]; then dm=$(min "$s" "$dm"); else dmn=$(min "$s" "$dmn"); fi
		rm -rf "${WORK:?}/mnt0/$d"
		gone "$WORK/store0/$d" "$WORK/store1/$d"
	done
}
for i in $(seq "$REPS"); do   # which side goes first alternates
	if ((i % 2)); then direct_side; mount_side "$i"; else mount_side "$i"; direct_side; fi
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
worst() { printf '%s\n' "$@" | sort -n | tail -1; }

# ---- load: files in store 1 only, through daemon 0 vs from store 1 ----
read -r _ tend < <(save "$WORK/mnt1/L")
# rank 0's mount is not looked at before daemon 1 shows it complete (a
# lookup while it is being saved would join the save there)
shown_at "$tend" "$WORK/mnt1/L" >/dev/null
for _ in $(seq 400); do [[ -e $WORK/mnt0/L ]] && break; sleep 0.05; done
shown_at "$tend" "$WORK/mnt0/L" >/dev/null
if [[ -e $WORK/store0/L ]] && [[ -n $(find "$WORK/store0/L" -name '*distcp' -o -name .metadata) ]]; then
	echo "$ME: store 0 holds files of L: the load would not be remote" >&2
	exit 1
fi
# the reference reader: dd bs=1M of the same files, one after another
(cd "$WORK/store1/L" && find . -maxdepth 1 -type f \( -name '*.distcp' -o -name .metadata \) | sort) >"$WORK/L.names"
sed "s|^\.|$WORK/store1/L|" "$WORK/L.names" >"$WORK/L.store"
sed "s|^\.|$WORK/mnt0/L|" "$WORK/L.names" >"$WORK/L.mount"
sed "s|^\.|$WORK/mnt1/L|" "$WORK/L.names" >"$WORK/L.mount1"
lsc="" lmc="" l1c="" lsw="" lmw="" dsc="" dmc="" d1c="" ldb=0
for i in $(seq "$REPS"); do
	if [[ $COLD == 1 ]]; then
		drop_caches
		read -r ldb l < <(bench_dd_list "$WORK/L.store"); dsc=$(min "$l" "$dsc")
		drop_caches
		read -r _ l < <(bench_dd_list "$WORK/L.mount"); dmc=$(min "$l" "$dmc")
		drop_caches
		read -r _ l < <(bench_dd_list "$WORK/L.mount1"); d1c=$(min "$l" "$d1c")
		drop_caches
		l=$($PY "$WORKER" load "$WORK/store1/L" "$MIB"); lsc=$(min "$l" "$lsc")
		drop_caches
		l=$($PY "$WORKER" load "$WORK/mnt1/L" "$MIB"); l1c=$(min "$l" "$l1c")
		drop_caches
		l=$($PY "$WORKER" load "$WORK/mnt0/L" "$MIB"); lmc=$(min "$l" "$lmc")
	fi
	# warm: right after the cold load through mount 0 (its page cache and
	# store 1's hold the files)
	l=$($PY "$WORKER" load "$WORK/store1/L" "$MIB"); lsw=$(min "$l" "$lsw")
	l=$($PY "$WORKER" load "$WORK/mnt0/L" "$MIB"); lmw=$(min "$l" "$lmw")
done

fstype=$(df --output=fstype "$WORK" | tail -1)
echo
echo "2 MPI daemons (mpirun -np 2 shardfs --mpi) on this one machine, stores $WORK/store0 and store1 ($fstype);" \
	"$MIB MiB checkpoint (8 F32 tensors, 8 files per rank); best of $REPS;" \
	"loads $([[ $COLD == 1 ]] && echo "cold (sync + drop_caches before each) and warm (again right after)" || echo "warm only (drop_caches not writable)");" \
	"load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo
echo "| row | GB/s | ratio | seconds |"
echo "|---|---:|---:|---:|"
awk -v n=$((MIB << 20)) -v nd=$((((MIB + 1) / 2) * 2 << 20)) -v ss="$ss" -v sm="$sm" -v ds="$ds" -v dm="$dm" -v dsn="$dsn" -v dmn="$dmn" \
	-v shm="$(median "${shs[@]}")" -v shw="$(worst "${shs[@]}")" -v reps="$REPS" \
	-v lsc="$lsc" -v lmc="$lmc" -v l1c="$l1c" -v dsc="$dsc" -v dmc="$dmc" -v d1c="$d1c" -v ldb="${ldb:-0}" -v lsw="$lsw" -v lmw="$lmw" 'BEGIN {
	printf "| save, 2 ranks, rank r straight to disk beside store r | %.2f | 1.00 | %.2f |\n", n / ss / 1e9, ss
	printf "| save, 2 ranks, rank r through daemon r'"'"'s mount | %.2f | %.2fx | %.2f |\n", n / sm / 1e9, ss / sm, sm
	printf "| dd bs=1M conv=fsync, 2 at once, into the stores | %.2f | 1.00 | %.2f |\n", nd / ds / 1e9, ds
	printf "| dd bs=1M conv=fsync, 2 at once, through the mounts | %.2f | %.2fx | %.2f |\n", nd / dm / 1e9, ds / dm, dm
	printf "| dd bs=1M, no fsync, 2 at once, into the stores | %.2f | 1.00 | %.2f |\n", nd / dsn / 1e9, dsn
	printf "| dd bs=1M, no fsync, 2 at once, through the mounts | %.2f | %.2fx | %.2f |\n", nd / dmn / 1e9, dsn / dmn, dmn
	printf "| shown committed and verified on daemon 0 and 1 after the save returned (median of %d; worst %.2f) | | | %.2f |\n", reps, shw, shm
	if (lsc != "") {
		printf "| load, cold, store 1 directly | %.2f | 1.00 | %.2f |\n", n / lsc / 1e9, lsc
		printf "| load, cold, daemon 0'"'"'s mount (files in store 1 only) | %.2f | %.2fx | %.2f |\n", n / lmc / 1e9, lsc / lmc, lmc
		printf "| load, cold, daemon 1'"'"'s mount (its own store: the same FUSE path, no MPI) | %.2f | %.2fx | %.2f |\n", n / l1c / 1e9, lsc / l1c, l1c
		printf "| load, cold, the other node'"'"'s files vs its own (daemon 0'"'"'s mount vs daemon 1'"'"'s) | | %.2fx | |\n", l1c / lmc
		printf "| dd bs=1M of its files, cold, store 1 directly | %.2f | 1.00 | %.2f |\n", ldb / dsc / 1e9, dsc
		printf "| dd bs=1M of its files, cold, daemon 0'"'"'s mount | %.2f | %.2fx | %.2f |\n", ldb / dmc / 1e9, dsc / dmc, dmc
		printf "| dd bs=1M of its files, cold, daemon 1'"'"'s mount (its own store: no MPI) | %.2f | %.2fx | %.2f |\n", ldb / d1c / 1e9, dsc / d1c, d1c
	}
	printf "| load, warm, store 1 directly | %.2f | 1.00 | %.2f |\n", n / lsw / 1e9, lsw
	printf "| load, warm, daemon 0'"'"'s mount (files in store 1 only) | %.2f | %.2fx | %.2f |\n", n / lmw / 1e9, lsw / lmw, lmw
}'
hz=$(getconf CLK_TCK)
read -r c0 c1 <<<"$cpu"
echo
echo "shown after the save returned, per run: daemon 0 ${sh0[*]} s; daemon 1 ${sh1[*]} s"
awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN {
	printf "daemon CPU during the fastest save through the mounts: daemon 0 %.2f s, daemon 1 %.2f s\n", a / hz, b / hz }'
