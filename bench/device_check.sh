#!/usr/bin/env bash
# The GPU checks, as the one prepared command of a session lent a device machine (its image has torch,
# transformers, peft and accelerate; `make device-prep` here puts pytest's wheels in .whl/ and the
# converted tokenizer in .cache/device/). Then, from the device tool:
#   run(command="bash bench/device_check.sh", carry=[".whl", ".cache/device"], timeout_s=540)
# Logs and results land in $OUT: the gpu-marked tests, bench/gpu.py whole and with offloaded FSDP shards.
set -uo pipefail
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
export META_AGENT_CACHE=$PWD/.cache/device HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python -m pip install --quiet --no-index --find-links .whl pytest 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
timeout 240 python -m pytest -m gpu -p no:cacheprovider tests/training/test_sharding.py 2>&1 | tee "$out/pytest_gpu.log"
timeout 120 python -m bench.gpu --out "$out/gpu.json" > "$out/bench_gpu.log" 2>&1
echo "bench.gpu: rc $?"
timeout 150 python -m bench.gpu --fsdp-offload --out "$out/gpu_fsdp_offload.json" > "$out/bench_gpu_fsdp.log" 2>&1
echo "bench.gpu --fsdp-offload: rc $?"
