"""The repository speaks only of itself: no file, folder, machine or tool that a user of it would not have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from harness import paths

THIS_FILE = Path(__file__).resolve().relative_to(paths.REPO).as_posix()

# Words that point outside the repository: the notes it was built from, the place it was built in, the way GPU
# machines were obtained there. Measured facts a user needs live in docs/MEASURED.md instead.
FOREIGN = {
    "a notes file that is not in the repository": r"GROUND_TRUTH|\bSTYLE\.md\b",
    "a folder outside the repository": r"\bshared/",
    "the place the project was built in": r"\bworkplace\b",
    "how machines were obtained there": r"\blent\b|device machine|device tool",
    "a download script that is not in the repository": r"gpu-wheels",
}

# Data, not prose: the BERT vocabulary is a word list (it has "lent" and "workplace"). results/ is evidence
# recorded by earlier commits and stays as it was, except its README, which users read.
EXCLUDED = (re.compile(r"^fixtures/vocab/.*\.txt$"), re.compile(r"^results/(?!README\.md$)"),
            re.compile(re.escape(THIS_FILE) + "$"))


def _tracked_files() -> list[str]:
    """Files in the checkout: tracked or not ignored by git, else (no git) every file under the repository."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=paths.REPO, capture_output=True, check=True, timeout=30)
        return [name for name in out.stdout.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "runs", "__pycache__", ".whl", "wheels", ".checkouts"}
        return [p.relative_to(paths.REPO).as_posix() for p in paths.REPO.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(paths.REPO).parts)]


def _scanned() -> list[str]:
    """The files this test reads."""
    return [name for name in _tracked_files() if not any(rx.search(name) for rx in EXCLUDED)]


def test_the_scan_sees_the_repository():
    """The file list is the repository's (so an empty scan cannot pass by accident)."""
    scanned = set(_scanned())
    assert {"README.md", "results/README.md", "pyproject.toml", "harness/run/session.py",
            "fixtures/logs/PROVENANCE.md", "docs/MEASURED.md"} <= scanned
    assert not any(name.startswith("results/gpu-acceptance/") for name in scanned)


@pytest.mark.parametrize("what", sorted(FOREIGN))
def test_no_reference_outside_the_repository(what):
    """No tracked file (outside results/ evidence and the vocabulary) names it."""
    pattern = re.compile(FOREIGN[what], re.IGNORECASE)
    hits = []
    for name in _scanned():
        path = paths.REPO / name
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        hits += [f"{name}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1)
                 if pattern.search(line)]
    assert not hits, (f"{len(hits)} line(s) refer to {what}; say it for any user of the repository "
                      "(measured facts go to docs/MEASURED.md):\n" + "\n".join(hits[:20]))


def test_the_patterns_catch_what_they_should():
    """Each pattern matches a line it exists for (a pattern that matches nothing guards nothing)."""
    samples = {"a notes file that is not in the repository": "see GROUND_TRUTH.md",
               "a folder outside the repository": "run ../shared/tools/x.sh",
               "the place the project was built in": "the GPU machine of this workplace",
               "how machines were obtained there": "no 2-GPU machine was lent",
               "a download script that is not in the repository": "gpu-wheels.sh"}
    assert samples.keys() == FOREIGN.keys()
    for what, line in samples.items():
        assert re.search(FOREIGN[what], line, re.IGNORECASE), what
    assert not re.search(FOREIGN["how machines were obtained there"], "silent excellent", re.IGNORECASE)
