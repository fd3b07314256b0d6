#!/bin/bash
# Exposed host issue in eager PyTorch (benchmarks/time_host_dispatch.py), 2026-11-27.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/simulator PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv | tee $OUT/env.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" | tee -a $OUT/env.txt
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a $OUT/env.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 500 > $OUT/clocks.csv &
SMI=$!
run() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt; timeout 90 python3 benchmarks/time_host_dispatch.py "$@" --out $OUT/host_dispatch.csv 2>&1 | tee -a $OUT/log.txt; }
run selene-gpt3 --shrink 64 --layers 8 --seq 256
run selene-gpt3 --shrink 16 --layers 8 --seq 512
run selene-gpt3 --shrink 4 --layers 8 --seq 1024
run MEGREADME-H100-01 --layers 8
run MEGREADME-H100-02 --tp 2 --layers 8
run MEGREADME-H100-04 --tp 8 --layers 8
run MLPERF-v3.0-NVIDIA-n512 --tp 4 --layers 8
run selene-gpt3 --tp 8 --layers 8
kill $SMI
