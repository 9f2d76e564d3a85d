#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent: packages already
# present are left alone, and nothing is done (no apt-get at all) when everything is there.
# Then the header-only dependencies that are not Debian packages, from their pinned PyPI wheels
# into the ignored folder .deps/ (skipped when already there; the build works without them:
# the feature is then off with a clear message).
set -euo pipefail
cd "$(dirname "$0")/.."

# cuDNN frontend (C++ graph API, header-only) for prefill_backend: cudnn. CMake finds it in
# .deps/cudnn_frontend/include (cache variable DCP_CUDNN_FRONTEND_INCLUDE_DIR).
cudnn_frontend_version=1.32.0
cudnn_frontend_dir=.deps/cudnn_frontend
if [ "$(cat "$cudnn_frontend_dir/VERSION" 2>/dev/null)" != "$cudnn_frontend_version" ]; then
  if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
    wheel_dir=$(mktemp -d)
    if python3 -m pip download --quiet --timeout 20 --retries 1 --no-deps --only-binary=:all: \
        "nvidia-cudnn-frontend==$cudnn_frontend_version" -d "$wheel_dir"; then
      rm -rf "$cudnn_frontend_dir"
      mkdir -p "$cudnn_frontend_dir"
      python3 - "$wheel_dir" "$cudnn_frontend_dir" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            archive.extract(name, sys.argv[2])
PY
      echo "$cudnn_frontend_version" > "$cudnn_frontend_dir/VERSION"
      echo "setup: cuDNN frontend $cudnn_frontend_version headers in $cudnn_frontend_dir"
    else
      echo "setup: could not download nvidia-cudnn-frontend $cudnn_frontend_version;" \
           "prefill_backend cudnn will be off" >&2
    fi
    rm -rf "$wheel_dir"
  else
    echo "setup: no python3 -m pip; cuDNN frontend headers not installed" >&2
  fi
fi

# cuobjdump and nvdisasm (the SASS of the sm_90a kernels, read by the sass_* tests without a
# GPU; the CUDA toolkit of the CI machine has nvcc and ptxas but not these): the binaries of
# their pinned PyPI wheels into .deps/cuda_sass/bin.
cuda_sass_version=13.5.37
cuda_sass_dir=.deps/cuda_sass
if [ "$(cat "$cuda_sass_dir/VERSION" 2>/dev/null)" != "$cuda_sass_version" ]; then
  if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
    wheel_dir=$(mktemp -d)
    if python3 -m pip download --quiet --timeout 20 --retries 1 --no-deps --only-binary=:all: \
        "nvidia-cuda-cuobjdump==$cuda_sass_version" "nvidia-cuda-nvdisasm==$cuda_sass_version" \
        -d "$wheel_dir"; then
      rm -rf "$cuda_sass_dir"
      mkdir -p "$cuda_sass_dir/bin"
      python3 - "$wheel_dir" "$cuda_sass_dir/bin" <<'PY'
import glob, os, sys, zipfile
for wheel in glob.glob(sys.argv[1] + "/*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            base = os.path.basename(name)
            if "/bin/" in name and base in ("cuobjdump", "nvdisasm"):
                target = os.path.join(sys.argv[2], base)
                with archive.open(name) as source, open(target, "wb") as out:
                    out.write(source.read())
                os.chmod(target, 0o755)
PY
      echo "$cuda_sass_version" > "$cuda_sass_dir/VERSION"
      echo "setup: cuobjdump and nvdisasm $cuda_sass_version in $cuda_sass_dir/bin"
    else
      echo "setup: could not download cuobjdump / nvdisasm $cuda_sass_version;" \
           "the sass_* tests will say so" >&2
    fi
    rm -rf "$wheel_dir"
  else
    echo "setup: no python3 -m pip; cuobjdump / nvdisasm not installed" >&2
  fi
fi

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
