# Two commands on a fresh machine: `make demo` and `make test`.
# Each bootstraps .venv once; a second run reuses it (the stamp tracks pyproject.toml).
PYTHON ?= python3
VENV   ?= .venv
# Used only when no torch is importable by $(PYTHON). On the 2-core dev machine this
# takes a local CPU wheel; elsewhere pick the build you want, e.g. TORCH_SPEC='torch>=2.5'.
TORCH_SPEC ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.x1-installed

.PHONY: demo test lint typecheck clean-venv tokenizer

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
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m x1_pretrain.demo

test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

tokenizer: $(STAMP)
	$(BIN)/python -m x1_pretrain.tokenizer fetch

clean-venv:
	rm -rf $(VENV)
