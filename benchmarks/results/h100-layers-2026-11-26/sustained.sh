#!/bin/bash
# Sustained version: many repeats, so the board reaches its power limit (clock logged).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/simulator PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > $OUT/clocks_sustained.csv &
SMI=$!
run() { echo "== $(date +%T.%N) $*" | tee -a $OUT/h100_layers_sustained.txt; timeout 150 python3 benchmarks/time_layers.py "$@" 2>&1 | tee -a $OUT/h100_layers_sustained.txt; echo "== end $(date +%T.%N)" | tee -a $OUT/h100_layers_sustained.txt; }
run MEGREADME-H100-01 --tp 1 --repeats 200
run MEGREADME-H100-04 --tp 8 --layers 8 --repeats 300
run MEGREADME-H100-07 --tp 8 --layers 8 --repeats 150
run MLPERF-v3.0-NVIDIA-n512 --tp 4 --layers 8 --repeats 150
run selene-gpt3 --tp 8 --layers 8 --repeats 250 --set system=eos
run MBRIDGE-2511-H100-01 --tp 8 --layers 4 --repeats 80
kill $SMI
