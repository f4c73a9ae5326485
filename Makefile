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

CHECKOV_VENV ?= .venv-checkov

.PHONY: setup demo test lint synth deploy bench checkov
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

# checkov pins boto3 1.35, older than this project's: it gets an environment of its own.
$(CHECKOV_VENV)/bin/checkov:
	python3 -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q 'checkov>=3.3,<4'

checkov: setup $(CHECKOV_VENV)/bin/checkov
	$(PY) -m pytest tests/infrastructure/test_compliance.py -q -k checkov
