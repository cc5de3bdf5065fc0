"""`pytest -m gpu` lists no skip for a mode the command line did not choose: those tests are deselected and one
summary line says how to choose them.

Runs pytest in a subprocess on the GPU test files with every GPU hidden (CUDA_VISIBLE_DEVICES=""), so nothing
trains even on a GPU machine. Without a GPU a `-m gpu` session stops red (plugin/test_no_gpu_is_red.py), so what is
deselected is read from a listing (--collect-only), decided before any test runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.base.paths import REPO

ROOT = Path(__file__).resolve().parents[3]
FILES = ("acceptance/test_checkout.py", "acceptance/test_course_checklist.py")


def _pytest(*args: str) -> tuple[int, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-n", "0",
                           "-q", "--co", *FILES, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def _counts(output: str) -> dict:
    """{'selected': n, 'deselected': m} from the listing's last line ("18/43 tests collected (25 deselected)")."""
    last = output.strip().splitlines()[-1]
    m = re.search(r"(\d+)/(\d+) tests? collected \((\d+) deselected\)", last)
    assert m, output[-2000:]
    return {"selected": int(m[1]), "collected": int(m[2]), "deselected": int(m[3])}


def _listed(output: str) -> list[str]:
    return [row for row in output.splitlines() if "::" in row]


def test_checkout_tests_are_deselected_with_one_line_without_megatron_lm():
    code, out = _pytest("--no-fork-server")
    assert code == 0, out
    line = re.search(r"^bert-acceptance: (\d+) checkout-mode test\(s\) not selected: .* add --megatron-lm PATH "
                     r"to run them", out, re.M)
    assert line, out
    submitted = re.search(r"^bert-acceptance: (\d+) test\(s\) of submitted logs not selected: .* add --from-log",
                          out, re.M)
    assert submitted and int(submitted[1]) == 2, out   # log-provenance and log-consistent judge handed-in logs only
    counts = _counts(out)
    assert counts["deselected"] == int(line[1]) + int(submitted[1]) and int(line[1]) > 0, out
    listed = _listed(out)
    assert len(listed) == counts["selected"] > 0 and not any("test_checkout.py" in row for row in listed), listed
    assert "reference-trainer test(s) not selected" not in out, out


def test_reference_tests_are_deselected_with_one_line_in_checkout_mode(tmp_path):
    code, out = _pytest("--megatron-lm", str(tmp_path))
    assert code == 0, out
    line = re.search(r"^bert-acceptance: (\d+) reference-trainer test\(s\) not selected: --megatron-lm grades the "
                     r"checkout instead", out, re.M)
    assert line, out
    counts = _counts(out)
    assert counts["deselected"] == int(line[1]) > 0, out
    listed = _listed(out)
    assert listed and all("test_checkout.py" in row for row in listed), listed
    assert "checkout-mode test(s) not selected" not in out, out


def test_a_marker_expression_that_excludes_them_prints_no_line():
    """`-m "not gpu"` deselects the GPU tests itself: nothing is counted as a mode not chosen."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "not gpu", "-p", "no:cacheprovider", "-n",
                           "0", "-q", *FILES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 5, out  # pytest: no tests ran
    assert "not selected" not in out, out


def _plain(*args: str) -> str:
    """pytest -n auto (as a contributor runs the self-tests in parallel) with every GPU hidden; its output."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "auto", *args], cwd=ROOT,
                          env=env,
                          capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def test_self_tests_run_in_workers_and_a_gpu_session_in_one_process():
    """-n auto starts workers for the CPU self-tests; `-m gpu` (and its modes) stays in this one process, where
    the session trains once; an explicit -n N with GPU tests is a usage error naming the fix."""
    workers = _plain("-m", "not gpu", "acceptance/selftest/house/test_layering.py", "-k", "rooms")
    cores = len(os.sched_getaffinity(0))
    assert re.search(rf"^created: {cores + 1}/{cores + 1} workers$", workers, re.M), workers   # one spare worker
    for mode in ((), ("--from-log", "fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log")):
        alone = _plain("-m", "gpu", "--no-fork-server", "acceptance/test_course_checklist.py", *mode)
        assert "workers" not in alone and re.search(r"^collected \d+ items", alone, re.M), alone
    refused = _plain("-m", "gpu", "-n", "2", "acceptance/test_course_checklist.py")
    assert "ERROR: -n 2: the GPU session trains once per pytest process" in refused, refused


def test_one_worker_more_than_the_cores():
    from harness.plugin.pytest_plugin import self_test_workers

    assert [self_test_workers(c) for c in (None, 1, 2, 16)] == [2, 2, 3, 17]


def test_files_are_scheduled_longest_first_each_in_its_own_order():
    """With `-n auto --dist loadfile` the files go out by their recorded seconds, longest first; a file with no
    record counts as long when it holds a slow test, as short otherwise; within a file the collection order stays."""
    import types

    from harness.plugin import pytest_plugin

    def item(path, *marks):
        return types.SimpleNamespace(path=Path("/r") / path, keywords=set(marks), name=f"{path}:{len(marks)}")

    # a file named on the command line from outside the repository: no record of its own, whatever its name
    outside = types.SimpleNamespace(path=Path("/elsewhere/a.py"), keywords=set(), name="outside")
    items = [item("a.py"), item("b.py"), item("b.py", "slow"), item("c.py"), item("d.py", "slow"), item("a.py"),
             item("e.py"), item("new_slow.py", "slow"), item("new.py"), outside]
    pytest_plugin.longest_files_first(items, {"a.py": 3.0, "b.py": 1.5, "c.py": 40.0, "d.py": 12.0, "e.py": 3.0},
                                      Path("/r"))
    assert [(i.path.name, sorted(i.keywords)) for i in items] == [
        ("new_slow.py", ["slow"]), ("c.py", []), ("d.py", ["slow"]), ("a.py", []), ("a.py", []), ("e.py", []),
        ("b.py", []), ("b.py", ["slow"]), ("new.py", []), ("a.py", [])]
    assert items[-1] is outside


def test_xdist_hands_out_the_files_in_our_order(pytestconfig):
    """xdist's own reordering (by number of tests per file) is off in a self-test session, and every recorded file
    still exists (a renamed file would lose its place silently)."""
    import json

    assert pytestconfig.option.loadscopereorder is False
    recorded = json.loads((Path(__file__).parents[1] / "durations.json").read_text())
    assert recorded and all((REPO / path).is_file() for path in recorded), [p for p in recorded
                                                                           if not (REPO / p).is_file()]


def test_no_self_test_needs_a_gpu():
    """A `-m gpu` session does not collect acceptance/selftest/ (conftest.pytest_ignore_collect): a GPU test put
    there would silently never run. GPU tests live in acceptance/ itself."""
    import re

    marked = [f"{p.name}:{n}" for p in sorted(Path(__file__).parents[1].rglob("*.py"))
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"mark\.(multi)?gpu\b", line) and not line.lstrip().startswith("#") and p != Path(__file__)]
    assert not marked, f"GPU-marked tests under acceptance/selftest/ (move them to acceptance/): {marked}"


def test_a_gpu_session_skips_collecting_the_self_tests_unless_named(tmp_path):
    """`pytest -m gpu` never imports the self-test modules; named on the command line, they are collected."""
    # every GPU hidden: nothing here depends on the count, and counting would import torch in each pytest
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "CUDA_VISIBLE_DEVICES": ""}
    run = lambda *args: subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",  # noqa: E731
                                        "--co", "-q", *args], cwd=REPO, env=env, capture_output=True, text=True,
                                       timeout=120)
    everything = run()
    assert "acceptance/selftest/" not in everything.stdout and "acceptance/test_nvml_gpu.py" in everything.stdout, (
        everything.stdout[-2000:])
    named = run("acceptance/selftest/run/test_gpumem.py")
    assert "deselected" in named.stdout and "error" not in named.stdout.lower(), named.stdout[-2000:]


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_gpus_hidden_count_zero_without_importing_torch(hidden):
    """CUDA_VISIBLE_DEVICES hiding every device: the GPU count is 0 and torch is never imported
    for the count (each such pytest saved ~2 s)."""
    code = "import sys, conftest; print(conftest._gpu_count(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": hidden})
    assert done.stdout.split() == ["0", "False"], (done.stdout, done.stderr[-2000:])
