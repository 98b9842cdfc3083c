#!/usr/bin/env bash
# tools/deps.sh - install the Debian 12 packages shardfs builds, tests and
# demos with, skipping what is already there. Needs root (apt-get).
#   tools/deps.sh            build + test + demo dependencies
#   tools/deps.sh --minimal  only what the build and the demo need
set -euo pipefail
pkgs=(cmake make gcc pkg-config libfuse3-dev fuse3 libjansson-dev libxxhash-dev
      libzstd-dev zstd liburing-dev attr python3 python3-numpy)
if [ "${1:-}" != "--minimal" ]; then
	pkgs+=(clang openmpi-bin libopenmpi-dev python3-xxhash python3-torch
	       groff-base)  # groff-base: ctest unit_man_pages renders docs/man
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
else
	echo "deps: all installed"
fi
