"""Issue 42 (untrusted submissions, third round): replay, matrix --from-runs and grade-checkouts' copy read a
submission only through a bounded worker or the audited reader, and what a submission holds is a row, never a
traceback or another submission's loss."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from argparse import Namespace
from pathlib import Path

import pytest

from harness.base.paths import FIXTURES
from harness.cli import replay

COURSE_LOG = replay.COURSE_LOG


def _args(root, out, **kw):
    base = dict(submissions=str(root), out=str(out), jobs=2, device="cpu", timeout_s=60.0, trainer_arg=[],
                time_limit=60.0, memory_limit=3072)
    return Namespace(**{**base, **kw})


@pytest.fixture
def no_trainer(monkeypatch):
    """No corpus built and no trainer started: a replay that gets as far as starting one fails the test."""
    started = []
    monkeypatch.setattr(replay, "_data", lambda out, recipe: Path(out) / "data" / f"corpus-{recipe}")
    monkeypatch.setattr("harness.run.launch.run_stage", lambda spec, run_dir, *a, **k: started.append(spec) or
                        pytest.fail(f"a trainer was started: {spec.argv}"))
    return started


def _with_argument(text: str, name: str, value: str) -> str:
    import re

    new, n = re.subn(rf"(?m)^(\s*{name} \.+ ).*$", lambda m: m.group(1) + value, text, count=1)
    assert n == 1, name
    return new


# ---------------------------------------------------------------- replay


def test_a_symlinked_log_is_a_refusal_row_and_the_others_are_replayed_rows(tmp_path, no_trainer, capsys):
    root = tmp_path / "subs"
    (root / "linked").mkdir(parents=True)
    (root / "linked" / "train.log").symlink_to(COURSE_LOG)
    (root / "big").mkdir()
    (root / "big" / "train.log").write_text(_with_argument(COURSE_LOG.read_text(), "hidden_size", "4096"))
    rc = replay.main(_args(root, tmp_path / "out"))
    rows = {r["submission"]: r for r in json.loads((tmp_path / "out" / "replay.json").read_text())}
    assert set(rows) == {"linked", "big"}
    assert rows["linked"]["status"] == "not-replayed" and rows["linked"]["text"].startswith("refused:"), rows
    assert "symlink" in rows["linked"]["text"]
    assert rows["big"]["status"] == "not-replayed" and "parameters" in rows["big"]["text"], rows["big"]
    assert "over 4x the course's run" in rows["big"]["text"]
    assert rc == 0 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("name,value", [("hidden_size", "4096"), ("num_layers", "96"), ("train_iters", "100000000"),
                                        ("seq_length", "65536"), ("micro_batch_size", "4096"),
                                        ("global_batch_size", "1600000"), ("eval_iters", "1000000"),
                                        ("hidden_size", "1e20"), ("num_layers", "0"), ("hidden_size", "-4"),
                                        ("ffn_hidden_size", "nan")])
def test_a_run_over_the_bound_never_starts_a_trainer(name, value):
    """The bound is checked from the arguments block before any trainer starts, on every size the trainer takes."""
    course = replay._course_arguments()
    assert replay.bound_problems(course, course) == []
    got = replay.bound_problems({**course, name: value}, course)
    assert got, (name, value)


def test_every_real_course_log_is_within_the_bound():
    """The bound refuses no real run of the course's recipes (fixtures/logs: the recorded runs)."""
    from harness.evidence.logs import parse_log_file

    course = replay._course_arguments()
    logs = sorted((FIXTURES / "logs").glob("core_*.log*"))
    assert logs
    for path in logs:
        arguments = parse_log_file(path).arguments
        if arguments:
            assert replay.bound_problems(arguments, course) == [], path


def test_a_log_that_parses_for_minutes_costs_only_its_own_row(tmp_path, no_trainer):
    """40 M short lines in a ~100 KB .log.gz: its worker's time budget ends it; every other row is there."""
    root = tmp_path / "subs"
    (root / "slow").mkdir(parents=True)
    with gzip.open(root / "slow" / "train.log.gz", "wb", compresslevel=9) as fh:
        chunk = b"x\n" * (1 << 20)
        for _ in range(40):
            fh.write(chunk)
    assert (root / "slow" / "train.log.gz").stat().st_size < 200_000
    (root / "big").mkdir()
    (root / "big" / "train.log").write_text(_with_argument(COURSE_LOG.read_text(), "hidden_size", "4096"))
    started = time.monotonic()
    replay.main(_args(root, tmp_path / "out", time_limit=4.0))
    assert time.monotonic() - started < 40
    rows = {r["submission"]: r for r in json.loads((tmp_path / "out" / "replay.json").read_text())}
    assert set(rows) == {"slow", "big"}
    assert rows["slow"]["status"] == "not-replayed", rows["slow"]
    assert "parameters" in rows["big"]["text"], rows["big"]


def test_each_submission_has_its_own_slot():
    names = ["a b", "a_b", "a:b", "Alice", "alice", ".", "..", "x" * 300, "\udcff"]
    got = replay.slots(names)
    assert len({s.lower() for s in got}) == len(names)
    assert all(s.strip(".") and "/" not in s and len(s) < 140 for s in got)


def test_two_folders_whose_names_sanitise_alike_get_two_rows(tmp_path, no_trainer):
    root = tmp_path / "subs"
    for name in ("a b", "a_b"):
        (root / name).mkdir(parents=True)
        (root / name / "train.log").write_text(_with_argument(COURSE_LOG.read_text(), "hidden_size", "4096"))
    replay.main(_args(root, tmp_path / "out"))
    rows = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert sorted(r["submission"] for r in rows) == ["a b", "a_b"]
    assert len({r["slot"] for r in rows}) == 2


@pytest.mark.parametrize("where", ["DIR", "inside DIR", "a submission", "inside a submission"])
def test_out_is_never_a_students_folder(tmp_path, no_trainer, where, capsys):
    root = tmp_path / "subs"
    (root / "alice").mkdir(parents=True)
    shutil.copy(COURSE_LOG, root / "alice" / "train.log")
    out = {"DIR": root, "inside DIR": root / "replays", "a submission": root / "alice",
           "inside a submission": root / "alice" / "out"}[where]
    before = sorted(p.name for p in (root / "alice").iterdir())
    assert replay.main(_args(root, out)) == 4      # a usage error (harness.cli.args: pytest's 4)
    assert "--out" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "alice").iterdir()) == before


# ---------------------------------------------------------------- matrix --from-runs

MALFORMED = ["not json {", "[]", "5", '{"matrix": 5}', '{"matrix": [5]}', '{"checkout": "x"}',
             '{"runs": [{"verdicts": [{"id": "checkpoints-saved"}]}]}', '{"runs": 7}', '{"runs": [{"verdicts": [3]}]}',
             '{"matrix": [{"stage": "train", "adaptations": 4}]}', '{"checkout": {"version": {"a": 1}}}',
             '{"matrix": [{"stage": "train", "detail": {"x": [1]}}]}']


@pytest.mark.parametrize("body", MALFORMED)
def test_one_malformed_report_is_that_rows_error_never_the_tables(tmp_path, body):
    from harness.cli import matrix

    runs = tmp_path / "m" / "runs"
    for name, text in (("core_v0.16.1", body), ("core_v0.17.1", json.dumps({"checkout": {"version": "0.17.1"}}))):
        (runs / name / "megatron-lm").mkdir(parents=True)
        (runs / name / "megatron-lm" / "report.json").write_text(text)
    args = Namespace(from_runs=str(tmp_path / "m"), out=str(tmp_path / "m"), only=None, releases=[], compare=None,
                     tolerance=0.0, checkouts=None, megatron_lm_tarballs=None)
    rc = matrix.main(args)
    text = (tmp_path / "m" / "matrix.md").read_text()
    assert "| core_v0.17.1 | 0.17.1 |" in text
    assert "core_v0.16.1" in text
    assert rc in (0, 3)
    if rc == 3:
        assert "not judged" in text


def test_matrix_md_escapes_html_and_pipes_from_a_report(tmp_path):
    from harness.cli import matrix

    runs = tmp_path / "m" / "runs" / "core_v0.16.1" / "megatron-lm"
    runs.mkdir(parents=True)
    (runs / "report.json").write_text(json.dumps({
        "checkout": {"version": "<img src=x onerror=alert(1)>|x", "git_commit": "<b>|</b>"},
        "matrix": [{"stage": "train", "outcome": "fail", "detail": "<script>alert(1)</script> | a | b\x1b[31m",
                    "adaptations": []}]}))
    args = Namespace(from_runs=str(tmp_path / "m"), out=str(tmp_path / "m"), only=None, releases=[], compare=None,
                     tolerance=0.0, checkouts=None, megatron_lm_tarballs=None)
    matrix.main(args)
    text = (tmp_path / "m" / "matrix.md").read_text()
    assert "<" not in text and ">" not in text and "\x1b" not in text
    row = next(line for line in text.splitlines() if line.startswith("| core_v0.16.1"))
    import re

    cells = re.split(r"(?<!\\)\|", row)[1:-1]
    assert len(cells) == 3 + len(matrix.STAGES) + 4 - 1, row       # no cell split by a quoted `|`


# ---------------------------------------------------------------- grade-checkouts' copy


def _checkout(tmp_path) -> Path:
    src = tmp_path / "co"
    (src / "megatron" / "core").mkdir(parents=True)
    (src / "megatron" / "core" / "__init__.py").write_text("x = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "inner").symlink_to("megatron/core")
    return src


def test_the_copy_keeps_files_modes_and_inside_links(tmp_path):
    from harness.cli.cluster import task

    src = _checkout(tmp_path)
    task.copy_checkout(src, tmp_path / "copy")
    assert (tmp_path / "copy" / "megatron" / "core" / "__init__.py").read_text() == "x = 1\n"
    assert os.access(tmp_path / "copy" / "run.sh", os.X_OK)
    assert os.readlink(tmp_path / "copy" / "inner") == "megatron/core"


def test_a_sparse_file_stays_sparse_and_a_huge_one_is_refused(tmp_path):
    from harness.cli.cluster import task

    src = _checkout(tmp_path)
    with open(src / "sparse.bin", "wb") as fh:
        fh.truncate(512 << 20)
        fh.write(b"head")
    task.copy_checkout(src, tmp_path / "copy")
    copied = (tmp_path / "copy" / "sparse.bin").stat()
    assert copied.st_size == 512 << 20 and copied.st_blocks * 512 < 16 << 20, copied   # not written densely
    with open(src / "huge.bin", "wb") as fh:
        fh.truncate(1 << 40)                                                           # 1 TiB, sparse
    with pytest.raises(task.CopyRefused, match="apparent size"):
        task.copy_checkout(src, tmp_path / "copy2")


@pytest.mark.parametrize("kind", ["fifo", "char-device", "socket"])
def test_a_node_that_is_not_a_file_is_refused_never_read(tmp_path, kind):
    import socket
    import threading

    from harness.cli.cluster import task

    src = _checkout(tmp_path)
    if kind == "fifo":
        os.mkfifo(src / "node")
    elif kind == "char-device":
        try:
            os.mknod(src / "node", 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 5))   # /dev/zero's numbers
        except PermissionError:
            (src / "node").symlink_to("/dev/zero")        # unprivileged: the same device reached by a link
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(src / "node"))
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(task.LinkOut, task.copy_checkout, src,
                                                                  tmp_path / "copy")), daemon=True)
    t.start()
    t.join(20)
    assert done, "the copy hung reading the node"


def test_a_file_swapped_for_a_link_during_the_copy_is_never_followed(tmp_path, monkeypatch):
    """The race: listed as a regular file, a link to an outside file when opened. The copy opens by fd with
    O_NOFOLLOW relative to its folder's fd, so the outside bytes never come in."""
    from harness.cli.cluster import task

    src = _checkout(tmp_path)
    (src / "a.txt").write_text("student\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("outside bytes\n")
    real_open = os.open

    def swapping_open(path, flags, *a, dir_fd=None, **k):
        if path == "a.txt" and dir_fd is not None and not flags & os.O_DIRECTORY:
            os.unlink("a.txt", dir_fd=dir_fd)
            os.symlink(str(secret), "a.txt", dir_fd=dir_fd)
        return real_open(path, flags, *a, dir_fd=dir_fd, **k) if dir_fd is not None else real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(task.LinkOut):
        task.copy_checkout(src, tmp_path / "copy")
    monkeypatch.setattr(os, "open", real_open)
    copied = tmp_path / "copy" / "a.txt"
    assert not copied.exists() or "outside" not in copied.read_text(errors="replace")


def test_deep_folders_and_many_entries_are_bounded_not_recursed(tmp_path):
    from harness.cli.cluster import task

    try:
        src = _checkout(tmp_path)
        deep = src
        for _ in range(1200):                  # os.makedirs would recurse itself
            deep = deep / "d"
            deep.mkdir()
        with pytest.raises(task.CopyRefused, match="deeper"):
            task.copy_checkout(src, tmp_path / "copy")
        task.copy_checkout(src, tmp_path / "copy2", max_depth=2000)
        with pytest.raises(task.CopyRefused, match="entries"):
            task.copy_checkout(src, tmp_path / "copy3", max_entries=50, max_depth=2000)
    finally:
        _remove_iteratively(tmp_path)      # shutil.rmtree (pytest's clean-up) recurses: RecursionError at 1,200 deep


def _remove_iteratively(root: Path) -> None:
    folders, order = [root], []
    while folders:
        folder = folders.pop()
        order.append(folder)
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                folders.append(Path(entry.path))
            else:
                os.unlink(entry.path)
    for folder in reversed(order[1:]):
        os.rmdir(folder)
    assert not any(root.iterdir())


# ---------------------------------------------------------------- grade: hostile trees are the student's verdict


def test_hostile_trees_are_a_verdict_never_the_graders_error(tmp_path):
    """An inner link (latest.log -> train.log), 1,200 nested folders, a link loop, a FIFO, a non-UTF-8 name: each
    is graded (a verdict or a refusal naming the submission), never `error`, within the budget."""
    import subprocess
    import sys

    from harness.base.paths import REPO

    root = tmp_path / "subs"
    for name in ("linked", "deep", "loop", "fifo"):
        (root / name).mkdir(parents=True)
        shutil.copy(COURSE_LOG, root / name / "train.log")
    (root / "linked" / "latest.log").symlink_to("train.log")
    deep = root / "deep"
    for _ in range(1200):
        deep = deep / "d"
        deep.mkdir()
    (root / "loop" / "a.log").symlink_to("b.log")
    (root / "loop" / "b.log").symlink_to("a.log")
    os.mkfifo(root / "fifo" / "pipe.log")
    odd = os.fsencode(str(root)) + b"/caf\xe9"
    os.mkdir(odd)
    shutil.copy(COURSE_LOG, os.fsdecode(odd) + "/train.log")
    try:
        done = subprocess.run([sys.executable, "-m", "harness", "grade", str(root), "--out", str(tmp_path / "o"),
                               "--jobs", "2", "--time-limit", "60"], cwd=REPO, capture_output=True, text=True,
                              timeout=400, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert "Traceback" not in done.stdout + done.stderr, done.stderr[-2000:]
        grades = json.loads((tmp_path / "o" / "grades.json").read_text())
        assert len(grades) == 5
        assert all(g["verdict"] in ("pass", "fail") for g in grades), [(g["submission"], g["diagnosis"]) for g in grades]
    finally:
        _remove_iteratively(tmp_path)


def test_finding_logs_walks_any_depth_and_follows_no_link(tmp_path):
    from harness.judge.submission import find_submission

    sub = tmp_path / "s"
    deep = sub
    for _ in range(1200):
        deep = deep / "d"
        deep.mkdir(parents=True)
    shutil.copy(COURSE_LOG, deep / "train.log")
    (sub / "latest.log").symlink_to("/".join(["d"] * 1200) + "/train.log")
    try:
        found = find_submission(sub)
        assert [u[0][0].name for u in found.logs] == ["train.log"]
        assert found.log == deep / "train.log"
    finally:
        _remove_iteratively(tmp_path)
