#!/bin/bash
# The replay of every real log on one H200 (python -m harness replay), from the repository root after the install:
# the real logs of fixtures/ (fp16, both recipes, log intervals 1-20, hidden 64, resumed, prefixed, releases
# 0.16.1-main), round 11's bf16 and fp32 runs and log intervals 7/13/3, 10 copies of one real log, and one whose
# seed was edited everywhere it is printed. Writes $OUT/replay.tgz: replay.json, replay.md, the console, and each
# replay run's own log (what the tolerances per precision are derived from: tools/replay_tolerance.py).
set -u
export PYTHONUNBUFFERED=1
T=/tmp/rp; B=$T/batch; rm -rf $T; mkdir -p $B
for f in fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log fixtures/logs/runs-h200/*.log.gz \
         fixtures/logs/runs-h200-round11/*.log.gz fixtures/logs/population/*.log.gz; do
  n=$(basename "$f"); n=${n%.gz}; n=${n%.log}; n=${n%.[12]}; mkdir -p "$B/$n"; cp "$f" "$B/$n/"; done
for i in 01 02 03; do mkdir -p $B/copy-$i; cp fixtures/logs/runs-h200/core_v0.16.1-plain-s1234.log.gz $B/copy-$i/; done
mkdir -p $B/forged-seed77 && zcat fixtures/logs/runs-h200/core_v0.16.1-plain-s1234.log.gz | sed -e 's/^\(  seed \.*\) 1234$/\1 77/' \
  -e 's/setting random seeds to 1234 /setting random seeds to 77 /' -e 's/random_seed=1234,/random_seed=77,/' > $B/forged-seed77/train.log
s=$(date +%s)
timeout ${REPLAY_TIMEOUT:-200} python3 -m harness replay $B --out $T/out --jobs 32 --device cuda > $T/replay-stdout.txt 2>&1
echo "replay rc=$? wall_s=$(( $(date +%s) - s )) submissions=$(ls $B | wc -l)" | tee -a $T/replay-stdout.txt
cd $T && tar czf $OUT/replay.tgz replay-stdout.txt out/replay.json out/replay.md $(ls out/runs/*/replay-*.log 2>/dev/null) 2>/dev/null
ls -la $OUT
