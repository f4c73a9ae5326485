# Convenience targets; the README's two commands do the same without make.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m infra.node
	touch $(STAMP)

.PHONY: setup demo test lint synth deploy bench
setup: $(STAMP)

demo: setup
	$(VENV)/bin/gpu-autoscaler demo

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

synth: setup
	PATH=$(abspath $(VENV))/bin:$$PATH npx --yes aws-cdk@2 synth

deploy: setup
	PATH=$(abspath $(VENV))/bin:$$PATH npx --yes aws-cdk@2 deploy

bench: setup
	$(PY) -m benchmarks
