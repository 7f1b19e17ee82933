# container-entry: SageMaker training image with PyTorch DDP by default.
# `make` or `make help` lists every target.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VERSION      ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REVISION     ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BASE_IMAGE   ?= 763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04
IMAGE        ?= container-entry:$(VERSION)
STANDIN      ?= container-entry/dlc-standin:latest
DEMO_IMAGE   ?= container-entry:demo
VENV         ?= .venv
PYTHON       := $(VENV)/bin/python
PYTEST_ARGS  ?=
SCRIPT       ?= examples/hf_trainer_tiny.py
ARGS         ?=

.PHONY: help venv standin build demo test unit lint run clean

help: ## list targets and variables
	@echo "Targets:"
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Variables (make TARGET VAR=value):"
	@echo "  BASE_IMAGE  base image for build (default: the HF PyTorch training GPU DLC)"
	@echo "  IMAGE       tag of the image build produces (default: $(IMAGE))"
	@echo "  STANDIN     tag of the offline DLC stand-in used by demo/test ($(STANDIN))"
	@echo "  SCRIPT/ARGS script and arguments for run (default: $(SCRIPT))"
	@echo "  PYTEST_ARGS extra pytest arguments for test"

venv: $(VENV)/.done ## create .venv with the pinned dev/test dependencies
$(VENV)/.done: requirements/dev.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements/dev.txt
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

standin: ## build the offline stand-in of the DLC (debootstrap + wheels, no registry)
	scripts/build-standin.sh $(STANDIN)

build: ## build the image: make build BASE_IMAGE=<image> IMAGE=<tag>
	docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE) .

demo: venv standin ## build stand-in + image, run a 2-host x 2-worker CPU HF Trainer job
	$(MAKE) build BASE_IMAGE=$(STANDIN) IMAGE=$(DEMO_IMAGE)
	$(PYTHON) examples/hf_trainer_tiny.py --write-data build/demo-data
	$(PYTHON) scripts/local_cluster.py --image $(DEMO_IMAGE) --hosts 2 --workers-per-host 2 \
		--script examples/hf_trainer_tiny.py --data build/demo-data/data.jsonl \
		--hp epochs=3 --hp learning-rate=0.005

test: venv ## run every test (unit, real torchrun, docker cluster); needs a docker engine
	$(PYTHON) -m pytest $(PYTEST_ARGS)

unit: venv ## run the unit tests only (no docker, no processes)
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

lint: venv ## ruff on Python, shellcheck on shell scripts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	shellcheck scripts/*.sh docker/standin/*.sh .ci/run

run: ## docker run --gpus all IMAGE on SCRIPT ARGS, current dir mounted at /opt/ml/code
	docker run --rm --gpus all --shm-size 1g -v "$(CURDIR)":/opt/ml/code -w /opt/ml/code \
		$(IMAGE) train /opt/ml/code/$(SCRIPT) $(ARGS)

clean: ## remove build outputs and the venv (images are kept)
	rm -rf build dist *.egg-info $(VENV) .pytest_cache .ruff_cache
