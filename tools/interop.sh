#!/usr/bin/env bash
# tools/interop.sh - the frameworks' own files, made again and mounted
# (`tools/test.sh --interop`; not part of CI: it downloads several GB).
#
# 1. venvs with the frameworks, from PyPI, under $SHARDFS_VENVS (default
#    ~/.cache/shardfs-venvs; kept between runs):
#      torch2  torch, numpy, xxhash, safetensors, transformers (5.x),
#              megatron-core (current), psutil, zstandard, huggingface_hub
#      hf4     transformers 4.46.3 (sees torch2's packages through a .pth)
#      mc015   megatron-core 0.15.3 (the last that saves flattened ranges) + zarr<3
#      mc017   megatron-core 0.17.1 (sees torch2's; its wheel says Python >= 3.12
#              but runs on 3.11: installed with --ignore-requires-python)
#      paddle  paddlepaddle (CPU), numpy, xxhash
#      deepspeed  deepspeed (CPU: DS_ACCELERATOR=cpu), torch (sees torch2's)
#      paddlenlp  paddlepaddle 3.3.1 + paddlenlp 2.8.1 with the pins it needs
#                 (where it does not install, its fixtures are not made again);
#                 paddlenlp3: paddlenlp 3.0.0b4 and the few packages it adds,
#                 --target beside it, for the Qwen2 and Mistral fixtures
# 2. every fixture generator of test/interop writes the fixtures again into
#    a temporary directory, in test/fixtures' layout, each checking its
#    expected.json against the framework's own loader where it can;
# 3. the build's mount tests of foreign formats run against those files
#    (SHARDFS_FIXTURES), so a new framework release is tested the day it is
#    installed. Debian's torch 1.13 checkpoints are written by test_dcp.py
#    itself, as in CI.
# 4. each framework saves through a fresh mount and loads back through it
#    (test/interop/save_through_mount.py: one daemon, then 2 MPI daemons
#    with node-local stores): torch's dcp.save from 2 gloo ranks (FSDP2 +
#    AdamW, DTensor), save_pretrained, paddle's save_state_dict from 2 CPU
#    ranks, Megatron-Core's dist_checkpointing.save; byte-exact against the
#    state saved, `user.shardfs.verified` = yes. A missing venv is skipped.
# Environment: SHARDFS_VENVS, KEEP=1 (keep the fixtures), BUILD (default
# build). Exit status: 0 when every generator and test passed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venvs=${SHARDFS_VENVS:-$HOME/.cache/shardfs-venvs}
build=${BUILD:-$top/build}
py=$(command -v python3)
mkdir -p "$venvs"

stage() { printf '\n==== %s ====\n' "$*"; }

# venv NAME [--sees OTHER] PIP-ARGS...: create NAME once, install PIP-ARGS
venv() {
	local name=$1; shift
	local sees=""
	if [[ ${1:-} == --sees ]]; then sees=$2; shift 2; fi
	if [[ ! -x $venvs/$name/bin/python ]]; then
		"$py" -m venv "$venvs/$name"
	fi
	if [[ -n $sees ]]; then
		"$venvs/$sees/bin/python" -c 'import site; print(site.getsitepackages()[0])' \
			> "$("$venvs/$name/bin/python" -c 'import site; print(site.getsitepackages()[0])')/$sees.pth"
	fi
	"$venvs/$name/bin/pip" install -q "$@"
}

stage "venvs in $venvs"
venv torch2 torch numpy xxhash safetensors transformers megatron-core psutil zstandard huggingface_hub
venv hf4 --sees torch2 'transformers==4.46.3'
venv mc015 --sees torch2 --no-deps 'megatron-core==0.15.3'
"$venvs/mc015/bin/pip" install -q 'zarr<3'
venv mc017 --sees torch2 --no-deps --ignore-requires-python 'megatron-core==0.17.1' ||
	echo "interop: no megatron-core 0.17 venv: its fixtures are not made again" >&2
venv paddle paddlepaddle numpy xxhash
venv deepspeed --sees torch2 deepspeed
pnlp=1
venv paddlenlp 'paddlepaddle==3.3.1' 'paddlenlp==2.8.1' 'huggingface_hub<0.26' 'aistudio-sdk==0.2.1' \
	'pyarrow<17' 'datasets<3' xxhash || { pnlp=0; echo "interop: paddlenlp 2.8.1 does not install here: its fixtures are the committed ones"; }
for v in torch2 hf4 mc015 mc017 paddle deepspeed; do
	"$venvs/$v/bin/pip" list 2>/dev/null |
		grep -Ei '^(torch|transformers|megatron-core|paddlepaddle|safetensors|huggingface[-_]hub|deepspeed) ' |
		sed "s/^/  $v: /" || true
done

fx=$(mktemp -d /tmp/shardfs-interop-XXXXXX)
cleanup() { if [[ ${KEEP:-0} == 1 ]]; then echo "kept: $fx"; else rm -rf "$fx"; fi; }
trap cleanup EXIT
mkdir -p "$fx/dcp" "$fx/hf" "$fx/hf-hub" "$fx/paddle" "$fx/megatron" "$fx/deepspeed" "$fx/dtensor" \
	"$fx/megatron-0.17" "$fx/paddlenlp"
status=0
gen() { # gen LABEL COMMAND...: run one generator; a failure is reported
	echo "-- $1"
	shift
	"$@" || { echo "interop: generator failed: $*" >&2; status=1; }
}
i=$top/test/interop
stage "fixtures into $fx"
gen "DCP, current torch" "$venvs/torch2/bin/python" "$i/make_dcp_fixtures.py" "$fx/dcp"
gen "DCP, more (FSDP2, columns)" "$venvs/torch2/bin/python" "$i/make_dcp_fixtures_more.py" "$fx/dcp-more"
for d in "$fx"/dcp-more/torch-*; do # committed as torch-X.Y-more
	[[ -d $d ]] && mv "$d" "$fx/dcp/$(basename "$d")-more"
done
gen "HF, transformers 5 and DCP's HF writer" "$venvs/torch2/bin/python" "$i/make_hf_fixtures.py" "$fx/hf"
gen "HF, transformers 4.46" "$venvs/hf4/bin/python" "$i/make_hf_fixtures.py" "$fx/hf"
gen "HF hub cache, huggingface_hub's own hf_hub_download" "$venvs/torch2/bin/python" "$i/make_hf_hub_fixtures.py" "$fx/hf-hub"
gen "PaddlePaddle" "$venvs/paddle/bin/python" "$i/make_paddle_fixtures.py" "$fx/paddle"
[[ $pnlp == 1 ]] && gen "PaddleNLP unified checkpoints" "$venvs/paddlenlp/bin/python" "$i/make_paddlenlp_fixtures.py" "$fx/paddlenlp"
[[ $pnlp == 1 ]] || cp -r "$top/test/fixtures/paddlenlp/." "$fx/paddlenlp/"
# Qwen2 and Mistral are not in 2.8.1: paddlenlp 3.0.0b4's own code (no deps:
# it imports beside the 2.8.1 venv's paddle and packages) writes those
if [[ $pnlp == 1 ]] && "$venvs/paddlenlp/bin/pip" install -q --no-deps --upgrade --target "$venvs/paddlenlp3" \
	'paddlenlp==3.0.0b4' ml_dtypes 'tokenizers>=0.21,<0.22' tiktoken omegaconf 'antlr4-python3-runtime==4.9.3'; then
	gen "PaddleNLP 3.0.0b4 hybrid (qwen2, mistral)" env PYTHONPATH="$venvs/paddlenlp3" \
		"$venvs/paddlenlp/bin/python" "$i/make_paddlenlp_fixtures.py" "$fx/paddlenlp"
elif [[ $pnlp == 1 ]]; then
	echo "interop: paddlenlp 3.0.0b4 does not install here: its fixtures are the committed ones"
	cp -r "$top/test/fixtures/paddlenlp/paddlenlp-3.0.0b4" "$fx/paddlenlp/"
fi
gen "DeepSpeed ZeRO 1/2/3" env DS_ACCELERATOR=cpu "$venvs/deepspeed/bin/python" \
	"$i/make_deepspeed_fixtures.py" "$fx/deepspeed"
gen "per-rank DTensor pickles (verl, FSDP2 + TP)" "$venvs/torch2/bin/python" \
	"$i/make_dtensor_fixtures.py" "$fx/dtensor"
if [[ -f ${COLOSSAL_PR_SRC:-/nonexistent}/colossalai/checkpoint_io/distributed_checkpoint_utils.py ]]; then
	gen "ColossalAI distributed checkpoint IO (PR 6181's own code)" "$venvs/torch2/bin/python" \
		"$i/make_colossal_fixtures.py" "$COLOSSAL_PR_SRC" "$fx/colossal"
else # the PR is in no release: its code comes from a checkout
	echo "-- ColossalAI PR 6181: skipped, the committed fixtures are used (set COLOSSAL_PR_SRC to a checkout of hpcaitech/ColossalAI at 7e880a13)"
	cp -r "$top/test/fixtures/colossal" "$fx/colossal"
fi
gen "Megatron-Core, current" "$venvs/torch2/bin/python" "$i/make_megatron_fixtures.py" "$fx/megatron"
gen "Megatron-Core 0.15.3" "$venvs/mc015/bin/python" "$i/make_megatron_fixtures.py" "$fx/megatron"
d=$(ls -d "$fx"/megatron/mcore-0.15*/distopt 2>/dev/null | head -1)
if [[ -n $d ]]; then
	gen "Megatron-Core hostile variants" "$venvs/torch2/bin/python" \
		"$i/make_megatron_hostile.py" "$d" "$fx/megatron/hostile"
fi
if [[ -x $venvs/mc017/bin/python ]]; then
	gen "Megatron-Core 0.17 (GPT + DistributedOptimizer, TP 2 x DP 2)" \
		"$venvs/mc017/bin/python" "$i/make_megatron017_fixtures.py" "$fx/megatron-0.17"
else
	echo "-- Megatron-Core 0.17: no venv $venvs/mc017: not made again; the committed fixtures are tested"
	cp -r "$top/test/fixtures/megatron-0.17/." "$fx/megatron-0.17/"
fi

stage "mount tests against them"
[[ -x $build/tools/shardfs ]] || { cmake -S "$top" -B "$build" && cmake --build "$build" -j "$(nproc)"; }
(cd "$build" && SHARDFS_FIXTURES=$fx ctest --output-on-failure \
	-R 'mount_(dcp|hf|paddle|megatron|deepspeed|dtensor|colossal|index|live)|mpi_mount_foreign') || status=1
stage "frameworks saving through the mount (SPEC 8)"
# stm FRAMEWORK VENV [--mpi]: save through a fresh mount (one daemon; --mpi:
# two daemons with node-local stores) and load back through it, byte-exact,
# verified (test/interop/save_through_mount.py); 77 from it is a skip
stm() {
	local fw=$1 v=$2 rc=0; shift 2
	echo "-- $fw saving through the mount${1:+ ($1: 2 daemons, node-local stores)}"
	if [[ ! -x $venvs/$v/bin/python ]]; then
		echo "   skipped: no venv $venvs/$v"
		return 0
	fi
	/usr/bin/python3 "$i/save_through_mount.py" --bin "$build/tools" --framework "$fw" \
		--py "$venvs/$v/bin/python" "$@" || rc=$?
	if [[ $rc == 77 ]]; then
		echo "   skipped: no FUSE (or no mpirun for --mpi) here"
	elif [[ $rc != 0 ]]; then
		echo "interop: $fw saving through the mount${1:+ $1} failed" >&2
		status=1
	fi
}
for m in "" --mpi; do
	stm torch torch2 $m      # dcp.save/dcp.load, 2 gloo ranks, FSDP2 + AdamW, DTensor
	stm hf torch2 $m         # save_pretrained/from_pretrained (transformers 5)
	stm paddle paddle $m     # paddle.distributed.save_state_dict, 2 CPU ranks
	stm megatron mc017 $m    # dist_checkpointing.save/load, 2 gloo ranks
done

stage "result"
[[ $status == 0 ]] && echo "interop: all generators and tests passed" ||
	echo "interop: FAILED (see above)"
exit $status
