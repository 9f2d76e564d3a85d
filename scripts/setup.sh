#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent: packages already
# present are left alone, and nothing is done (no apt-get at all) when everything is there.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev libucx-dev ucx-utils
  libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev
  clang  # scripts/sanitize.sh and the libFuzzer targets (tests/fuzz)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: must run as root to install packages (apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
