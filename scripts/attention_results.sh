#!/usr/bin/env bash
# Issue 25's attention results on a GPU, in one command, each file written under $OUT (default /tmp/attention_results):
# CS336's leaderboard step (leaderboard.json), the GPT-block stack (gpt_blocks.json), the regime draw
# (attention_regime.json: the 40 shapes of the issue's regime listed below, as benchmarks/README.md gives them) and the op's seed-11 draw in
# bf16 and fp16 (attention_random.json, attention_random_fp16.json). About 8 minutes on the H200 from a cold Triton
# cache (the regime and the two draws about 6 of them). Run it right after the gate, on the gate's tree:
#   FUSELAB_REVISION=<commit> OUT=$OUT bash scripts/attention_results.sh
# Set ONLY to a space-separated subset (leaderboard gpt regime random) to run those alone.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attention_results}
ONLY=${ONLY:-leaderboard gpt regime random}
mkdir -p "$OUT"
REGIME=(
  11x4x2x2069x2069x64 3x32x8x6655x6655x80 42x8x2x694x694x128 26x8x8x1661x1661x96 22x8x4x613x613x128
  1x8x8x5179x5179x128 29x16x8x1715x1715x96 2x4x4x8699x8699x96 20x4x4x1344x1344x128 18x32x8x2102x2102x64
  1x16x4x11589x11589x128 14x2x2x2803x2803x128 12x8x2x1808x1808x64 8x32x8x4228x4228x64 3x32x8x4148x4148x96
  9x16x4x1550x1550x128 107x4x4x477x477x64 1x8x4x11820x11820x128 3x8x2x7371x7371x128 25x8x4x1717x1717x96
  1x16x4x11843x11843x96 14x4x4x3798x3798x128 3x4x4x5733x5733x64 107x2x2x256x256x64 21x8x8x423x423x80
  32x16x8x487x487x96 8x2x2x2477x2477x128 7x2x2x1454x1454x96 8x8x2x1298x1298x96 1x2x2x13805x13805x128
  15x4x2x3762x3762x64 15x16x4x1000x1000x64 2x8x2x13240x13240x64 10x8x8x1553x1553x80 3x8x8x2493x2493x80
  14x2x2x3793x3793x80 17x2x2x1914x1914x128 3x2x2x6711x6711x80 15x4x4x1295x1295x80 18x16x4x909x909x64
)
COMMON=(--backward --opt causal=true --rep-ms 40 --warmup-ms 20 --rounds 2 --call-cost-ms 0)
for part in $ONLY; do
  case $part in
    leaderboard) timeout 120 python3 benchmarks/leaderboard.py --out "$OUT/leaderboard.json" --rep-ms 300 \
      > "$OUT/leaderboard.log" 2>&1 ;;
    gpt) timeout 240 python3 benchmarks/gpt_blocks.py --out "$OUT/gpt_blocks.json" --rep-ms 300 > "$OUT/gpt.log" 2>&1 ;;
    regime) timeout 300 python3 -m fuselab bench attention $(printf -- "--shape %s " "${REGIME[@]}") "${COMMON[@]}" \
      --dtype bf16 --impl triton,sdpa-cudnn,sdpa-flash --out "$OUT/attention_regime.json" > "$OUT/regime.log" 2>&1 ;;
    random) for dt in bf16 fp16; do
        suffix=$([ "$dt" = fp16 ] && echo _fp16)
        timeout 200 python3 -m fuselab bench attention --shapes random:40 --seed 11 "${COMMON[@]}" --dtype "$dt" \
          --impl triton,sdpa-cudnn,sdpa-flash,sdpa-efficient --out "$OUT/attention_random$suffix.json" \
          > "$OUT/random_$dt.log" 2>&1
        echo "random $dt rc=$?"
      done ;;
    *) echo "unknown part $part (leaderboard gpt regime random)"; exit 2 ;;
  esac
  echo "$part rc=$?"
done
tail -n 6 "$OUT"/leaderboard.log "$OUT"/gpt.log 2>/dev/null
