#!/bin/bash
# The GPU check of the committed code, on one H200, from the repository root (wheels in .whl/, release tarballs in
# .megatron/tars/). In order: `pytest -m gpu` in a fresh process (its wall time alone), the replay of 51 submissions
# with the reference trainer, then the release matrix (checkout mode on every release at once). Everything it
# writes comes back as $OUT/*.
set -u
export PYTHONUNBUFFERED=1
O=$OUT; T=/tmp/g; mkdir -p $T
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]" pydantic > $T/pip.txt 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,sys;print(torch.__version__,torch.version.cuda,sys.version.split()[0])"
  (find harness acceptance fixtures conftest.py pyproject.toml -type f ! -path "*/__pycache__/*" | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
} > $O/machine.txt
step() { name=$1; shift; s=$(date +%s%N); "$@" > $T/$name.txt 2>&1; rc=$?; echo "$name rc=$rc wall_ms=$(( ($(date +%s%N) - s) / 1000000 ))" >> $O/rc.txt; }
# 1. the README's command
step pytest-gpu python3 -m pytest -m gpu -p no:cacheprovider --run-dir $T/run --keep-run --junitxml=$O/junit-gpu.xml
[ -n "${ONLY_PYTEST:-}" ] && { tar czf $O/logs.tgz -C $T pytest-gpu.txt pip.txt; exit 0; }
# 2. replay: 40 real logs, 10 copies of one, one whose seed was edited everywhere it is printed
B=$T/replay-batch; mkdir -p $B
for f in fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log fixtures/logs/runs-h200/*.log.gz \
         fixtures/logs/population/*.log.gz fixtures/failures/real-h200/*.log.gz results/checkout/train-*.log.gz; do
  n=$(basename "$f"); n=${n%.gz}; n=${n%.log}; n=${n%.[12]}; mkdir -p "$B/$n"; cp "$f" "$B/$n/"; done
for i in $(seq -w 1 10); do mkdir -p $B/copy-$i; cp fixtures/logs/runs-h200/core_v0.16.1-plain-s1234.log.gz $B/copy-$i/; done
mkdir -p $B/forged-seed77 && zcat fixtures/logs/runs-h200/core_v0.16.1-plain-s1234.log.gz | sed -e 's/^\(  seed \.*\) 1234$/\1 77/' \
  -e 's/setting random seeds to 1234 /setting random seeds to 77 /' -e 's/random_seed=1234,/random_seed=77,/' > $B/forged-seed77/train.log
step replay timeout 120 python3 -m harness replay $B --out $T/replay-out --jobs 26 --device cuda
cp $T/replay-out/replay.json $T/replay-out/replay.md $T/ 2>/dev/null
# 3. the release matrix
for t in core_v0.14.0 core_v0.15.3 core_v0.16.1 core_v0.17.1 core_v0.18.2 core_v0.19.0 main; do
  test -d .megatron/$t/megatron || { mkdir -p .megatron/$t && tar xzf .megatron/tars/$t.tar.gz -C .megatron/$t; }; done
step matrix timeout 290 python3 -m harness matrix --checkouts .megatron --releases core_v0.14.0 core_v0.15.3 --timeout 270 --out $T/mx
cp $T/mx/matrix.md $T/mx/matrix.json $O/ 2>/dev/null
tar czf $O/matrix-artifacts.tgz -C $T/mx artifacts 2>/dev/null
tar czf $O/logs.tgz -C $T pytest-gpu.txt replay.txt matrix.txt pip.txt replay.json replay.md \
  $(cd $T && ls run/*/report.md run/*/report.json 2>/dev/null | head -4) 2>/dev/null
ls -la $O
