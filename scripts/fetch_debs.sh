#!/usr/bin/env bash
# Downloads (here, with network) the Debian packages that the GPU machine lacks into the ignored
# folder .debs/, for scripts/device_test.sh to unpack there (no registry is reachable there).
# Abseil is missing on the GPU image; nlohmann-json, yaml-cpp and Google Benchmark may be, so
# they come too (the unpacked prefix is searched first, so one consistent set is used).
# GoogleTest comes as a fallback only (fallback/), used when the image has none.
# Usage: scripts/fetch_debs.sh   (then call the device with carry [".debs"])
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  libabsl-dev libabsl20220623
  nlohmann-json3-dev
  libyaml-cpp-dev libyaml-cpp0.7
  libbenchmark-dev libbenchmark1debian
)
# Only unpacked there when the image has no GoogleTest of its own.
fallback_packages=(libgtest-dev libgmock-dev)

mkdir -p .debs
cd .debs
missing=()
for p in "${packages[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "fetch_debs: all ${#packages[@]} packages already in .debs/"
else
  echo "fetch_debs: downloading ${missing[*]}"
  apt-get download "${missing[@]}"
fi
mkdir -p fallback
cd fallback
for p in "${fallback_packages[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
cd ..
ls -la . fallback
du -sh .
