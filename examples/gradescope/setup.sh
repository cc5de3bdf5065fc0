#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu). It installs the suite from the
# autograder zip (made by make_autograder_zip.sh: this file and run_autograder at the zip's root, the suite under
# bert-acceptance/) into a virtual environment at /autograder/venv. No GPU: the CPU build of torch, pinned like
# the suite's CI (.ci/run), installed first so nothing pulls a multi-GB CUDA build.
set -euo pipefail

SUITE=/autograder/source/bert-acceptance
VENV=/autograder/venv
TORCH_VERSION=2.13.0

# bert-acceptance needs Python >= 3.11 (tomllib); Ubuntu 22.04 images have 3.10, 24.04 images have 3.12
PYTHON=""
for candidate in python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
        PYTHON=$candidate
        break
    fi
done
if [ -z "$PYTHON" ]; then
    apt-get install -y python3.11 python3.11-venv
    PYTHON=python3.11
fi
"$PYTHON" -m venv --help >/dev/null 2>&1 || apt-get install -y "${PYTHON}-venv"
"$PYTHON" -m venv "$VENV"

"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
"$VENV/bin/python" -m pip install -q -e "$SUITE"
# the environment table in the image's build log: torch, megatron-core, the vocab file
"$VENV/bin/python" -m harness doctor --cpu-only || true
