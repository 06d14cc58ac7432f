#!/bin/bash
# one GPU call: tests + tuner warm-up in parallel, tuner timing, then the benchmark
export PYTHONPATH=src PYTHONUNBUFFERED=1 FUSELAB_EXT_DIR=/tmp/fuselab-ext
T0=$(date +%s)
P="python -m pytest -q -m gpu tests/ops/test_attention.py -p no:cacheprovider -rf"
timeout 170 $P -k "head_dims and bf16" > /tmp/t1.log 2>&1 &
timeout 170 $P -k "head_dims and fp16" > /tmp/t2.log 2>&1 &
timeout 170 $P -k "head_dims and fp32" > /tmp/t3.log 2>&1 &
timeout 170 $P -k "not head_dims" > /tmp/t4.log 2>&1 &
for d in 64 128; do for c in yes no; do
  timeout 150 python -m fuselab.ops.attention.tune --warm --dtype bf16 --d $d --causal $c > /tmp/w$d$c.log 2>&1 &
done; done
wait
echo "parallel phase done at $(( $(date +%s) - T0 )) s"
for f in /tmp/t1.log /tmp/t2.log /tmp/t3.log /tmp/t4.log /tmp/w*.log; do echo "== $f"; tail -25 $f; done > $OUT/tests.log
timeout 80 python -m fuselab.ops.attention.tune --dtype bf16 --d 64 --d 128 --out $OUT/tune_trials.json > $OUT/tune.log 2>&1
echo "tune done at $(( $(date +%s) - T0 )) s"
cp src/fuselab/ops/attention/plans/*.json $OUT/ 2>/dev/null
timeout $(( 330 - ($(date +%s) - T0) )) python benchmarks/attention_gpu.py --check-dtypes bf16 --out $OUT/attention_dev.json > $OUT/bench.log 2>&1
echo "bench done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/bench.log
