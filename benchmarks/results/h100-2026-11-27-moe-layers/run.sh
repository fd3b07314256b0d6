#!/bin/bash
# The two device calls of this folder: `run.sh 1` (MoE layers, a dense reference, the
# scatter permutation, profiles) and `run.sh 2` (the gather permutation beside the
# scatter one, profiles). The device ran them as two files (run.sh and run2.sh) with
# this same prelude; they are one file since. Run from the repository root with the
# wheels of llmsim's missing dependencies in .whl/. Extra arguments are appended to
# every case (a CPU dry run: --device cpu --layers 1 --shrink 16 --repeats 1
# --set training.seq_len=256).
call=$1; shift
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/simulator${EXTRA_PATH:+:$EXTRA_PATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe-layers-out}; mkdir -p "$OUT"
PY=${PY:-python3}
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > "$OUT/clocks.csv" &
  SMI=$!
fi
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/env.txt"
log=$OUT/moe_layers.txt
run() { echo "== $(date +%T.%N) $*" | tee -a "$log"; timeout 150 $PY benchmarks/time_layers.py "$@" 2>&1 | tee -a "$log"; echo "== end $(date +%T.%N)" | tee -a "$log"; }
if [ "$call" = 1 ]; then
  run MEGREADME-H100-04 --tp 8 --layers 8 --repeats 300 "$@"   # the dense reference of 2026-11-26
  run MBRIDGE-2604-MOE-02 --ep 16 --layers 48 --repeats 100 "$@"
  run MBRIDGE-2604-MOE-02 --ep 1 --layers 8 --repeats 60 "$@"
  run MBRIDGE-2604-MOE-02 --ep 1 --layers 4 --repeats 60 --set model=mixtral-8x7b --set parallelism.ep=1 --set parallelism.dp=16 "$@"
  run MBRIDGE-2604-MOE-02 --ep 16 --layers 4 --repeats 20 --profile "$OUT/profile_moe02_ep16.txt" "$@"
  run MBRIDGE-2604-MOE-02 --ep 1 --layers 2 --repeats 10 --profile "$OUT/profile_moe02_ep1.txt" "$@"
else
  run MEGREADME-H100-04 --tp 8 --layers 8 --repeats 150 "$@"   # the dense reference of 2026-11-26
  run MBRIDGE-2604-MOE-02 --ep 16 --layers 48 --repeats 100 --permute gather "$@"
  run MBRIDGE-2604-MOE-02 --ep 16 --layers 48 --repeats 60 --permute scatter "$@"
  run MBRIDGE-2604-MOE-02 --ep 16 --layers 4 --repeats 20 --permute gather --profile "$OUT/profile_moe02_ep16_gather.txt" "$@"
  run MBRIDGE-2604-MOE-02 --ep 1 --layers 2 --repeats 10 --permute gather --profile "$OUT/profile_mixtral_ep1_gather.txt" --set model=mixtral-8x7b --set parallelism.ep=1 --set parallelism.dp=16 "$@"
  run MBRIDGE-2604-MOE-02 --ep 1 --layers 8 --repeats 40 --permute gather "$@"
fi
[ -n "$SMI" ] && kill $SMI
exit 0
