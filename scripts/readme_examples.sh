#!/usr/bin/env bash
# Run every `fuselab ...` line of the README's usage block, in a scratch folder with the README's mymodule.py, and
# print each one's wall time and exit status (what the README says of the CPU: every example but the report within
# a minute). GPU-only examples exit 2 with their reason on a CPU; `bench` exits 1 when no case could be measured
# there (attention's CUDA backends), `--compare` when a case regressed.
#   bash scripts/readme_examples.sh [FUSELAB]      (default: .venv/bin/fuselab, else python3 -m fuselab from src/)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${1:-}" ]; then FUSELAB=($1)
elif [ -x "$ROOT/.venv/bin/fuselab" ]; then FUSELAB=("$ROOT/.venv/bin/fuselab")
else FUSELAB=(python3 -m fuselab); export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"; fi
WORK=$(mktemp -d)
cd "$WORK" || exit 1
# the README's mymodule.py: the python block after the usage block
awk '/^```python/{on=1; next} /^```/{if (on) exit} on' "$ROOT/README.md" > mymodule.py
awk '/^```bash/{n++} n==2 && /^fuselab /' "$ROOT/README.md" | sed 's/ *#.*$//' | while read -r line; do
  read -ra args <<< "${line#fuselab }"
  t0=$(date +%s.%N)
  timeout 600 "${FUSELAB[@]}" "${args[@]}" > out.txt 2>&1 < /dev/null
  rc=$?
  printf "%7.1f s  exit %d  %s\n" "$(echo "$(date +%s.%N) - $t0" | bc)" "$rc" "$line"
  [ "$rc" -ne 0 ] && tail -1 out.txt | cut -c1-160 | sed 's/^/          /'
done
echo "scratch folder: $WORK"
