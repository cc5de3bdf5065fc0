"""The example batch (results/grading-example/) cannot go stale: its committed submissions
(results/grading-example/submissions-in/: real logs from fixtures/, gzipped, and one checkpoint's small files) are
graded by the user's command into a temporary OUT, and every committed output under results/grading-example/grades/
is compared with what that run wrote, file by file, both ways (a file only one side has fails).

Only what must vary is normalised: the repository's absolute path and the temporary OUT's (none is expected: the
command is run with relative paths, as docs/grading.md writes it), the grader's time and versions in a grades.json
header, and a PNG's metadata (the pictures are compared pixel by pixel). The fix when it fails is the one-line
command of docs/grading.md, REGENERATE below, then a look at `git diff results/grading-example/`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "results" / "grading-example"
SUBMISSIONS = EXAMPLE / "submissions-in"
GRADES = EXAMPLE / "grades"
REGENERATE = ("python -m harness grade results/grading-example/submissions-in --out results/grading-example/grades "
              "--no-progress")
NOT_OUTPUTS = {".bert-grades.lock", ".gitignore"}     # the lock a run holds; the file that keeps the lock out of git
VARYING_KEYS = {"time", "written_at", "harness_version", "torch_version", "megatron_core_version", "python_version"}


def _grade_into(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness", "grade", str(SUBMISSIONS.relative_to(ROOT)), "--out", str(out),
           "--no-progress", "--jobs", "2"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}, timeout=600)


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name not in NOT_OUTPUTS}


def _normalised_text(text: str, out: Path) -> str:
    for path, name in ((str(out), "OUT"), (str(ROOT), "ROOT")):
        text = text.replace(path, name)
    return text


def _drop_varying(value):
    if isinstance(value, dict):
        return {k: "<varies>" if k in VARYING_KEYS else _drop_varying(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_drop_varying(v) for v in value]
    return value


def _pixels(path: Path):
    from matplotlib import image

    return image.imread(path)


@pytest.fixture(scope="module")
def regraded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("example") / "grades"
    proc = _grade_into(out)
    assert proc.returncode == 1, f"grade exited {proc.returncode} (1 expected: some fail): {proc.stderr[-2000:]}"
    return out


def test_the_submissions_are_committed_and_small():
    """The batch is real input (logs, a resumed pair, a checkpoint's small files), a few MB at most."""
    folders = sorted(p.name for p in SUBMISSIONS.iterdir() if p.is_dir())
    assert len(folders) >= 12, folders
    assert all(any(f.is_file() for f in (SUBMISSIONS / name).rglob("*")) for name in folders), "a folder without files"
    size = sum(p.stat().st_size for p in SUBMISSIONS.rglob("*") if p.is_file())
    assert size < 5_000_000, f"{size} bytes: the example batch must stay small"
    assert len(list((SUBMISSIONS / "resumed-b").glob("*.log.gz"))) == 2
    assert (SUBMISSIONS / "with-checkpoint" / "ckpt" / "latest_checkpointed_iteration.txt").is_file()
    assert any(not re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in folders), "no hostile folder name"


def test_every_committed_output_is_what_grading_the_submissions_writes(regraded):
    committed, fresh = _files(GRADES), _files(regraded)
    assert committed == fresh, (f"only committed: {sorted(committed - fresh)}; only written now: "
                                f"{sorted(fresh - committed)}. Regenerate: {REGENERATE}")
    stale = []
    for rel in sorted(committed):
        old, new = GRADES / rel, regraded / rel
        if rel.endswith(".png"):
            a, b = _pixels(old), _pixels(new)
            same = a.shape == b.shape and (a == b).all()
        elif rel.endswith(".json") or rel == ".bert-grades":
            same = (_drop_varying(json.loads(_normalised_text(old.read_text(encoding="utf-8"), regraded)))
                    == _drop_varying(json.loads(_normalised_text(new.read_text(encoding="utf-8"), regraded))))
        else:
            same = (_normalised_text(old.read_text(encoding="utf-8"), regraded)
                    == _normalised_text(new.read_text(encoding="utf-8"), regraded))
        if not same:
            stale.append(rel)
    assert not stale, f"stale example outputs: {stale}. Regenerate: {REGENERATE}"


def test_the_example_grades_are_the_ones_its_documentation_promises(regraded):
    """Not all `no-log`: each kind of submission gets the verdict and root cause it was put there to show."""
    data = json.loads((regraded / "grades.json").read_text())
    grades = {g["submission"]: g for g in (data["grades"] if isinstance(data, dict) else data)}
    assert not [n for n, g in grades.items() if g["diagnosis_id"] == "no-log"]
    for name in ("good-a", "good-b", "resumed-b"):
        assert grades[name]["verdict"] == "pass", (name, grades[name]["failed"])
    expected = {"nan": "nan", "killed-at-130": "killed-by-signal", "literal-command": "no-save", "copy-1": "log-copy",
                "copy-2": "log-copy", "lr-times-100": "recipe-deviation", "te-import": "transformer-engine"}
    assert {n: grades[n]["diagnosis_id"] for n in expected} == expected
    assert grades["with-checkpoint"]["save_dir"], "the checkpoint folder was not found"
    assert (regraded / "submissions" / "nan" / "loss-curve.png").is_file()


def test_the_readme_picture_exists():
    for doc in (ROOT / "README.md", ROOT / "docs" / "grading.md"):
        for target in re.findall(r"\]\(([^)]*grading-example[^)]*\.png)\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).resolve().is_file(), f"{doc.name} shows {target}, which does not exist"
