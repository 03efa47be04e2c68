#!/usr/bin/env bash
# `make image`: the specbundle image built on this machine, from a locally made base (no container registry is
# needed): deploy/Containerfile says what goes in. Cached under $CACHE (the base's rootfs, the llama.cpp wheel,
# the wheelhouse): a second run rebuilds only the project's wheel and the image.
#   IMAGE (specbundle:0.1.0)  BASE (localhost/debian-base:bookworm)  PYTHON (.venv/bin/python: pip and setuptools)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${CACHE:-$HOME/.cache/specbundle}
IMAGE=${IMAGE:-specbundle:0.1.0}
BASE=${BASE:-localhost/debian-base:bookworm}
PYTHON=${PYTHON:-.venv/bin/python}
TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -1)}
LLAMA=llama-cpp-python==0.3.36
# x86-64-v3, not the build machine's own CPU (GGML_NATIVE): the image runs elsewhere. One CPU backend linked in:
# the dynamically loaded variants (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS) can fail with "no backends are loaded".
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
mkdir -p "$CACHE"

for tool in mmdebstrap buildah podman; do
    command -v "$tool" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap buildah podman >/dev/null; break; }
done
[ -n "$TORCH_WHEEL" ] || { echo "error: the torch 2.13.0 CPU wheel is not in /opt/wheels (set TORCH_WHEEL)" >&2; exit 2; }

# The base: Debian bookworm's minimal variant with what the image runs on.
if ! podman image exists "$BASE"; then
    if [ ! -f "$CACHE/rootfs.tar" ]; then
        mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libgomp1 bookworm "$CACHE/rootfs.tar.part"
        mv "$CACHE/rootfs.tar.part" "$CACHE/rootfs.tar"
    fi
    podman import "$CACHE/rootfs.tar" "$BASE"
fi

# llama-cpp-python as a portable wheel, kept only once it loads a GGUF.
if ! ls "$CACHE"/llama-wheel/llama_cpp_python-*.whl >/dev/null 2>&1; then
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PYTHON" -m pip wheel -q --no-deps --no-binary llama-cpp-python \
        -w "$CACHE/llama-wheel.part" "$LLAMA"
    "$PYTHON" deploy/check_llama_wheel.py "$CACHE"/llama-wheel.part/llama_cpp_python-*.whl
    rm -rf "$CACHE/llama-wheel" && mv "$CACHE/llama-wheel.part" "$CACHE/llama-wheel"
fi

# The wheelhouse: the project's wheel from a copy of the sources (pyproject.toml's package list decides what is in
# it), then every dependency, torch and llama-cpp-python from the wheels above.
CONTEXT="$CACHE/context"
rm -rf "$CONTEXT" && mkdir -p "$CONTEXT/wheelhouse" "$CACHE/wheelhouse"
rm -f "$CACHE"/wheelhouse/specbundle-*.whl
SRC=$(mktemp -d) && trap 'rm -rf "$SRC"' EXIT
git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md core bundler runner schemas \
    | xargs -0 cp --parents -t "$SRC"
"$PYTHON" -m pip wheel -q --no-build-isolation -w "$CACHE/wheelhouse" --find-links "$CACHE/llama-wheel" \
    "$TORCH_WHEEL" "$SRC"
cp -l "$CACHE"/wheelhouse/*.whl "$CONTEXT/wheelhouse/"
cp deploy/Containerfile "$CONTEXT/Containerfile"

buildah bud --isolation chroot --layers --build-arg "BASE=$BASE" -t "$IMAGE" -f "$CONTEXT/Containerfile" "$CONTEXT"
echo "built $IMAGE"
