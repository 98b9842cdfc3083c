#!/bin/sh
# test_load_gpu_tool.sh TOOL WITH_CUDA - shardfs-load-gpu end to end.
# With a CUDA device: load a generated raw file and a safetensors file with
# --verify, per file and per tensor, and check the report. Without one: the
# tool must exit 1 saying why ("no CUDA device: ..." in a CUDA build,
# "built without CUDA" in a stub build), and the test says it checked only
# that. Bad usage must exit 2 either way.
set -u
tool=$1
with_cuda=$2
dir=$(mktemp -d /tmp/sf_load_gpu_tool.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT INT TERM

fail() { echo "FAIL: $*"; exit 1; }

"$tool" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no FILE: want exit 2"
"$tool" --depth 0 x >/dev/null 2>&1; [ $? -eq 2 ] || fail "--depth 0: want exit 2"
"$tool" --staging-mb abc x >/dev/null 2>&1; [ $? -eq 2 ] || fail "--staging-mb abc: want exit 2"

head -c 3000000 /dev/urandom >"$dir/raw.bin" || fail "generating raw.bin"
# a safetensors file: 8-byte LE header length, JSON padded to 8, data
/usr/bin/python3 - "$dir/m.safetensors" <<'PY' || fail "generating m.safetensors"
import json, os, struct, sys
t = {"w": ("F32", [300, 257], 4), "b": ("BF16", [257], 2), "e": ("I64", [0], 8)}
hdr, off = {}, 0
for name, (dt, shape, isz) in t.items():
    n = isz
    for d in shape:
        n *= d
    hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
    off += n
j = json.dumps(hdr).encode()
j += b" " * ((8 - len(j) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(j)) + j + os.urandom(off))
PY

out=$("$tool" --verify --staging-mb 1 --depth 3 "$dir/raw.bin" "$dir/m.safetensors" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	case "$out" in
	*"no CUDA device: "*)
		[ "$with_cuda" = ON ] || fail "stub build said: $out"
		[ $rc -eq 1 ] || fail "no device: exit $rc, want 1"
		echo "checked: no-device failure ($out); the load itself needs a CUDA device"
		exit 0 ;;
	*"built without CUDA"*)
		[ "$with_cuda" != ON ] || fail "CUDA build said: $out"
		[ $rc -eq 1 ] || fail "stub: exit $rc, want 1"
		echo "checked: stub failure ($out)"
		exit 0 ;;
	*) fail "exit $rc: $out" ;;
	esac
fi
echo "$out"
echo "$out" | grep -q "^loaded 4 tensors from 2 files" || fail "report"
echo "$out" | grep -q "^verify: 4 of 4 tensors match" || fail "verify line"
echo "$out" | grep -q "^whole load: *3[0-9]* bytes" || fail "load bytes"
out=$("$tool" --per-tensor --verify "$dir/m.safetensors" 2>&1) || fail "per tensor: $out"
echo "$out" | grep -q "^verify: 3 of 3" || fail "per-tensor verify: $out"
echo "passed: loads verified on the device"
