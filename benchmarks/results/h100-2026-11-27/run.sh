#!/bin/bash
# One-GPU microbenchmarks of 2026-11-27 (H100 SXM5): fused attention (flash and cuDNN),
# MoE expert GEMMs (grouped, looped, batched; BF16 and FP8), FP8 cast kernels and launch
# cost. Run from a folder holding this script and benchmarks/{gpu_timing,time_attention,
# time_grouped_gemms,time_fp8_casts}.py; writes to $OUT (default ./out).
cd "$(dirname "$0")" || exit 1
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.max.mem,driver_version,memory.total --format=csv
  python3 -c "import torch; p = torch.cuda.get_device_properties(0); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), p.name, p.multi_processor_count, 'SMs')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 > "$OUT/clocks.csv" 2>&1 &
SMI=$!
run() { local limit=$1; shift; echo "== $(date -u +%T) $*"; timeout "$limit" python3 "$@"; echo "== end $(date -u +%T) rc=$?"; }
{
  run 150 time_attention.py --out "$OUT/attention.csv"
  run 90 time_grouped_gemms.py --out "$OUT/grouped_gemms.csv"
  run 45 time_fp8_casts.py --out "$OUT/fp8_casts.csv"
} 2>&1 | tee "$OUT/run.log"
kill $SMI
