"""`python -m harness grade` on hostile and careless input: one bad submission never costs the others their grades,
nothing outside DIR is read, nothing outside OUT is written, OUT is the grader's alone, and the exit code says what
happened (0 passed, 1 failed, 2 interrupted, 3 grader error, 4 usage)."""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from harness.base.errors import Interrupted
from harness.cli import grade, grade_out
from harness.judge.grade_record import Grade
from harness.judge import criteria
from harness.evidence import mutants
from harness.report import plot
from harness.base.paths import RECORDED_LOGS, REPO, write_bytes_atomic
from harness.judge.profiles import load_profile

A = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()
B = (RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log").read_text()
SECRET = "TOP-SECRET-LINE-OUTSIDE-DIR"


def make(root: Path, logs: dict) -> Path:
    """DIR with one folder per name holding `train.log` with that text."""
    for name, text in logs.items():
        (root / name).mkdir(parents=True)
        (root / name / "train.log").write_text(text)
    return root


# the batches here are made from one recorded log, copies by construction: copy detection is test_copies.py's
def args(dir_: Path, out: Path | None, jobs: int = 1) -> argparse.Namespace:
    return argparse.Namespace(submissions=str(dir_), criteria="reference", out=str(out) if out else None,
                              jobs=jobs, no_progress=True, no_copy_detection=True)


def grades_of(out: Path) -> dict:
    return {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def cli(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "grade", *map(str, argv), "--no-progress",
                           "--no-copy-detection"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=_env())


# ---------------------------------------------------------------- exit codes and isolation

def test_all_passed_exits_0_and_a_failed_one_exits_1(tmp_path):
    """0 when every submission passed; 1 as soon as one failed (and the passing ones keep their grades)."""
    assert grade.main(args(make(tmp_path / "ok", {"alice": A, "bob": B}), tmp_path / "o1")) == grade.EXIT_PASSED
    dir_ = make(tmp_path / "mixed", {"alice": A, "carol": mutants.stopped_at(150)(A)})
    assert grade.main(args(dir_, tmp_path / "o2")) == grade.EXIT_FAILED
    assert {n: g["verdict"] for n, g in grades_of(tmp_path / "o2").items()} == {"alice": "pass", "carol": "fail"}


def test_an_exception_is_that_submissions_error_grade_and_exit_3(tmp_path, monkeypatch):
    """The grader crashing on one submission: that one is `error` with the reason, the others graded, exit 3."""
    real = grade.judge_one

    def crash_on_bob(task):
        if task.name == "bob":
            raise ValueError("boom in bob's log")
        return real(task)

    monkeypatch.setattr(grade, "judge_one", crash_on_bob)
    out = tmp_path / "out"
    assert grade.main(args(make(tmp_path / "dir", {"alice": A, "bob": A, "carol": B}), out)) == grade.EXIT_GRADER_ERROR
    grades = grades_of(out)
    assert [grades[n]["verdict"] for n in ("alice", "bob", "carol")] == ["pass", "error", "pass"]
    assert "ValueError: boom in bob's log" in grades["bob"]["diagnosis"]
    assert json.loads((out / "submissions" / "bob" / "grade.json").read_text())["verdict"] == "error"


@pytest.mark.parametrize("case", ["all-nan", "all-inf", "huge-numbers", "empty", "binary", "named-grades.json"])
def test_inputs_that_crashed_the_grader_are_graded(case, tmp_path):
    """Each input that once ended in a traceback for the whole batch is now one `fail` grade among `pass`es."""
    nan = A.replace("lm loss: ", "lm loss: nan | was: ").replace("validation lm loss", "x")
    logs = {"all-nan": nan, "all-inf": nan.replace("nan |", "inf |"), "huge-numbers": A.replace("E+00", "E+300"),
            "empty": "", "binary": os.urandom(4096).decode("latin-1"), "named-grades.json": "no log lines\n"}
    name = "grades.json" if case == "named-grades.json" else case
    dir_ = make(tmp_path / "dir", {"alice": A, name: logs[case]})
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_FAILED
    grades = grades_of(out)
    assert grades["alice"]["verdict"] == "pass" and grades[name]["verdict"] == "fail", grades[name]["diagnosis"]


def test_unusable_out_is_a_usage_error(tmp_path):
    """OUT that is a file, or under a file: exit 4 and one line naming --out, no traceback."""
    dir_ = make(tmp_path / "dir", {"alice": A})
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        done = cli(dir_, "--out", out, cwd=tmp_path)
        assert done.returncode == 4 and done.stderr.startswith("error: --out") and "Traceback" not in done.stderr, done


def test_jobs_n_writes_the_same_files_as_jobs_1(tmp_path):
    """--jobs 2 (worker processes) and --jobs 1 (in process) write byte-identical grades and pictures."""
    dir_ = make(tmp_path / "dir", {"alice": A, "bob": B, "carol": mutants.nan_at(120)(A), "dan": "junk\n",
                                   "erin": mutants.stopped_at(150)(A)})
    outs = [tmp_path / "one", tmp_path / "two"]
    assert [grade.main(args(dir_, out, jobs)) for out, jobs in zip(outs, (1, 2))] == [1, 1]
    files = [sorted(p.relative_to(o) for p in o.rglob("*") if p.is_file() and p.name != grade_out.LOCK) for o in outs]
    assert files[0] == files[1] and len(files[0]) > 10
    different = [str(f) for f in files[0] if (outs[0] / f).read_bytes() != (outs[1] / f).read_bytes()]
    assert not different, f"--jobs 2 wrote different {different}"


@pytest.mark.slow
@pytest.mark.parametrize("sig,jobs", [(signal.SIGINT, 1), (signal.SIGTERM, 2)], ids=["ctrl-c", "sigterm-jobs2"])
def test_interrupt_keeps_finished_grades_marked_incomplete(sig, jobs, tmp_path):
    """Interrupted after some grades: exit 2, every grades file valid, finished grades kept, the rest `incomplete`."""
    dir_ = make(tmp_path / "dir", {f"s{i:03d}": A for i in range(400)})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "grade", str(dir_), "--out", str(out), "--no-progress",
                             "--jobs", str(jobs)], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.glob("submissions/*/grade.json"))) < 3:
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == grade.EXIT_INTERRUPTED, (stdout, stderr[-3000:])
    grades = json.loads((out / "grades.json").read_text())
    verdicts = [g["verdict"] for g in grades]
    assert len(grades) == 400 and verdicts.count("pass") >= 3 and "incomplete" in verdicts, verdicts
    assert set(verdicts) <= {"pass", "incomplete"}
    assert "**INCOMPLETE**" in (out / "grades.md").read_text()
    assert len(list(csv.DictReader((out / "grades.csv").open()))) == 400
    import xml.etree.ElementTree as ET

    ET.parse(out / "grades-junit.xml")
    assert not list(out.rglob(".*.tmp*")), "a temporary file was left behind"


@pytest.mark.slow
def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_workers_die_with_a_killed_grader(tmp_path):
    """SIGKILL to the grader (nothing can be written then): its worker processes do not live on, waiting."""
    import psutil

    dir_ = make(tmp_path / "dir", {f"s{i:03d}": A for i in range(400)})
    proc = subprocess.Popen([sys.executable, "-m", "harness", "grade", str(dir_), "--out", str(tmp_path / "out"),
                             "--no-progress", "--jobs", "2"], cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "out").glob("submissions/*/grade.json")):
        time.sleep(0.05)
    workers = []
    while time.monotonic() < deadline and not workers:     # one forked worker per submission: between two, none
        workers = [w for w in psutil.Process(proc.pid).children() if _running(w)]   # not the killed, unreaped ones
    assert 1 <= len(workers) <= 2, workers
    proc.kill()
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)
    for worker in alive:
        worker.kill()
    assert not alive, f"workers {[w.pid for w in alive]} outlived the killed grader"


# ---------------------------------------------------------------- nothing outside DIR read, nothing outside OUT written

def test_symlinks_out_of_a_submission_are_refused(tmp_path):
    """A log linked to a file outside, a folder linked outside, a submission folder that is a link, a symlink loop:
    each refused with the reason in its grade; the outside file's text appears in no output."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text(A + SECRET + "\n")
    dir_ = make(tmp_path / "dir", {"alice": A})
    (dir_ / "mallory").mkdir()
    (dir_ / "mallory" / "train.log").symlink_to(outside / "secret.log")
    (dir_ / "trudy").mkdir()
    (dir_ / "trudy" / "train.log").write_text(A)
    (dir_ / "trudy" / "checkpoints").symlink_to(outside)
    (dir_ / "oscar").symlink_to(outside, target_is_directory=True)
    (dir_ / "peggy").mkdir()
    (dir_ / "peggy" / "train.log").write_text(A)
    (dir_ / "peggy" / "a.log").symlink_to("b.log")
    (dir_ / "peggy" / "b.log").symlink_to("a.log")
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_FAILED
    grades = grades_of(out)
    assert grades["alice"]["verdict"] == "pass"
    for name, says in (("mallory", "train.log is a symlink"), ("trudy", "checkpoints is a symlink"),
                       ("oscar", "the submission folder is a symlink"), ("peggy", ".log is a symlink to")):
        assert grades[name]["verdict"] == "fail" and grades[name]["diagnosis_id"] == "refused", grades[name]
        assert says in grades[name]["diagnosis"], grades[name]["diagnosis"]
        assert grades[name]["diagnosis"].startswith("refused: ") and "refused: refused" not in grades[name]["diagnosis"]
        assert name == "oscar" or "outside the submission's folder" in grades[name]["diagnosis"]
    assert "(or nowhere)" in grades["peggy"]["diagnosis"]
    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert SECRET.encode() not in written


def test_out_named_like_a_submission_holding_symlinks_writes_nothing_outside(tmp_path):
    """A student's folder named `grades` (the old default OUT) with links out: the default OUT is beside DIR now, so
    that student is graded (refused for its link) like any other and nothing is written through the link; an OUT
    that is (or is inside) a submission folder is a usage error."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    dir_ = make(tmp_path / "dir", {"alice": A, "grades": A})
    (dir_ / "grades" / "grades.md").symlink_to(victim)
    done = cli(dir_, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert json.loads((tmp_path / "dir-grades" / "grades.json").read_text())[1]["diagnosis_id"] == "refused"
    assert victim.read_text() == "keep me"
    for bad in (dir_ / "grades", dir_ / "alice" / "out"):
        done = cli(dir_, "--out", str(bad), cwd=tmp_path)
        assert done.returncode == 4 and "holds the submission folder" in done.stderr, done.stderr
    assert victim.read_text() == "keep me" and not (dir_ / "alice" / "out").exists()
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_FAILED
    assert grades_of(out)["grades"]["diagnosis_id"] == "refused" and victim.read_text() == "keep me"


def test_nothing_is_written_through_a_symlink_in_out(tmp_path):
    """A symlink planted in an earlier OUT (where a picture goes): that submission's grade is `error`, the target
    is untouched, the others are graded."""
    dir_ = make(tmp_path / "dir", {"alice": A, "bob": A})
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_PASSED
    target = tmp_path / "elsewhere"
    target.mkdir()
    (out / "submissions" / "bob" / "loss-curve.png").unlink()
    (out / "submissions" / "bob" / "grade.json").unlink()
    (out / "submissions" / "bob").rmdir()
    (out / "submissions" / "bob").symlink_to(target, target_is_directory=True)
    assert grade.main(args(dir_, out)) == grade.EXIT_GRADER_ERROR
    assert list(target.iterdir()) == [] and grades_of(out)["bob"]["verdict"] == "error"
    assert grades_of(out)["alice"]["verdict"] == "pass"


def test_outputs_never_collide_with_submission_names(tmp_path):
    """Submissions named like every output file and folder are graded, and every output is intact."""
    names = [*grade.OUTPUTS, grade.PER_SUBMISSION, "grades", grade_out.LOCK.lstrip("."), "a b|c", "-=cmd()"]
    out = tmp_path / "out"
    assert grade.main(args(make(tmp_path / "dir", {n: A for n in names}), out)) == grade.EXIT_PASSED
    assert set(grades_of(out)) == set(names)
    assert all((out / f).is_file() for f in grade.OUTPUTS)
    slots = {p.name for p in (out / grade.PER_SUBMISSION).iterdir()}
    assert len(slots) == len(names)


# ---------------------------------------------------------------- OUT: the grader's own, locked, cleaned

def test_rerun_removes_only_what_the_grader_wrote_earlier(tmp_path):
    """A removed student's folder and picture disappear from OUT on the next run; a file someone else put in OUT
    stays."""
    dir_ = make(tmp_path / "dir", {"alice": A, "bob": B})
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_PASSED
    (out / "notes.txt").write_text("the teacher's notes")
    (dir_ / "bob" / "train.log").unlink()
    (dir_ / "bob").rmdir()
    assert grade.main(args(dir_, out)) == grade.EXIT_PASSED
    assert not (out / "submissions" / "bob").exists() and (out / "submissions" / "alice" / "loss-curve.png").is_file()
    assert (out / "notes.txt").read_text() == "the teacher's notes"
    assert set(grades_of(out)) == {"alice"}


def test_an_earlier_out_inside_dir_is_not_graded(tmp_path):
    """The default OUT is DIR-grades beside DIR; an earlier run's grades folder moved into DIR is never graded as
    a submission: it is a `not-graded` row with its reason, and the exit is not 0."""
    dir_ = make(tmp_path / "dir", {"alice": A})
    assert grade.main(args(dir_, None)) == grade.EXIT_PASSED
    os.rename(tmp_path / "dir-grades", dir_ / "old-grades")
    assert grade.main(args(dir_, None)) == grade.EXIT_FAILED
    got = grades_of(tmp_path / "dir-grades")
    assert set(got) == {"alice", "old-grades"} and got["old-grades"]["diagnosis_id"] == "not-graded"
    assert "old-grades" in (tmp_path / "dir-grades" / "grades.md").read_text()


def test_a_second_run_into_a_locked_out_is_a_usage_error(tmp_path):
    """While a run holds OUT's lock, another run into that OUT exits 2 naming the lock, and writes nothing."""
    dir_ = make(tmp_path / "dir", {"alice": A})
    out = tmp_path / "out"
    assert grade.main(args(dir_, out)) == grade.EXIT_PASSED
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with open(out / grade_out.LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = cli(dir_, "--out", out, cwd=tmp_path)
    assert done.returncode == 4 and str(out / grade_out.LOCK) in done.stderr, done.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_csv_has_each_column_once(tmp_path):
    """The detected recipe is `detected_recipe`; `recipe` is the criterion's column only."""
    out = tmp_path / "out"
    grade.main(args(make(tmp_path / "dir", {"alice": A}), out))
    header = next(csv.reader((out / "grades.csv").open()))
    assert len(header) == len(set(header)) and "recipe" in header and "detected_recipe" in header, header
    row = next(csv.DictReader((out / "grades.csv").open()))
    assert (row["recipe"], row["detected_recipe"]) == ("pass", "a")


# ---------------------------------------------------------------- bounded memory and pictures

@pytest.mark.slow
def test_a_huge_log_is_judged_in_bounded_memory(tmp_path):
    """A 66 MB log (a 60 MB line, 16,000 iteration lines, 50,000 escape-coded lines) is parsed and judged
    with a peak far below its size; the picture draws at most plot.MAX_POINTS points."""
    line = next(li for li in A.splitlines() if " iteration " in li and "lm loss" in li)
    log = tmp_path / "huge.log"
    with log.open("w") as fh:
        fh.write(A)
        fh.write("x" * (60 << 20) + "\n")
        fh.writelines(line + "\n" for _ in range(16_000))
        fh.write("garbage \x1b[31m line\n" * 50_000)
    size = log.stat().st_size
    tracemalloc.start()
    try:
        ev = criteria.evidence_from_log_file(log)
        criteria.judge(load_profile("reference"), ev)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20 and peak < size / 1.3, (f"judging a {size >> 20} MB log peaked at {peak >> 20} MB: the log "
                                                   "is held whole somewhere; stream it (harness.evidence.logs.parse_items)")
    painter = plot.LossCurvePainter()
    assert painter.png(ev.log, None, "huge", "fail")[:4] == b"\x89PNG"
    fig, ax, artists, *_ = painter._figure(None)
    assert max(len(a.get_xdata()) for a in artists.values()) <= plot.MAX_POINTS


@pytest.mark.slow
def test_bench_grade_reports_its_rate(tmp_path, capsys):
    """`python -m harness bench grade -n 12`: every synthetic submission graded, the rate and the goal reported."""
    from harness.tools import bench_grade

    assert bench_grade.main(["-n", "12", "--jobs", "2", "--out", str(tmp_path / "bench.json")]) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["graded"] == 12 and result["exit_code"] == 1 and result["submissions_per_s"] > 0, result
    assert json.loads(capsys.readouterr().out) == result


def test_thin_keeps_first_last_and_at_most_the_limit():
    points = list(range(100_001))
    thinned = plot.thin(points, 2000)
    assert len(thinned) == 2000 and thinned[0] == 0 and thinned[-1] == 100_000 and thinned == sorted(thinned)
    assert plot.thin(points[:10], 2000) == points[:10]


# ---------------------------------------------------------------- an interrupt in the middle of writing the grades

def test_an_interrupt_during_an_interim_write_waits_for_the_write(tmp_path, monkeypatch):
    """SIGTERM that lands while the grades files are being replaced takes effect after the write, never inside it
    (an interrupt inside left `.grades-junit.xml.*` behind, and the final write then failed: exit 3, no grades)."""
    signal.signal(signal.SIGTERM, grade._on_stop_signal)
    try:
        batch = grade.Batch([grade.Task(0, str(tmp_path), "s", "s", str(tmp_path), "reference")], tmp_path,
                            load_profile("reference"), [])
        real = write_bytes_atomic

        def write_with_signal(path, data):
            os.kill(os.getpid(), signal.SIGTERM)     # arrives mid-write, as it did in CI
            return real(path, data)

        monkeypatch.setattr(grade, "write_bytes_atomic", write_with_signal)
        with pytest.raises(Interrupted):
            batch.add(batch.tasks[0], grade.Judged(grade.error_grade(batch.tasks[0], RuntimeError("x"))))
        assert (tmp_path / "grades-junit.xml").is_file(), "the write was cut short"
        assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_an_interrupted_atomic_write_leaves_nothing_and_never_blocks_the_next(tmp_path, monkeypatch):
    from harness.base import paths

    target = tmp_path / "grades.json"
    (tmp_path / f".grades.json.tmp{os.getpid()}").write_text("a leftover of a process killed mid-write")

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(paths.os, "fchmod", interrupted)
    with pytest.raises(KeyboardInterrupt):
        paths.write_text_atomic(target, "{}")
    assert not target.exists() and len(list(tmp_path.iterdir())) == 1, list(tmp_path.iterdir())
    monkeypatch.undo()
    paths.write_text_atomic(target, "[]")
    assert target.read_text() == "[]" and oct(target.stat().st_mode & 0o777) == "0o644"


def test_ctrl_c_just_after_the_temporary_file_is_made_waits_for_the_write(tmp_path, monkeypatch):
    """Ctrl-C landing after mkstemp made the temporary file but before its name came back (found under load: a
    `.grade.json.*.tmp` left in a submission's folder) takes effect once the file is written and renamed."""
    import tempfile

    from harness.base import paths

    real = tempfile.mkstemp

    def mkstemp_then_ctrl_c(*a, **k):
        made = real(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)    # Python raises KeyboardInterrupt at its next chance
        return made

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_ctrl_c)
    target = tmp_path / "grade.json"
    with pytest.raises(KeyboardInterrupt):
        paths.write_text_atomic(target, '{"verdict": "pass"}')
    assert target.read_text() == '{"verdict": "pass"}', "the write was cut short"
    assert list(tmp_path.iterdir()) == [target], "a temporary file was left behind"


def test_an_interrupt_a_library_turned_into_another_error_still_stops_the_batch(tmp_path, monkeypatch):
    """Ctrl-C inside matplotlib's C code comes back as SystemError ('... returned a result with an exception set'):
    it stops the batch (exit 2, the submission stays ungraded), it is never that submission's grader error."""
    task = grade.Task(0, str(tmp_path), "s", "s", str(tmp_path), "reference")

    def wrapped(task):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError("<built-in method draw_path> returned a result with an exception set") from exc

    monkeypatch.setattr(grade, "judge_one", wrapped)
    with pytest.raises(KeyboardInterrupt):
        grade.grade_safely(task)
    assert not (tmp_path / grade.PER_SUBMISSION).exists(), "an interrupted submission got a grade.json"

    def swallowed(task):            # the interrupt was swallowed and something else failed after it
        grade._STOP_REQUESTED.set()
        raise ValueError("a later error")

    monkeypatch.setattr(grade, "judge_one", swallowed)
    try:
        with pytest.raises(KeyboardInterrupt):
            grade.grade_safely(task)
    finally:
        grade._STOP_REQUESTED.clear()

    def broken(task):               # no interrupt anywhere: an ordinary grader error
        raise ValueError("broken")

    monkeypatch.setattr(grade, "judge_one", broken)
    assert grade.grade_safely(task).verdict == "error"


def test_atomic_leftovers_are_removed_and_nothing_else(tmp_path):
    """remove_atomic_leftovers deletes `.NAME.XXXXXXXX.tmp` files only: never a grade, a folder, or what a
    symlink of that name points to (the link itself goes)."""
    from harness.base.paths import remove_atomic_leftovers

    folder = tmp_path / "s001"
    folder.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    leftovers = [".grade.json.ab_12XYZ.tmp", ".loss-curve.png.q1w2e3r4.tmp"]
    kept = ["grade.json", ".grade.json.short.tmp", "grade.json.ab_12XYZ.tmp", ".x.abcdefgh.tmp.bak"]
    for name in leftovers + kept:
        (folder / name).write_text("x")
    (folder / ".dir.abcdefgh.tmp").mkdir()
    (folder / ".link.abcdefgh.tmp").symlink_to(outside)
    removed = sorted(p.name for p in remove_atomic_leftovers(folder))
    assert removed == sorted(leftovers + [".link.abcdefgh.tmp"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept + [".dir.abcdefgh.tmp"])
    assert outside.read_text() == "keep"
    assert remove_atomic_leftovers(tmp_path / "missing") == []


def _slow_temp(out) -> Path:
    return Path(out) / grade.PER_SUBMISSION / "slow" / ".loss-curve.png.k1ll3d00.tmp"


def _grade_or_hang(task):
    """Stands in for judge_one in a forked worker: `slow` hangs inside an atomic write,
    `quick` returns once that temporary file exists."""
    temp = _slow_temp(task.out)
    if task.slot == "slow":
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(b"half a png")
        time.sleep(600)            # killed here, between creating the temporary file and the rename
    deadline = time.monotonic() + 30
    while not temp.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return grade.Judged(Grade(task.name))


def test_a_worker_killed_mid_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Interrupted while a worker is inside an atomic write: the grader SIGKILLs its workers (a checkpoint may
    take minutes), which no deferral survives; it then removes what their writes left. (CI's script once found
    `.loss-curve.png.*.tmp` left by the SIGTERM test.)"""
    out = tmp_path / "out"

    def on_done(task, result):
        raise KeyboardInterrupt    # Ctrl-C reaches the grader as the first grade comes back

    monkeypatch.setattr(grade, "judge_one", _grade_or_hang)
    tasks = [grade.Task(i, str(tmp_path / n), n, n, str(out), "reference") for i, n in enumerate(("slow", "quick"))]
    with pytest.raises(KeyboardInterrupt):
        grade.run_tasks(tasks, 2, on_done)
    assert not _slow_temp(out).exists() and not list(out.rglob(".*.tmp")), list(out.rglob("*"))
