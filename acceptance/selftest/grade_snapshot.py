"""The grade of every real log and checkpoint folder in fixtures/, as one JSON snapshot (verdict, failed criteria,
not-measured criteria, root-cause id, every criterion's status and measured value) under each criteria profile.

It goes through the user's command, `python -m harness grade`, so the snapshot does not depend on where any module
lives: a restructuring of the package must leave it identical (test_grade_snapshot.py).

    python acceptance/selftest/grade_snapshot.py [--write]     # print the differences, or rewrite the snapshot
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
SNAPSHOT = FIXTURES / "golden" / "grades-snapshot.json"
PROFILES = ("reference", "course", "megatron-lm")
LOG_SUFFIXES = (".log", ".log.gz", ".out")
# each checkpoint folder beside the real log of the run that wrote it (fixtures/checkpoints/README.md)
CHECKPOINT_LOGS = {
    "core_v0.16.1": "logs/runs-h200/core_v0.16.1-plain-s1234.log.gz",
    "core_v0.16.1-hidden-64": "logs/runs-h200/core_v0.16.1-h64-s1234.log.gz",
    "core_v0.16.1-killed-during-save-200": "failures/real-h200/core_v0.16.1-kill-save200-s1234.log.gz",
    "core_v0.17.1": "logs/runs-h200/core_v0.17.1-plain-s1234.log.gz",
    "core_v0.18.2": "logs/runs-h200/core_v0.18.2-plain-s1234.log.gz",
    "core_v0.19.0": "logs/runs-h200/core_v0.19.0-plain-s1234.log.gz",
    "main": "logs/runs-h200/main-plain-s1234.log.gz",
}


def real_logs() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name.endswith(LOG_SUFFIXES)
                  and "checkouts" not in p.relative_to(FIXTURES).parts)


def build_batch(root: Path) -> None:
    """One sub-folder per real log (the log alone) and per checkpoint folder (its run's log and its --save)."""
    for i, log in enumerate(real_logs()):
        sub = root / f"log{i:03d}-{log.relative_to(FIXTURES).as_posix().replace('/', '__')}"
        sub.mkdir()
        shutil.copy(log, sub / log.name)
    for name, log in CHECKPOINT_LOGS.items():
        sub = root / f"ckpt-{name}"
        shutil.copytree(FIXTURES / "checkpoints" / name, sub / "ckpt")
        shutil.copy(FIXTURES / log, sub / Path(log).name)


def essence(grade: dict, batch: Path) -> dict:
    grade = json.loads(json.dumps(grade).replace(str(batch), "BATCH"))
    return {"verdict": grade["verdict"], "failed": sorted(grade.get("failed") or []),
            "not_measured": sorted(grade.get("not_measured") or []), "root_cause": grade.get("diagnosis_id"),
            "recipe": grade.get("recipe"),
            "criteria": {c["id"]: [c["status"], c.get("measured")] for c in grade.get("criteria") or []}}


def snapshot(jobs: int = 0) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        batch = Path(tmp) / "batch"
        batch.mkdir()
        build_batch(batch)
        for profile in PROFILES:
            dest = Path(tmp) / f"grades-{profile}"
            cmd = [sys.executable, "-m", "harness", "grade", str(batch), "--out", str(dest), "--criteria", profile,
                   "--no-progress"] + (["--jobs", str(jobs)] if jobs else [])
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONHASHSEED": "0"})
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"grade exited {proc.returncode}: {proc.stderr[-2000:]}")
            data = json.loads((dest / "grades.json").read_text())
            grades = data["grades"] if isinstance(data, dict) else data
            out[profile] = {g["submission"]: essence(g, batch) for g in grades}
    return out


def main() -> int:
    got = snapshot()
    if "--write" in sys.argv:
        SNAPSHOT.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT} ({sum(len(v) for v in got.values())} grades)")
        return 0
    want = json.loads(SNAPSHOT.read_text())
    diffs = [(p, s) for p in want for s in set(want[p]) | set(got.get(p, {})) if want[p].get(s) != got.get(p, {}).get(s)]
    for p, s in diffs:
        was, now = want[p].get(s) or {}, got.get(p, {}).get(s) or {}
        keys = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
        print(p, s, {k: (was.get(k), now.get(k)) for k in keys})
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
