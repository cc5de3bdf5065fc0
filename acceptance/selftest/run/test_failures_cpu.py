"""Every documented failure, provoked for real on CPU through run_stage: bounded, no orphans, the right diagnosis.

The table is harness.run.failures.FAILURES. All entries run concurrently in one module fixture (most fail within
seconds of their imports); each test then judges one entry's StageResult.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from harness.run import failures

from harness.base import paths
from harness.evidence.diagnose import diagnose
from harness.run.launch import KILL_GRACE_S, StageResult, StageSpec, current_pids, run_stage

pytestmark = pytest.mark.slow

SLACK_S = 5.0  # a stage's own limit, plus the kill grace, plus this: thread scheduling on a loaded 2-core machine

# Failures the suite provokes correctly but harness.evidence.diagnose does not name yet (none at present); each reason
# names the missing rule. strict: the day the rule lands, the XPASS says to delete the entry.
KNOWN_GAPS: dict[str, str] = {}


@dataclass(frozen=True)
class Provoked:
    """One failure: the stage that was run and how it ended."""

    failure: failures.Failure
    spec: StageSpec
    result: StageResult


# Provoked through what an interpreter reads as it starts (a sitecustomize on PYTHONPATH hiding megatron-core;
# CUDA_VISIBLE_DEVICES): always a fresh process. The others are forked from the pre-imported server, as
# `pytest -m gpu` starts its stages (a command the server cannot fork starts fresh anyway).
FRESH_INTERPRETER = frozenset({"megatron-core-missing", "no-gpu"})


def _provoke(failure: failures.Failure, inputs: failures.Inputs, spawner) -> Provoked:
    """Build the failure's inputs and run its stage."""
    inputs.root.mkdir(parents=True)
    spec = failure.provoke(inputs)
    spawner = None if failure.name in FRESH_INTERPRETER else spawner
    return Provoked(failure, spec, run_stage(spec, inputs.root, spawner=spawner))


@pytest.fixture(scope="module")
def provoked(tmp_path_factory, cpu_fork_server) -> dict[str, Provoked]:
    """Every failure of the table, run concurrently, by name."""
    data = failures.healthy_dataset(tmp_path_factory.getbasetemp() / "healthy-dataset")
    root = tmp_path_factory.mktemp("failures")
    spawn = lambda argv, env, cwd: cpu_fork_server.spawn(argv, env, cwd)  # noqa: E731
    with ThreadPoolExecutor(max_workers=len(failures.FAILURES)) as pool:
        jobs = [pool.submit(_provoke, f, failures.Inputs(root / f.name, paths.VOCAB_FILE, data), spawn)
                for f in failures.FAILURES]
        return {job.result().failure.name: job.result() for job in jobs}


def _cases(with_gaps: bool) -> list:
    """Table entries as pytest params (a list, not a generator); known diagnosis gaps as strict xfails."""
    return [pytest.param(f.name, marks=_gap_marks(f.name) if with_gaps else [], id=f.name) for f in failures.FAILURES]


def _gap_marks(name: str) -> list:
    """A strict xfail for a known diagnosis gap, else nothing."""
    gap = KNOWN_GAPS.get(name)
    return [pytest.mark.xfail(reason=gap, strict=True)] if gap else []


def _diagnosis_lines(message: str) -> str:
    """The 'likely cause [...]' and 'remedy:' lines of a failure message."""
    return "\n".join(line for line in message.splitlines() if re.match(r"(likely cause \[|remedy: )", line))


def test_table_covers_the_documented_failures():
    """The table has every failure mode docs/MEASURED.md names, once each."""
    names = [f.name for f in failures.FAILURES]
    assert len(names) == len(set(names)), names
    causes = {f.expected_cause_id for f in failures.FAILURES}
    assert causes >= {"not-json", "missing-text-key", "vocab-missing", "vocab-wrong", "empty-split",
                      "one-sentence-docs", "no-gpu", "megatron-core-missing", "old-api", "timeout",
                      "data-missing"}, causes


@pytest.mark.parametrize("name", _cases(with_gaps=True))
def test_failure_is_diagnosed(provoked, name):
    """The failure message names the expected cause and carries its cause and remedy text."""
    p = provoked[name]
    r = p.result
    found = diagnose(r.name, r.returncode, r.log_path.read_text(errors="replace"), timed_out=r.timed_out,
                     stalled=r.stalled, duration_s=r.duration_s, argv=r.argv)
    message = r.failure_message()
    assert found is not None and found.cause_id == p.failure.expected_cause_id, (
        f"{name}: expected diagnosis {p.failure.expected_cause_id!r}, got {found and found.cause_id!r}\n{message}")
    told = _diagnosis_lines(message)
    missing = [text for text in p.failure.expected_text if text not in told]
    assert not missing, f"{name}: cause/remedy lack {missing}:\n{told}"


@pytest.mark.parametrize("name", _cases(with_gaps=False))
def test_failure_fails_in_bounded_time(provoked, name):
    """The stage failed, and only the hang needed its timeout; nothing ran past limit + kill grace."""
    p = provoked[name]
    r = p.result
    assert not r.ok, f"{name}: the stage succeeded, the failure was not provoked\n{r.failure_message()}"
    assert r.timed_out == (p.failure.expected_cause_id == "timeout"), f"{name}: {r.headline()}"
    limit = p.spec.timeout_s + KILL_GRACE_S + SLACK_S
    assert r.duration_s <= limit, f"{name}: took {r.duration_s:.1f} s, limit {limit:g} s"


@pytest.mark.parametrize("name", _cases(with_gaps=False))
def test_failure_leaves_no_process(provoked, name):
    """No process of the failed stage's tree is alive afterwards."""
    r = provoked[name].result
    assert r.pids_seen, f"{name}: no process was ever seen (stage not started?)"
    alive = sorted(current_pids(r))
    assert not alive, f"{name}: pids {alive} of {r.pids_seen} still alive after the stage ended"
