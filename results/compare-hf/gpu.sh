#!/usr/bin/env bash
# The measured run behind docs/megatron-vs-hf.md: `python -m harness compare-hf` with the course's full configuration
# (4 layers, hidden 128, 8 heads, sequences of 128, 16 per step, 200 iterations, fp16) on one H200: the reference
# trainer (CUDA graph, and again eager), the Hugging Face side (NSP, and again on SOP pairs), one after the other.
#
# From the repository root, after
#   python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]"
# Files back in $OUT (7): compare/compare.json, compare/compare.md, compare/compare.png, compare/megatron-vs-hf.md,
# compare-hf.log (the command's output), compare-runs.tar.gz (every run's log and summary, no checkpoints or data)
# and pytest-compare.txt (`pytest -m compare`: the same comparison again, checked by acceptance/test_compare_hf.py;
# PYTEST_COMPARE=0 leaves it out).
# Then, here: copy compare.json, compare.md and compare.png to results/compare-hf/ and regenerate the page from the
# committed JSON:
#   python -m harness compare-hf --from-json results/compare-hf/compare.json --out results/compare-hf \
#       --page docs/megatron-vs-hf.md
set -uo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
RUNS=/tmp/compare-hf-runs
rm -rf "$RUNS" "$OUT/compare"
mkdir -p "$OUT/compare"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/compare-hf.log" 2>&1
python3 -m harness compare-hf --out "$OUT/compare" --run-dir "$RUNS" --hf-sop --megatron-eager 2>&1 \
    | tee -a "$OUT/compare-hf.log"
status=${PIPESTATUS[0]}
tar -czf "$OUT/compare-runs.tar.gz" -C "$RUNS" --exclude=checkpoints --exclude='checkpoint-*' --exclude=data \
    --exclude=index-cache --exclude=tokenizer --exclude='*.pt' --exclude='*.safetensors' .
echo "compare-hf exited $status" | tee -a "$OUT/compare-hf.log"
if [ "${PYTEST_COMPARE:-1}" != 0 ]; then
    python3 -m pytest -m compare -p no:cacheprovider -q -rA acceptance/test_compare_hf.py >"$OUT/pytest-compare.txt" 2>&1
    pytest_status=$?
    echo "pytest -m compare exited $pytest_status" | tee -a "$OUT/compare-hf.log"
    [ "$pytest_status" = 0 ] || status=$pytest_status
fi
exit "$status"
