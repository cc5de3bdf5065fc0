"""`python -m harness matrix`: checkout mode over every Megatron-LM release at once, as one table.

    python -m harness matrix --checkouts .megatron --out OUT                 # every release there, core_v0.16.1..main
    python -m harness matrix --megatron-lm-tarballs TARS --releases core_v0.17.1 main --out OUT
    python -m harness matrix --from-runs OUT --out OUT --compare results/matrix/matrix.json   # rebuild, compare only

Each release is graded by checkout mode (`pytest -m gpu acceptance/test_checkout.py --megatron-lm CHECKOUT`), all of
them concurrently on the GPUs visible (one H200 ran seven at once in about 5 minutes: a run reserves about 3 GB, so
sharing a GPU between releases is deliberate and stated; --per-gpu sets it). The table (OUT/matrix.md and
OUT/matrix.json) has one row per release: preprocess, train, checkpoint save and read, resume (checkout mode trains
no resume run: "not-run"), the adaptations each needed (adapter ids), the final lm loss, the first iteration where its
loss curve differs from the previous release's, and the wall time. OUT/artifacts/<release>/ keeps the train log and
the small checkpoint files of the last iteration (common.pt, .metadata, metadata.json, the tracker), not the weights.

--compare PREVIOUS.json says what changed since that matrix (the nightly signal). Exit codes (harness.cli.args): 0
produced and nothing changed, 1 something changed against --compare, 2 interrupted, 3 a release left no report (not
judged), 4 usage error.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from harness.base.paths import REPO
from harness.cli.args import (EXIT_FAILED, EXIT_GRADER_ERROR, EXIT_INTERRUPTED, EXIT_PASSED, EXIT_USAGE, Parser,
                              add_time_limit, exit_codes_help)

STAGES = ("preprocess", "train", "checkpoint-save", "checkpoint-read", "resume")
STAGE_CRITERIA = {"checkpoint-save": "checkpoints-saved", "checkpoint-read": "checkpoint-loads",
                  "resume": "resume-matches"}
NO_RUN_IN_CHECKOUT_MODE = ("resume",)
FIRST_RELEASE = (0, 16, 1)
SMALL_CHECKPOINT_FILES = ("common.pt", ".metadata", "metadata.json")
TRACKER = "latest_checkpointed_iteration.txt"
REPORT = Path("megatron-lm") / "report.json"
TRAIN_LOG = Path("megatron-lm") / "train-checkout.log"
PER_GPU = 8
RELEASE_TIMEOUT_S = 480.0
EXIT_CODES_HELP = exit_codes_help(passed="the matrix produced, nothing changed", failed="something changed against "
                                  "--compare", grader_error="a release left no report: not judged")
ADAPTER_ID = re.compile(r"^\[([\w-]+)\]")
TAG = re.compile(r"^core_v(\d+)\.(\d+)\.(\d+)$")


# ---------------------------------------------------------------- the releases


def release_key(name: str) -> tuple:
    """Sort order: tagged releases by version, then anything else (main, a commit) in the order named."""
    found = TAG.match(name)
    return (0, *map(int, found.groups())) if found else (1,)


def default_releases(names: Sequence[str], named: Sequence[str] = ()) -> list[str]:
    """Every release among `names` from core_v0.16.1 on, and main, plus any named; in release order."""
    chosen = [n for n in names if (TAG.match(n) and release_key(n)[1:] >= FIRST_RELEASE) or n == "main"]
    extra = [n for n in named if n not in chosen]
    return sorted(chosen, key=release_key) + extra


def checkout_root(folder: Path) -> Path | None:
    """The Megatron-LM checkout in a release folder: the folder itself, or its one sub-folder (a tarball's top)."""
    if (folder / "megatron" / "core").is_dir():
        return folder
    inner = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return inner[0] if len(inner) == 1 and (inner[0] / "megatron" / "core").is_dir() else None


def available(checkouts: Path | None, tarballs: Path | None) -> list[str]:
    """The release names a --checkouts folder (one sub-folder each) or a --megatron-lm-tarballs folder holds."""
    if checkouts is not None:
        return sorted(p.name for p in checkouts.iterdir() if p.is_dir() and checkout_root(p) is not None)
    return sorted(p.name[:-len(".tar.gz")] for p in tarballs.glob("*.tar.gz"))


def extract(tarball: Path, dest: Path) -> Path:
    """A release tarball unpacked (tarfile's data filter: no links out, no devices); the checkout's root."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    inner = [p for p in dest.iterdir() if p.is_dir()]
    return inner[0] if len(inner) == 1 and not (dest / "megatron").is_dir() else dest


# ---------------------------------------------------------------- one release's row


def curve_from_log(path: Path | None) -> dict[int, float]:
    """iteration -> lm loss of a train log (plain or .gz); {} when there is none."""
    from harness.evidence import logs

    if path is None or not Path(path).is_file():
        return {}
    parsed = logs.parse_log_file(path)
    return {r.iteration: r.lm_loss for r in parsed.iterations if r.lm_loss is not None}


def _stage_of(report: dict, stage: str) -> dict:
    for row in report.get("matrix") or []:
        if row.get("stage") == stage:
            return row
    return {}


def row_from_report(release: str, report: dict | None, curve: dict[int, float], wall_s: float | None) -> dict:
    """One release's row: stage outcomes, adaptations, final loss, its curve, wall time (report: report.json)."""
    if report is None:
        return {"release": release, "version": None, "commit": None, "judged": False,
                "stages": dict.fromkeys(STAGES, "not-run"), "details": {"train": "no report.json: not judged"},
                "adaptations": [], "final_loss": None, "final_iteration": None, "curve": {}, "wall_s": wall_s}
    checkout = report.get("checkout") or {}
    verdicts = {v["id"]: v for run in report.get("runs") or [] for v in run.get("verdicts") or []}
    stages, details, adaptations = {}, {}, []
    for stage in ("preprocess", "train"):
        row = _stage_of(report, stage)
        stages[stage] = row.get("outcome", "not-run")
        if row.get("detail"):
            details[stage] = row["detail"]
        for what in row.get("adaptations") or ():
            found = ADAPTER_ID.match(what)
            if found and found[1] not in adaptations:
                adaptations.append(found[1])
    for stage, criterion in STAGE_CRITERIA.items():
        verdict = verdicts.get(criterion)
        if stage in NO_RUN_IN_CHECKOUT_MODE and (verdict is None or verdict["status"] == "not-measurable"):
            verdict = None          # checkout mode trains no resume run: the stage did not run, nothing failed
        stages[stage] = verdict["status"] if verdict else "not-run"
        if verdict and verdict["status"] != "pass":
            details[stage] = str(verdict.get("measured", ""))
    last = max(curve) if curve else None
    return {"release": release, "version": checkout.get("version"), "commit": checkout.get("git_commit"),
            "judged": True, "stages": stages, "details": details, "adaptations": adaptations,
            "final_loss": curve[last] if last is not None else None, "final_iteration": last,
            "curve": {str(k): v for k, v in sorted(curve.items())}, "wall_s": wall_s}


def first_difference(previous: dict, current: dict, tolerance: float = 0.0) -> int | None:
    """The first iteration both curves logged whose losses differ by more than `tolerance`; None when none does."""
    common = sorted(set(map(int, previous)) & set(map(int, current)))
    for iteration in common:
        if abs(previous[str(iteration)] - current[str(iteration)]) > tolerance:
            return iteration
    return None


def build(rows: Sequence[dict], tolerance: float = 0.0) -> dict:
    """The matrix: rows in release order, each with its first difference from the previous release with a curve."""
    rows = sorted(rows, key=lambda r: release_key(r["release"]))
    before = None
    for row in rows:
        row["differs_from"] = before["release"] if before else None
        row["differs_at"] = first_difference(before["curve"], row["curve"], tolerance) if before and row["curve"] \
            else None
        if row["curve"]:
            before = row
    return {"stages": list(STAGES), "tolerance": tolerance, "rows": list(rows)}


def md_cell(value) -> str:
    """Text for one cell of matrix.md: one line, no control characters (shown as \\xNN), `|` and raw HTML escaped
    (`\\|`, `&lt;`, `&gt;`, `&amp;`); names such as core_v0.16.1 stay as they are."""
    from harness.report.gradebook import visible

    text = visible(" ".join(str("" if value is None else value).splitlines()))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _cell(value) -> str:
    return {"pass": "pass", "fail": "**FAIL**", "cannot-run": "cannot-run"}.get(str(value), md_cell(value))


def markdown(matrix: dict) -> str:
    """The table, then each release's failure details; every cell escaped (raw HTML, `|`, markup and control
    characters from a report.json or a log never reach matrix.md as markup)."""
    head = ["release", "Megatron-LM", *matrix["stages"], "adaptations", "final lm loss", "curve differs from "
            "previous at", "wall s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in matrix["rows"]:
        version = str(r["version"] or "?") + (f" @ {str(r['commit'])[:12]}" if r.get("commit") else "")
        loss = f"{r['final_loss']:.6f} at {r['final_iteration']}" if r["final_loss"] is not None else "-"
        if not r["curve"] or not r.get("differs_from"):
            differs = "-"
        elif r["differs_at"] is None:
            differs = f"identical to {r['differs_from']}"
        else:
            differs = f"iteration {r['differs_at']} (vs {r['differs_from']})"
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") is not None else "-"
        out.append("| " + " | ".join([md_cell(r["release"]), md_cell(version),
                                      *(_cell(r["stages"][s]) for s in matrix["stages"]),
                                      md_cell(", ".join(map(str, r["adaptations"])) or "-"), md_cell(loss),
                                      md_cell(differs), md_cell(wall)]) + " |")
    notes = [r for r in matrix["rows"] if r["details"]]
    if notes:
        out += ["", "Details:"]
    for r in notes:
        out += [f"- {md_cell(r['release'])} {md_cell(stage)}: {md_cell(' '.join(str(text).split())[:400])}"
                for stage, text in r["details"].items()]
    return "\n".join(out) + "\n"


def compare(previous: dict, current: dict) -> list[str]:
    """What changed from the previous matrix to this one, one line each (empty: nothing)."""
    old = {r["release"]: r for r in previous.get("rows") or []}
    new = {r["release"]: r for r in current.get("rows") or []}
    changes = [f"{name}: new in this matrix" for name in new if name not in old]
    changes += [f"{name}: missing from this matrix" for name in old if name not in new]
    for name in (n for n in new if n in old):
        a, b = old[name], new[name]
        if a.get("commit") != b.get("commit"):
            changes.append(f"{name}: commit {str(a.get('commit'))[:12]} -> {str(b.get('commit'))[:12]}")
        for stage in STAGES:
            was, now = (a.get("stages") or {}).get(stage), (b.get("stages") or {}).get(stage)
            if was != now:
                changes.append(f"{name}: {stage} {was} -> {now}")
        if set(a.get("adaptations") or ()) != set(b.get("adaptations") or ()):
            gained = sorted(set(b.get("adaptations") or ()) - set(a.get("adaptations") or ()))
            lost = sorted(set(a.get("adaptations") or ()) - set(b.get("adaptations") or ()))
            changes.append(f"{name}: adaptations" + (f" +{', +'.join(gained)}" if gained else "")
                           + (f" -{', -'.join(lost)}" if lost else ""))
        if a.get("final_loss") != b.get("final_loss"):
            changes.append(f"{name}: final lm loss {a.get('final_loss')} -> {b.get('final_loss')}")
        elif a.get("curve") and b.get("curve") and first_difference(a["curve"], b["curve"]) is not None:
            changes.append(f"{name}: loss curve differs from the previous matrix's from iteration "
                           f"{first_difference(a['curve'], b['curve'])} (same final loss)")
    return changes


# ---------------------------------------------------------------- running checkout mode


def _gpus() -> list[str]:
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def run_release(release: str, checkout: Path, run_dir: Path, gpu: str | None, timeout_s: float,
                python: str = sys.executable) -> float:
    """Checkout mode on one release, its output in run_dir/pytest.log; the wall time in seconds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pytest", "-m", "gpu", "acceptance/test_checkout.py", "-p", "no:cacheprovider", "-q",
            "--megatron-lm", str(checkout), "--run-dir", str(run_dir), "--keep-run",
            "--junitxml", str(run_dir / "junit.xml")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}
    started = time.monotonic()
    with (run_dir / "pytest.log").open("wb") as log:
        log.write((" ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            log.write(f"\nmatrix: stopped after {timeout_s:.0f} s\n".encode())
    return round(time.monotonic() - started, 1)


def keep_artifacts(release: str, run_dir: Path, dest: Path, report: dict | None) -> None:
    """The train log (gzipped) and the last checkpoint's small files of one release into dest/."""
    dest.mkdir(parents=True, exist_ok=True)
    log = run_dir / TRAIN_LOG
    if log.is_file():
        with log.open("rb") as src, gzip.open(dest / "train.log.gz", "wb") as out:
            shutil.copyfileobj(src, out)
    save = next((Path(a[len("--save "):]) for row in (report or {}).get("matrix") or []
                 for a in row.get("adaptations") or () if a.startswith("--save ")), None)
    if save is None or not (save / TRACKER).is_file():
        return
    shutil.copyfile(save / TRACKER, dest / TRACKER)
    iteration = (save / TRACKER).read_text().strip()
    folder = save / (f"iter_{int(iteration):07d}" if iteration.isdigit() else iteration)
    for name in SMALL_CHECKPOINT_FILES:
        if (folder / name).is_file() and not (folder / name).is_symlink():
            (dest / folder.name).mkdir(exist_ok=True)
            shutil.copyfile(folder / name, dest / folder.name / name)


def collect(release: str, run_dir: Path, wall_s: float | None) -> dict:
    """A release's row from what checkout mode left in run_dir."""
    path = run_dir / REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        report = None
    try:
        curve = curve_from_log(run_dir / TRAIN_LOG)
    except Exception as exc:   # noqa: BLE001 - an unreadable log is this row's problem, never the table's
        curve, report = {}, None
        why = f"its {TRAIN_LOG} cannot be read ({type(exc).__name__}: {exc})"
    else:
        why = None
    if report is not None:
        try:
            row = row_from_report(release, report, curve, wall_s)
            markdown(build([dict(row)]))          # every value this row carries can be written
            json.dumps(row)
            return row
        except Exception as exc:   # noqa: BLE001 - a malformed report.json is this row's error
            why = f"its {REPORT} is malformed ({type(exc).__name__}: {str(exc)[:200]})"
    row = row_from_report(release, None, {}, wall_s if isinstance(wall_s, (int, float)) else None)
    row["details"]["train"] = (f"not judged: {why}" if why else
                               f"no {REPORT}: not judged; checkout mode said: {_pytest_said(run_dir)}")
    return row


def _pytest_said(run_dir: Path) -> str:
    """The skip reasons and the closing line of a release's pytest.log (why it left no report)."""
    try:
        lines = [ln.strip() for ln in (run_dir / "pytest.log").read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no pytest.log)"
    skips = list(dict.fromkeys(ln.split(": ", 1)[-1] for ln in lines if ln.startswith("SKIPPED")))[:2]
    return "; ".join([*skips, lines[-1] if lines else "(empty)"])[:400]


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkouts", metavar="DIR", help="one Megatron-LM checkout per release: DIR/<release>/")
    source.add_argument("--megatron-lm-tarballs", metavar="DIR", help="DIR/<release>.tar.gz, unpacked into OUT/src/")
    source.add_argument("--from-runs", metavar="OUT", help="rebuild the table from an earlier matrix's OUT/runs/")
    parser.add_argument("--releases", nargs="*", default=[], metavar="R",
                        help="releases to add to the default (every core_vX.Y.Z from core_v0.16.1, and main)")
    parser.add_argument("--only", nargs="*", metavar="R", help="exactly these releases")
    parser.add_argument("--out", required=True, metavar="OUT", help="matrix.md, matrix.json, runs/, artifacts/")
    parser.add_argument("--compare", metavar="PREVIOUS.json", help="say what changed since this matrix (exit 1 if so)")
    parser.add_argument("--per-gpu", type=int, default=PER_GPU, metavar="N",
                        help=f"releases sharing one GPU at once (default {PER_GPU}: each run reserves ~3 GB)")
    add_time_limit(parser, RELEASE_TIMEOUT_S, "wall-clock time per release", old=("--timeout",))
    parser.add_argument("--tolerance", type=float, default=0.0, help="loss difference that counts as a change")
    parser.epilog = EXIT_CODES_HELP


def main(args) -> int:
    """Build the matrix; the exit code is one of harness.cli.args' (the module docstring)."""
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("interrupted: the matrix was not written", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_runs:
        runs = Path(args.from_runs) / "runs"
        names = args.only or sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
        rows = [collect(n, runs / n, _read_wall(runs / n)) for n in names]
    else:
        checkouts = Path(args.checkouts) if args.checkouts else None
        tarballs = Path(args.megatron_lm_tarballs) if args.megatron_lm_tarballs else None
        source = checkouts or tarballs
        if not source.is_dir():
            print(f"error: {source}: no such folder", file=sys.stderr)
            return EXIT_USAGE
        names = args.only or default_releases(available(checkouts, tarballs), args.releases)
        missing = [n for n in names if not (checkout_root(checkouts / n) if checkouts else (tarballs / f"{n}.tar.gz")
                                            .is_file())]
        if missing or not names:
            print(f"error: {source}: no release {', '.join(missing) or '(none found)'}", file=sys.stderr)
            return EXIT_USAGE
        paths = {n: checkout_root(checkouts / n).resolve() if checkouts else extract(tarballs / f"{n}.tar.gz",
                                                                                    out / "src" / n)
                 for n in names}
        gpus = _gpus()
        slots = max(1, len(gpus)) * max(1, args.per_gpu)
        print(f"matrix: {len(names)} release(s) on {len(gpus)} GPU(s), up to {min(slots, len(names))} at once"
              + (f" ({args.per_gpu} sharing each GPU, deliberately)" if args.per_gpu > 1 and gpus else "")
              + ("" if gpus else ": no GPU visible, checkout mode will skip its GPU tests"), flush=True)

        def one(item):
            index, name = item
            gpu = gpus[index % len(gpus)] if gpus else None
            wall = run_release(name, paths[name], out / "runs" / name, gpu, args.time_limit)
            (out / "runs" / name / "wall_s.txt").write_text(f"{wall}\n")
            return name, wall

        with ThreadPoolExecutor(max_workers=min(slots, len(names))) as pool:
            walls = dict(pool.map(one, enumerate(names)))
        rows = [collect(n, out / "runs" / n, walls[n]) for n in names]
        for n in names:
            report = _load(out / "runs" / n / REPORT)
            keep_artifacts(n, out / "runs" / n, out / "artifacts" / n, report)
    matrix = build(rows, args.tolerance)
    (out / "matrix.json").write_text(json.dumps(matrix, indent=2) + "\n")
    text = markdown(matrix)
    changes = []
    if args.compare:
        previous = _load(Path(args.compare))
        if previous is None:
            print(f"error: --compare {args.compare}: not a matrix.json", file=sys.stderr)
            return EXIT_USAGE
        changes = compare(previous, matrix)
        text += "\nChanges since " + args.compare + ":\n" + ("".join(f"- {c}\n" for c in changes) or "- none\n")
    (out / "matrix.md").write_text(text)
    print(text, end="")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(text)
    if any(not r["judged"] for r in matrix["rows"]):
        return EXIT_GRADER_ERROR
    return EXIT_FAILED if changes else EXIT_PASSED


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_wall(run_dir: Path) -> float | None:
    try:
        return float((run_dir / "wall_s.txt").read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    parser = Parser(prog="python -m harness matrix", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
