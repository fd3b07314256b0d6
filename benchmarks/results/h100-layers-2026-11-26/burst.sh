#!/bin/bash
# One-GPU layer timings of validation rows' tensor-parallel ranks (benchmarks/time_layers.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/simulator PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv | tee $OUT/h100_layers.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a $OUT/h100_layers.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -l 1 > $OUT/clocks.csv &
SMI=$!
run() { echo "== $*" | tee -a $OUT/h100_layers.txt; timeout 120 python3 benchmarks/time_layers.py "$@" --repeats 10 2>&1 | tee -a $OUT/h100_layers.txt; }
run MEGREADME-H100-01 --tp 1
run MEGREADME-H100-02 --tp 2 --layers 8
run MEGREADME-H100-03 --tp 4 --layers 8
run MEGREADME-H100-04 --tp 8 --layers 8
run MEGREADME-H100-07 --tp 8 --layers 8
run MEGREADME-H100-09 --tp 8 --layers 4
run MLPERF-v3.0-NVIDIA-n512 --tp 4 --layers 8
run MBRIDGE-2511-H100-01 --tp 8 --layers 4
run selene-gpt3 --tp 8 --layers 8 --set system=eos
kill $SMI
