"""Every command that inspects a submitted checkpoint (`python -m harness grade`, `python -m harness inspect`,
`pytest -m gpu --from-log L --checkpoint-dir C`) runs on a --save folder with a pickle payload planted in one of
its files: grade and the inspector's main() on every planted file, pytest on one file of each checkpoint format and
the call it makes (judge_submission) on every one. The payload's marker must never appear, and the grade names the
refused class. (Its own file, apart from the in-process readers: these subprocesses are the slow part, and a second
worker takes them.)"""

from __future__ import annotations

import json
import sys

import pytest

from harness.base.paths import REPO
from hostile_checkpoints import PLANTED, REFUSED_BY_NAME, make_planted, no_marker, run_here

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    """One submission per planted file, the recorded good log beside its --save folder, and one marker each."""
    return make_planted(tmp_path_factory.mktemp("hostile"), tmp_path_factory.mktemp("markers"))


@pytest.mark.slow
def test_grade_never_runs_a_payload(planted, tmp_path):
    """`python -m harness grade`: every planted submission graded, unsafe ones refused by class, no marker."""
    out = tmp_path / "grades"
    done = run_here([sys.executable, "-m", "harness", "grade", str(planted["dir"]), "--out", str(out), "--no-progress",
                 "--jobs", "2"], cwd=tmp_path)
    no_marker(planted, "python -m harness grade")
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-3000:])
    grades = {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}
    for where, (folder, _, _) in planted["cases"].items():
        g = grades[folder.name]
        assert g["verdict"] == "fail", g
        checkpoint = next(c for c in g["criteria"] if c["id"] == "checkpoint-loads")
        if where in REFUSED_BY_NAME:
            assert "refused: unsafe content" in checkpoint["message"] and "system" in checkpoint["message"], checkpoint


@pytest.mark.slow
def test_checkpoint_inspector_cli_never_runs_a_payload(planted, tmp_path):
    """`python -m harness inspect C --no-load` on the .metadata payload, then every planted folder with
    and without --no-load through the same main(), here in the test's own process (a payload run would leave its
    marker all the same)."""
    import contextlib
    import io

    from harness.evidence.checkpoints.inspector import main

    save = planted["cases"][".metadata"][1]
    done = run_here([sys.executable, "-m", "harness.evidence.checkpoints.inspector", str(save), "--no-load"], cwd=tmp_path)
    no_marker(planted, "python -m harness inspect --no-load")
    assert done.returncode == 1 and "refused: unsafe content" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    codes = {}
    for where, (_, saved, _) in planted["cases"].items():
        for extra in ([], ["--no-load"]):
            with contextlib.redirect_stdout(io.StringIO()):
                codes[where, bool(extra)] = main([str(saved), *extra])
    no_marker(planted, "harness.evidence.checkpoints.inspector.main (with and without --no-load)")
    assert set(codes.values()) <= {0, 1}, codes    # an inspection's verdict, never a crash


# One checkpoint of each format through the real command (a torch_dist save with its payload in .metadata, a legacy
# torch save with its payload in model_optim_rng.pt): the wiring from --checkpoint-dir to the inspector. Each fresh
# pytest imports torch (3-4 s of CPU here), so the other planted files go through the same call in-process below.
PYTEST_CLI_CASES = (".metadata", "model_optim_rng.pt")


@pytest.mark.slow
@pytest.mark.parametrize("where", PYTEST_CLI_CASES)
def test_pytest_from_log_never_runs_a_payload(where, planted, tmp_path):
    """`pytest -m gpu --from-log L --checkpoint-dir C`: the checkpoint criterion fails, the payload never runs."""
    folder, save, _ = planted["cases"][where]
    done = run_here([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-k", "checkpoint",
                 "--from-log", str(folder / "train.log"), "--checkpoint-dir", str(save)], cwd=REPO)
    no_marker(planted, f"pytest --from-log --checkpoint-dir (payload in {where})")
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-2000:])
    assert "refused: unsafe content" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("where", PLANTED)
def test_judging_a_log_with_its_checkpoints_never_runs_a_payload(where, planted):
    """What `pytest --from-log L --checkpoint-dir C` calls (judge_submission), here: checkpoint-loads fails, the
    payload never runs, and a file that is unpickled at all is refused by name."""
    from harness.judge.profiles import FAIL, load_profile
    from harness.plugin.options import DEFAULT_PROFILE
    from harness.judge.submission import judge_submission

    folder, save, _ = planted["cases"][where]
    verdicts = {v.criterion_id: v for v in judge_submission(load_profile(DEFAULT_PROFILE), folder / "train.log", save).verdicts}
    no_marker(planted, f"judge_submission(log, checkpoints) (payload in {where})")
    loads = verdicts["checkpoint-loads"]
    assert loads.status == FAIL, loads
    if where in REFUSED_BY_NAME:
        assert "refused: unsafe content" in loads.message and "system" in loads.message, loads.message
