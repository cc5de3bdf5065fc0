#!/bin/bash
# `pytest -m gpu` side by side on one H200: the committed code and 13328bc (the code before issue 38), each in a
# fresh process, alternated twice (old, new, old, new) so neither gets a warmer machine. From the repository root,
# with the wheels in .whl/ and `git archive 13328bc` in .megatron/old/13328bc.tar.gz. Writes $OUT/side-by-side.txt
# (one line per run: which, rc, pytest's own summary line, wall ms), $OUT/junit-gpu.xml and the last new run's
# report, and $OUT/logs.tgz with every run's output.
set -u
export PYTHONUNBUFFERED=1
O=$OUT; T=/tmp/g; mkdir -p $T /tmp/old
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]" pydantic > $T/pip.txt 2>&1
tar xzf .megatron/old/13328bc.tar.gz -C /tmp/old
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,sys;print(torch.__version__,torch.version.cuda,sys.version.split()[0])"
  git log -1 --format=%H 2>/dev/null || true
  (find harness acceptance fixtures conftest.py pyproject.toml -type f ! -path "*/__pycache__/*" | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
} > $O/machine.txt 2>&1
one() {  # which dir run-dir extra-args...
  which=$1; dir=$2; rd=$3; shift 3
  s=$(date +%s%N)
  (cd $dir && PYTHONPATH=$dir python3 -m pytest -m gpu -p no:cacheprovider --run-dir=$rd "$@") > $T/$which.txt 2>&1
  rc=$?
  echo "$which rc=$rc wall_ms=$(( ($(date +%s%N) - s) / 1000000 )) | $(grep -E '^=+ .*(passed|failed|error).* in ' $T/$which.txt | tail -1)" >> $O/side-by-side.txt
}
R=$PWD
for round in $(seq 1 ${ROUNDS:-2}); do
  one old-13328bc-$round /tmp/old $T/old$round -p no:bert-acceptance
  one new-$round $R $T/new$round --keep-run --junitxml=$O/junit-gpu.xml
done
cp $T/new2/*/report.md $T/new2/*/report.json $O/ 2>/dev/null || find $T/new2 -maxdepth 3 -name 'report.*' -exec cp {} $O/ \;
cat $O/side-by-side.txt
# the timeline of one session (where the time goes): python -m harness bench suite --skip-mutants
[ -n "${SKIP_BENCH:-}" ] || { s=$(date +%s); timeout 240 python3 -m harness bench suite --skip-mutants --out $O/bench-suite-skip-mutants-h200.json > $T/bench-suite.txt 2>&1
echo "bench-suite rc=$? wall_s=$(( $(date +%s) - s ))" >> $O/side-by-side.txt; }
tar czf $O/logs.tgz -C $T old-13328bc-1.txt old-13328bc-2.txt new-1.txt new-2.txt pip.txt bench-suite.txt 2>/dev/null
