#!/bin/bash
# Host time of a Hugging Face Llama step (benchmarks/time_hf_llama_host.py), 2026-11-27.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv | tee $OUT/env.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, torch.version.cuda, 'transformers', transformers.__version__)" | tee -a $OUT/env.txt
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a $OUT/env.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 500 > $OUT/clocks.csv &
SMI=$!
run() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt; timeout 240 python3 benchmarks/time_hf_llama_host.py "$@" --out $OUT/hf_llama.csv 2>&1 | grep -v -i warn | tee -a $OUT/log.txt; }
run --layers 32 --seq 16 1024 2048 4096
run --layers 32 --seq 8192 --modes hf_ckpt hf_ckpt_sync
kill $SMI
