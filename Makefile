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
# the newest torch's own venv: the integration tests of the stop, exit and teardown run there
NEWEST_VENV  ?= .venv-torch-newest
PYTEST_ARGS  ?=
# make test: pytest-xdist workers (the jobs under test mostly wait on real time: more workers
# than CPUs; docs/test-speed.md)
TEST_WORKERS ?= 4
UNIT_WORKERS ?= 2
SCRIPT       ?= examples/hf_trainer_tiny.py
ARGS         ?=
GPUS         ?= all
REGISTRY     ?=
REPOSITORY   ?= container-entry
MOVING_TAG   ?= latest

.PHONY: help docker venv newest-torch standin build demo demo-disk test test-disk bytecode unit lint login-base push run gpu-check clean

help: ## list targets and variables
	@echo "Targets:"
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Variables (make TARGET VAR=value):"
	@echo "  BASE_IMAGE  base image for build (default: the HF PyTorch training GPU DLC)"
	@echo "  IMAGE       tag of the image build produces (default: $(IMAGE))"
	@echo "  STANDIN     tag of the offline DLC stand-in used by demo/test ($(STANDIN))"
	@echo "  SCRIPT/ARGS script and arguments for run (default: $(SCRIPT)); ARGS is split like"
	@echo "              a shell would split it but never evaluated"
	@echo "  GPUS        docker --gpus value for run (all; none for a CPU-only machine)"
	@echo "  PYTEST_ARGS extra pytest arguments for test and unit"
	@echo "  TEST_WORKERS pytest-xdist workers for test ($(TEST_WORKERS))"
	@echo "  UNIT_WORKERS pytest-xdist workers for unit ($(UNIT_WORKERS))"
	@echo "  VERSION     version tag for push, immutable in ECR (default: pyproject's, $(VERSION))"
	@echo "  REVISION    git revision tag for push, immutable in ECR (default: git HEAD, $(REVISION))"
	@echo "  MOVING_TAG  tag push moves to every new image ($(MOVING_TAG))"
	@echo "  REPOSITORY  repository push creates/uses ($(REPOSITORY))"
	@echo "  REGISTRY    HOST[:PORT] of a non-ECR registry for push (default: empty = Amazon ECR"
	@echo "              of the AWS account and AWS_REGION that boto3 finds)"
	@echo "  Environment for push/login-base: AWS_REGION, AWS_PROFILE or AWS_ACCESS_KEY_ID/...,"
	@echo "  AWS_ENDPOINT_URL (ECR API endpoint), ECR_REGISTRY_OVERRIDE=HOST[:PORT] (docker"
	@echo "  login/push for ECR go there instead; tests), RELEASE_BRANCH (buildspec, main)"

venv: $(VENV)/.done ## create .venv with the pinned dev/test dependencies (a copy of the machine's cached one)
$(VENV)/.done: requirements/dev.txt pyproject.toml scripts/build/wheel_backend.py scripts/build/dev_venv.py
	python3 -m scripts.build.dev_venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

newest-torch: $(NEWEST_VENV)/.done ## create .venv-torch-newest (the newest torch, for the tests that hold on it)
$(NEWEST_VENV)/.done: requirements/torch-newest.txt pyproject.toml scripts/build/wheel_backend.py scripts/build/dev_venv.py
	python3 -m scripts.build.dev_venv --requirements requirements/torch-newest.txt $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

standin: docker ## build the offline stand-in of the DLC (debootstrap + wheels, no registry)
	python3 -m scripts.build.disk_space --for standin
	scripts/build/build-standin.sh $(STANDIN)

build: ## build the image: make build BASE_IMAGE=<image> IMAGE=<tag>
	docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE) .

docker: ## make sure a docker engine runs (installs and starts one as root if needed)
	scripts/build/ensure-docker.sh

demo: docker demo-disk venv standin ## build stand-in + image, run a 2-host x 2-worker CPU HF Trainer job
	$(MAKE) build BASE_IMAGE=$(STANDIN) IMAGE=$(DEMO_IMAGE)
	$(PYTHON) examples/hf_trainer_tiny.py --write-data build/demo-data
	$(PYTHON) -m scripts.local.cluster --image $(DEMO_IMAGE) --hosts 2 --workers-per-host 2 \
		--script examples/hf_trainer_tiny.py --data build/demo-data/data.jsonl \
		--hp epochs=3 --hp learning-rate=0.005

test: docker test-disk venv newest-torch standin bytecode ## run every test (unit, real torchrun, docker cluster); needs a docker engine
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Free disk first: one line and exit 1 now, not `no space left on device` minutes into a build.
demo-disk test-disk: docker
	python3 -m scripts.build.disk_space --for $(@:-disk=)

# Where PYTHONDONTWRITEBYTECODE is set (these machines set it), Python reads .pyc files but never
# writes them: each of the suite's Python processes (about 830 bootstraps and rank wrappers)
# compiled the checkout's modules from source again. Written once here, they are read by all.
# pytest reads its own rewritten test modules' .pyc files the same way (it writes them only where
# Python may): a collection that may write them spares every pytest process 2 s of rewriting.
bytecode: venv
	$(PYTHON) -m compileall -q container_entry scripts tests examples
	PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q --collect-only -p no:cacheprovider >/dev/null

unit: venv bytecode ## run the unit tests only (no docker, no processes)
	$(PYTHON) -m pytest -n $(UNIT_WORKERS) tests/unit $(PYTEST_ARGS)

lint: venv ## ruff and mypy on Python, hadolint on the Dockerfiles, shellcheck on shell scripts (all from .venv)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint docker/Dockerfile docker/standin/Dockerfile
	$(VENV)/bin/shellcheck scripts/*/*.sh docker/standin/*.sh docker/sdk-hook.bash .ci/run

# Values reach scripts/build/push.py through the environment ("$$PUSH_..."), never pasted into a
# shell command line.
login-base push: export PUSH_BASE_IMAGE = $(BASE_IMAGE)
push: export PUSH_IMAGE = $(IMAGE)
push: export PUSH_REGISTRY = $(REGISTRY)
push: export PUSH_REPOSITORY = $(REPOSITORY)
push: export PUSH_VERSION = $(VERSION)
push: export PUSH_REVISION = $(REVISION)
push: export PUSH_MOVING_TAG = $(MOVING_TAG)

login-base: venv ## docker login to BASE_IMAGE's ECR registry when it is not on this machine
	$(PYTHON) -m scripts.build.push login-base --base-image "$$PUSH_BASE_IMAGE"

push: login-base ## build, tag VERSION, REVISION, MOVING_TAG, push to ECR (or REGISTRY); prints URI@digest
	$(MAKE) --no-print-directory build
	$(PYTHON) -m scripts.build.push push --image "$$PUSH_IMAGE" --registry "$$PUSH_REGISTRY" \
		--repository "$$PUSH_REPOSITORY" --version "$$PUSH_VERSION" --revision "$$PUSH_REVISION" \
		--moving-tag "$$PUSH_MOVING_TAG" --uri-file build/image-uri.txt

run: export RUN_IMAGE = $(IMAGE)
run: export RUN_SCRIPT = $(SCRIPT)
run: export RUN_ARGS = $(ARGS)
run: export RUN_GPUS = $(GPUS)
run: ## docker run --gpus GPUS IMAGE on SCRIPT ARGS (current dir mounted at /opt/ml/code)
	python3 -m scripts.local.run

.PHONY: bench
bench: venv standin ## ours vs bare torchrun vs the DLC launcher (5 rounds), then the relay table (5 rounds), ~40 min on 2 cores -> docs/benchmarks.md
	$(MAKE) --no-print-directory build BASE_IMAGE=$(STANDIN) IMAGE=container-entry:bench
	$(PYTHON) -m scripts.bench --image container-entry:bench --base $(STANDIN) --rounds 5 $(ARGS)
	$(PYTHON) -m scripts.bench.relay --image container-entry:bench --rounds 5 --make-target bench

.PHONY: bench-relay
bench-relay: venv standin ## the relay table alone: log-heavy DDP loop and HF job, ours vs bare torchrun in the image (ARGS=--rounds N ...) -> docs/benchmarks.md
	$(MAKE) --no-print-directory build BASE_IMAGE=$(STANDIN) IMAGE=container-entry:bench
	$(PYTHON) -m scripts.bench.relay --image container-entry:bench --make-target bench-relay $(ARGS)

.PHONY: bench-ready
bench-ready: venv standin ## 2 hosts, container start -> READY (torch imported, group made, first all_reduce): ours vs bare torchrun side by side (ARGS=--rounds N ...) -> docs/benchmarks.md
	$(MAKE) --no-print-directory build BASE_IMAGE=$(STANDIN) IMAGE=container-entry:bench
	$(PYTHON) -m scripts.bench.ready --image container-entry:bench --base $(STANDIN) $(ARGS)

.PHONY: bench-hook
bench-hook: venv standin ## what the SDK v3 hook (BASH_ENV) costs other processes: starts timed in the image, instructions counted here (valgrind) -> docs/benchmarks.md
	$(MAKE) --no-print-directory build BASE_IMAGE=$(STANDIN) IMAGE=container-entry:bench
	$(PYTHON) -m scripts.bench.sdk_hook --image container-entry:bench --instructions $(ARGS)

.PHONY: bench-import
bench-import: venv standin ## torch's import in the launcher and its first work: plain vs as the product does it (one BLAS thread) vs the GC paused, CPU and wall in the image -> docs/benchmarks.md
	$(MAKE) --no-print-directory build BASE_IMAGE=$(STANDIN) IMAGE=container-entry:bench
	$(PYTHON) -m scripts.bench.torch_import --image container-entry:bench $(ARGS)

.PHONY: bench-liveness
bench-liveness: venv ## N-host simulation of the real bootstrap (2-256 hosts): a killed, frozen, cut-off host noticed in ... s -> docs/liveness.md
	$(PYTHON) -m scripts.simulate.hosts --hosts 2 16 64 256 --write-docs docs/liveness.md $(ARGS)

.PHONY: bench-threads
bench-threads: venv ## CPU HF Trainer steps/s: OMP_NUM_THREADS default vs torchrun's 1 (~5 min) -> docs/thread-benchmark.md
	$(PYTHON) -m scripts.bench.threads $(ARGS)

.PHONY: bench-stragglers
bench-stragglers: venv ## what the straggler watch costs: steps/s sampling off vs every 5 s (HF job, plain DDP loop), 2 workers here, no image (~10 min; ARGS=--rounds N --seconds S ...)
	$(PYTHON) -m scripts.bench.stragglers $(ARGS)

# The system python3: a bare GPU host has torch, NCCL and transformers but no .venv and no docker.
gpu-check: ## on a GPU host, no docker: plan, DDP+preflight, HF, crash, OOM, hang, stop, flight-recorder fields, benchmark; one verdict line each (ARGS=--only ... --markdown FILE ...)
	python3 -m scripts.gpu.check $(ARGS)

clean: ## remove build outputs and the venvs (images and ~/.cache/container-entry are kept)
	rm -rf build dist *.egg-info $(VENV) $(NEWEST_VENV) .pytest_cache .ruff_cache
