# Two commands on a fresh machine: `make demo` and `make test`.
# Each bootstraps .venv once; a second run reuses it (the stamp tracks pyproject.toml).
PYTHON ?= python3
VENV   ?= .venv
# Used only when no torch is importable by $(PYTHON). On the 2-core dev machine this
# takes a local CPU wheel; elsewhere pick the build you want, e.g. TORCH_SPEC='torch>=2.5'.
TORCH_SPEC ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.x1-installed

.PHONY: demo test test-compat lint typecheck clean-venv tokenizer

$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch" >/dev/null 2>&1; then \
	  echo "[setup] torch found in $(PYTHON): venv shares system site packages (torch is not reinstalled)"; \
	  test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/python -c "import torch" >/dev/null 2>&1 || $(BIN)/pip install --quiet "$(TORCH_SPEC)"; \
	fi
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python -m x1_pretrain.tokenizer fetch
	$(BIN)/python -m x1_pretrain.evaluate --fetch
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m x1_pretrain.demo

test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/python -m pytest -n 2 --durations=25 tests

# The users' container versions (nvcr.io/nvidia/pytorch:24.10-py3): Python 3.10 + torch 2.5, with the
# transformers that works with it (constraints/torch25.txt). Where no Python 3.10 exists it fails under CI=true
# (CI promises this lane) and is skipped, saying so, elsewhere.
COMPAT_VENV  ?= .venv-compat
COMPAT_TORCH ?= torch==2.5.1
COMPAT_STAMP := $(COMPAT_VENV)/.x1-installed

$(COMPAT_STAMP): pyproject.toml constraints/torch25.txt
	@py="$$(.ci/python310)" || { echo "[compat] no Python 3.10 found (set X1_COMPAT_PYTHON)"; exit 3; }; \
	  echo "[compat] $$py"; test -x $(COMPAT_VENV)/bin/python || "$$py" -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -c "import torch" >/dev/null 2>&1 || \
	  $(COMPAT_VENV)/bin/pip install --quiet "$(COMPAT_TORCH)"
	$(COMPAT_VENV)/bin/pip install --quiet -c constraints/torch25.txt -e '.[test]'
	$(COMPAT_VENV)/bin/python -m x1_pretrain.tokenizer fetch
	$(COMPAT_VENV)/bin/python -m x1_pretrain.evaluate --fetch
	@touch $(COMPAT_STAMP)

test-compat:
	@if ! .ci/python310 >/dev/null; then \
	  if [ "$${CI:-}" = "true" ]; then \
	    echo "[compat] FAILED: CI=true but no Python 3.10 on this machine: the 3.10 + torch 2.5 lane cannot run" \
	         "(install one, e.g. pyenv install 3.10, or set X1_COMPAT_PYTHON to one)" >&2; exit 1; fi; \
	  echo "[compat] SKIPPED: no Python 3.10 on this machine (set X1_COMPAT_PYTHON to one)"; exit 0; fi; \
	$(MAKE) --no-print-directory $(COMPAT_STAMP) && \
	$(COMPAT_VENV)/bin/python -c "import sys, torch, transformers; print('[compat] Python', sys.version.split()[0], \
	  '| torch', torch.__version__, '| transformers', transformers.__version__)" && \
	$(COMPAT_VENV)/bin/python -m pytest -n 2 --durations=25 tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

tokenizer: $(STAMP)
	$(BIN)/python -m x1_pretrain.tokenizer fetch

clean-venv:
	rm -rf $(VENV)
