#!/bin/bash
# Real Megatron-LM core_v0.16.1 runs of fixtures/population/plan-round11.toml (bf16 and fp32 in both recipes, log
# intervals 7, 13, 3), all at once on one GPU; from the repository root, after the install (wheels in .whl/, the
# release tarball in .megatron/tars/). Writes $OUT/round11.tgz: each run's log, the records and the console.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
W=/tmp/r11; mkdir -p $W
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]" pydantic > $W/pip.txt 2>&1
test -d .megatron/core_v0.16.1/megatron || { mkdir -p .megatron/core_v0.16.1 && tar xzf .megatron/tars/core_v0.16.1.tar.gz -C .megatron/core_v0.16.1; }
s=$(date +%s)
python3 -m harness calibrate runs --megatron-lm .megatron/core_v0.16.1 --plan fixtures/population/plan-round11.toml \
  --out $W/round11 --jobs 15 --budget-s ${BUDGET_S:-270} > $W/round11.txt 2>&1
echo "round11 rc=$? wall_s=$(( $(date +%s) - s ))" >> $W/round11.txt
tail -n 5 $W/round11.txt
cd $W && tar czf $OUT/round11.tgz round11/logs round11/records.json round11.txt pip.txt 2>/dev/null
ls -la $OUT
