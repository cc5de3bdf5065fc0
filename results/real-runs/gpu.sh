#!/bin/bash
# Run on the GPU machine from the repository root (the release tarballs in .megatron/tars/, wheels in .whl/):
# real Megatron-LM runs of fixtures/population/plan-evidence.toml on core_v0.16.1 and one run of
# plan-releases.toml on each later release, all at once on one GPU. Writes $OUT/logs.tgz, $OUT/kept.tgz,
# $OUT/records.tgz, $OUT/console.txt.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]" pydantic > $OUT/console.txt 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/console.txt
for t in core_v0.15.3 core_v0.16.1 core_v0.17.1 core_v0.18.2 core_v0.19.0 main; do
  mkdir -p .megatron/$t && tar xzf .megatron/tars/$t.tar.gz -C .megatron/$t; done
W=/tmp/w; mkdir -p $W
python3 -m harness calibrate runs --megatron-lm .megatron/core_v0.16.1 --plan fixtures/population/plan-evidence.toml ${ONLY:+--only $ONLY} \
  --out $W/evidence --jobs 21 --budget-s 470 > $W/evidence.txt 2>&1 &
for t in ${RELEASES-core_v0.15.3 core_v0.17.1 core_v0.18.2 core_v0.19.0 main}; do
  python3 -m harness calibrate runs --megatron-lm .megatron/$t --plan fixtures/population/plan-releases.toml \
    --out $W/release-$t --jobs 1 --budget-s 470 > $W/release-$t.txt 2>&1 &
done
wait
tail -n 3 $W/*.txt >> $OUT/console.txt
cd $W
tar czf $OUT/logs.tgz */logs
tar czf $OUT/kept.tgz $(ls -d */kept 2>/dev/null)
tar czf $OUT/records.tgz */records.json *.txt
