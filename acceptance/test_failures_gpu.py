"""CUDA out of memory provoked for real on the GPU, capped to an 8 GB card, then the course's remedy on the same cap.

The cap is the trainer's --memory-cap-gb (torch.cuda.set_per_process_memory_fraction), so an H200 behaves like the
course's minimum card. The two runs (harness/run/runs.py FAILURE_RUNS) train in the session beside the reference run.
The OOM configuration cannot fit: with --seq-length 512 and --micro-batch-size 512 the lm head's logits alone are
512 x 512 x 30592 (padded vocab) x 2 bytes (fp16) = 16.0 GB, twice the cap. The remedy (--micro-batch-size 2, same
sequences, same cap) needs 2/512 of that: 63 MB.
"""

from __future__ import annotations

import pytest

from harness.evidence.diagnose import COURSE_OOM_REMEDY, diagnose
from harness.run.launch import current_pids
from harness.evidence.logs import parse_log_file

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def capped_runs(gpu_session, settings):
    """The OOM run and the remedy run of this session."""
    if settings.skip_mutants:
        pytest.skip("--skip-mutants: the failure-mode runs were not trained")
    outcomes = {name: gpu_session.outcomes.get(name) for name in ("oom-8gb", "oom-8gb-remedy")}
    missing = [name for name, o in outcomes.items() if o is None or o.stage is None]
    if missing:
        pytest.skip(f"not run in this session: {missing}")
    return {"oom": outcomes["oom-8gb"].stage, "remedy": outcomes["oom-8gb-remedy"].stage}


def test_oom_is_diagnosed_with_the_course_remedy(capped_runs):
    """micro-batch 512 x 512 tokens under an 8 GB cap dies of CUDA OOM, diagnosed with the course's remedy."""
    r = capped_runs["oom"]
    assert not r.ok and not r.timed_out, f"expected an OOM failure, got: {r.headline()}\n{r.failure_message()}"
    found = diagnose(r.name, r.returncode, r.log_path.read_text(errors="replace"), duration_s=r.duration_s,
                     argv=r.argv)
    assert found is not None and found.cause_id == "cuda-oom", r.failure_message()
    assert COURSE_OOM_REMEDY in r.failure_message(), r.failure_message()


def test_course_remedy_fits_the_same_cap(capped_runs):
    """--micro-batch-size 2 with the same sequences and cap trains to the end (fp16: no loss logged yet)."""
    r = capped_runs["remedy"]
    assert r.ok, r.failure_message()
    logged = [record.iteration for record in parse_log_file(r.log_path).iterations]
    assert logged and logged[-1] == 4, f"iteration lines: {logged}; log {r.log_path}"


def test_no_process_outlives_its_run(capped_runs):
    """Neither run leaves a process behind (the OOM'd trainer's checkpoint helpers included)."""
    alive = {name: sorted(current_pids(r)) for name, r in capped_runs.items() if current_pids(r)}
    assert not alive, f"still running after their stage ended: {alive}"
