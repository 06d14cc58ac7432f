# fuselab.nn.GELU() tracing F.gelu in place of the formula (the patch here), on an H100 or H200, one device call of
# about 3-4 min (OUT and FUSELAB_REVISION from the call; device timeout 300):
#   bash pending/gelu-traced-builtin/time_it.sh
# First its GPU tests (the compiled one-token block launches what torch.nn's launches), then the feed-forward block
# at one token (benchmarks/mlp_calls.py: each impl's end-to-end time over torch.nn's, side by side, 15 rounds);
# at 6c1d982 on an H100 impl auto took 1.18x [1.15, 1.22] under max-autotune-no-cudagraphs, forward
# (benchmarks/results/h100_80gb_hbm3/mlp_calls.json). Keep the patch if its tests pass and that cell comes to 1.05x
# or less without another getting worse; then `git am` it and gate.
export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
patch -p1 -s < pending/gelu-traced-builtin/*.patch || exit 2
timeout 150 python3 -m pytest -q -m gpu tests/nn/test_modules.py -p no:cacheprovider 2>&1 | tail -3
echo "tests done $(( $(date +%s) - T0 )) s"
timeout "${T_MLP:-170}" python3 benchmarks/mlp_calls.py --modes default,max-autotune-no-cudagraphs --tokens 1 \
  --budget-ms 150 --out "$OUT/mlp_calls_traced_builtin.json" > "$OUT/mlp_calls_traced_builtin.log" 2>&1
echo "mlp_calls rc=$? $(( $(date +%s) - T0 )) s"; grep -E "^ +[0-9]+ +(eager|default|max)" "$OUT/mlp_calls_traced_builtin.log"
