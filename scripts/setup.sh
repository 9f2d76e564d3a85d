#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent: packages already
# present are left alone, and nothing is done (no apt-get at all) when everything is there.
# Then the header-only dependencies that are not Debian packages, from their pinned PyPI wheels
# into the ignored folder .deps/ (skipped when already there; the build works without them:
# the feature is then off with a clear message).
set -euo pipefail
cd "$(dirname "$0")/.."

# Files of pinned PyPI wheels into .deps/<dir> (skipped when that version is there):
#   pinned_wheels DIR VERSION WHAT KIND SPEC...
# KIND include: the wheels' include/ trees into DIR/include; bin: their bin/ executables
# (cuobjdump, nvdisasm) into DIR/bin. WHAT: what is off without them, for the message.
pinned_wheels() {
  local dir=$1 version=$2 what=$3 kind=$4
  shift 4
  [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ] && return 0
  if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    echo "setup: no python3 -m pip; $* not installed ($what)" >&2
    return 0
  fi
  local wheel_dir
  wheel_dir=$(mktemp -d)
  if python3 -m pip download --quiet --timeout 20 --retries 1 --no-deps --only-binary=:all: \
      "$@" -d "$wheel_dir"; then
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 - "$wheel_dir" "$dir" "$kind" <<'PY'
import glob, os, sys, zipfile
wheels, target, kind = sys.argv[1], sys.argv[2], sys.argv[3]
for wheel in glob.glob(wheels + "/*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith("/"):
                continue
            if kind == "include" and name.startswith("include/"):
                archive.extract(name, target)
            elif kind == "bin" and "/bin/" in name:
                os.makedirs(os.path.join(target, "bin"), exist_ok=True)
                path = os.path.join(target, "bin", os.path.basename(name))
                with archive.open(name) as source, open(path, "wb") as out:
                    out.write(source.read())
                os.chmod(path, 0o755)
PY
    echo "$version" > "$dir/VERSION"
    echo "setup: $* in $dir"
  else
    echo "setup: could not download $*; $what" >&2
  fi
  rm -rf "$wheel_dir"
}

# cuDNN frontend (C++ graph API, header-only) for prefill_backend: cudnn. CMake finds it in
# .deps/cudnn_frontend/include (cache variable DCP_CUDNN_FRONTEND_INCLUDE_DIR).
pinned_wheels .deps/cudnn_frontend 1.32.0 "prefill_backend cudnn will be off" include \
  "nvidia-cudnn-frontend==1.32.0"
# cuobjdump and nvdisasm (the SASS of the sm_90a kernels, read by the sass_* tests without a
# GPU; the CUDA toolkit of the CI machine has nvcc and ptxas but not these).
pinned_wheels .deps/cuda_sass 13.5.37 "the sass_* tests will say so" bin \
  "nvidia-cuda-cuobjdump==13.5.37" "nvidia-cuda-nvdisasm==13.5.37"

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev libucx-dev ucx-utils
  libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev
  clang  # scripts/sanitize.sh and the libFuzzer targets (tests/fuzz)
  shellcheck  # tests/scripts: the scripts checked before they meet a GPU machine
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
