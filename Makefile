# Two commands do all the set-up on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test demo sysdeps install bench clean

# torch is pinned: a bare `torch` requirement pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel on disk.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,demo]'
	touch $(STAMP)

install: $(STAMP)

# The tests start a real OCI registry (Debian's docker-registry) and read stores with skopeo.
sysdeps:
	@if ! command -v docker-registry >/dev/null || ! command -v skopeo >/dev/null || ! command -v tar >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry skopeo tar >/dev/null; \
	fi

test: $(STAMP) sysdeps
	$(PY) -m pytest -q

demo: $(STAMP)
	bash demo/demo.sh

bench: $(STAMP) sysdeps
	$(PY) benchmarks/pack.py
	$(PY) benchmarks/verify.py
	$(PY) benchmarks/registry.py

clean:
	rm -rf $(VENV) demo/work
