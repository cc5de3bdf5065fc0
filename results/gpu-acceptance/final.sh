#!/bin/bash
# The last GPU check of a session's committed code on one H200, from the repository root (wheels in .whl/):
# `pytest -m gpu` in a fresh process, then the opt-in `pytest -m compare` (the Megatron-LM / Hugging Face comparison
# checked by acceptance/test_compare_hf.py). Writes $OUT/final.tgz (both outputs, the JUnit files, machine.txt with
# the code's fingerprint: the SHA-1 over the sorted SHA-1s of harness/, acceptance/, fixtures/, conftest.py,
# pyproject.toml).
set -u
export PYTHONUNBUFFERED=1
T=/tmp/final; mkdir -p $T
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e ".[test]" pydantic > $T/pip.txt 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,sys;print(torch.__version__,torch.version.cuda,sys.version.split()[0])"
  (find harness acceptance fixtures conftest.py pyproject.toml -type f ! -path "*/__pycache__/*" | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
} > $T/machine.txt 2>&1
s=$(date +%s); python3 -m pytest -m gpu -p no:cacheprovider --run-dir=$T/run --junitxml=$T/junit-gpu.xml > $T/pytest-gpu.txt 2>&1
echo "pytest-gpu rc=$? wall_s=$(( $(date +%s) - s ))" >> $T/rc.txt
s=$(date +%s); timeout ${COMPARE_TIMEOUT:-300} python3 -m pytest -m compare -p no:cacheprovider -q -rA acceptance/test_compare_hf.py --junitxml=$T/junit-compare.xml > $T/pytest-compare.txt 2>&1
echo "pytest-compare rc=$? wall_s=$(( $(date +%s) - s ))" >> $T/rc.txt
cat $T/rc.txt; tail -2 $T/pytest-gpu.txt
tar czf $OUT/final.tgz -C $T machine.txt rc.txt pytest-gpu.txt junit-gpu.xml pytest-compare.txt junit-compare.xml pip.txt 2>/dev/null
