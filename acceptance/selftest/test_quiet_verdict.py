"""`pytest -m gpu` lists no skip for a mode the command line did not choose: those tests are deselected and one
summary line says how to choose them; a real skip (no GPU here) stays a skip with its reason.

Runs pytest in a subprocess on the GPU test files with every GPU hidden (CUDA_VISIBLE_DEVICES=""), so nothing
trains even on a GPU machine: each GPU test is a real skip, and what is deselected is decided before any runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("acceptance/test_checkout.py", "acceptance/test_course_checklist.py")
REAL_SKIP = "needs 1 CUDA GPU(s), found 0"


def _pytest(*args: str) -> tuple[int, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-q", "-rs", *FILES, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def _counts(output: str) -> dict:
    """{'skipped': n, 'deselected': m, ...} from pytest's last line."""
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}


def test_checkout_tests_are_deselected_with_one_line_without_megatron_lm():
    code, out = _pytest("--no-fork-server")
    assert code == 0, out
    line = re.search(r"^bert-acceptance: (\d+) checkout-mode test\(s\) not selected: .* add --megatron-lm PATH "
                     r"to run them", out, re.M)
    assert line, out
    counts = _counts(out)
    assert counts.get("deselected") == int(line[1]) > 0, out
    skip_rows = [row for row in out.splitlines() if row.startswith("SKIPPED")]
    assert skip_rows and all(REAL_SKIP in row for row in skip_rows), skip_rows
    assert "opt-in" not in "\n".join(skip_rows) and "test_checkout.py" not in "\n".join(skip_rows), skip_rows
    assert "reference-trainer test(s) not selected" not in out, out


def test_reference_tests_are_deselected_with_one_line_in_checkout_mode(tmp_path):
    code, out = _pytest("--megatron-lm", str(tmp_path))
    assert code == 0, out
    line = re.search(r"^bert-acceptance: (\d+) reference-trainer test\(s\) not selected: --megatron-lm grades the "
                     r"checkout instead", out, re.M)
    assert line, out
    counts = _counts(out)
    assert counts.get("deselected") == int(line[1]) > 0, out
    skip_rows = [row for row in out.splitlines() if row.startswith("SKIPPED")]
    assert skip_rows and all(REAL_SKIP in row and "test_checkout.py" in row for row in skip_rows), skip_rows
    assert "checkout-mode test(s) not selected" not in out, out


def test_a_marker_expression_that_excludes_them_prints_no_line():
    """`-m "not gpu"` deselects the GPU tests itself: nothing is counted as a mode not chosen."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "not gpu", "-p", "no:cacheprovider", "-p",
                           "no:xdist", "-q", *FILES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 5, out  # pytest: no tests ran
    assert "not selected" not in out, out
