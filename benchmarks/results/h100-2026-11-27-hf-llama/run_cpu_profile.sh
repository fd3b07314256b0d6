#!/bin/bash
# Where the host's time goes in a Hugging Face Llama step (torch.profiler CPU tables), 2026-11-27.
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee $OUT/env_profile.txt
timeout 300 python3 benchmarks/time_hf_llama_host.py --layers 32 --seq 16 1024 --repeats 5 \
  --modes plain hf_ckpt fsdp_hf_ckpt --cpu-profile $OUT/prof --out $OUT/hf_llama_profile.csv 2>&1 | grep -v -i warn
