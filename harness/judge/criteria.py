"""Acceptance criteria as data: judge a RunEvidence against a TOML profile, and derive golden bands from runs.

A profile (fixtures/criteria/<name>.toml) is one table per criterion under ``[criteria.<id>]``; ``kind`` picks
a checker from the small vocabulary in ``KINDS``. Every criterion is evaluated and every failure is collected;
missing evidence is "not-measurable", never a pass. ``python -m harness criteria --help`` lists the commands.

The rooms: harness.judge.profiles loads profile, recipe and golden files (the records they hold),
harness.judge.kinds holds one checker per kind, harness.judge.bands the tolerance rule; this module judges a run
(root cause first, then every criterion) and renders the messages. Their names stay importable from here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from harness.evidence import failure_events as fe
from harness.evidence import fp16, logs
from harness.evidence.records import RunEvidence
# The profile records and loaders (profiles), the bands (bands) and the criterion kinds (kinds) live in their own
# modules; every name other modules and tests import from here stays importable from here.
from harness.judge.kinds import CHECKERS, Finding
from harness.judge.profiles import (FAIL, NOT_MEASURABLE, PASS, Criterion, Profile, Verdict, build_golden, load_profile)
from harness.evidence.recipe import detect_recipe
from harness.evidence.logformat import KEEP_CHARS

VERDICT_TAIL_LINES = 10   # the log's last lines quoted in a failing verdict (a stage's own tail: launch.TAIL_LINES)

# The order is fixed: criterion, measured, expected, where, artifacts, last log lines, remedy.
FAILURE_TEMPLATE = (
    "{status}: {label} [{criterion_id}]\n"
    "  measured:  {measured}\n"
    "  expected:  {expected}\n"
    "  where:     {where}\n"
    "  artifacts: {artifacts}\n"
    "  last log lines:\n{tail}\n"
    "  remedy:    {remedy}"
)
PASS_TEMPLATE = "PASS: {label} [{criterion_id}]: measured {measured}; expected {expected}"


def _tail_lines(ev: RunEvidence) -> list:
    """The last log lines, from the parsed log or the log file."""
    if ev.log is not None and getattr(ev.log, "lines", None):
        return ev.log.tail(VERDICT_TAIL_LINES)
    if ev.log_path and Path(ev.log_path).is_file():
        return Path(ev.log_path).read_text(errors="replace").split("\n")[-VERDICT_TAIL_LINES:]
    return []


ROOT_CAUSE_TEMPLATE = "  ROOT CAUSE [{cause_id}]: {cause}\n  fix first: {remedy}\n"
CONSEQUENCE_REMEDY = "none of its own: not reached because of the root cause above; fix that first"


GRADER_LIMIT_REMEDY = ("nothing for the student to fix: this suite cannot judge this evidence yet; judge it by hand "
                       "or update bert-acceptance (the grade is a grader outcome, not a failure)")


def render_message(c: Criterion, outcome: Finding, ev: RunEvidence, cause=None) -> str:
    """The verdict text: one line for a pass; else the root cause first (when the run failed), then FAILURE_TEMPLATE.

    A criterion that failed only because the run never got that far gets no remedy of its own: it would be the
    wrong one (a dataset remedy for a run that died on an import error).
    """
    if outcome.status == PASS:
        return PASS_TEMPLATE.format(label=c.label, criterion_id=c.id, measured=outcome.measured,
                                    expected=outcome.expected)
    tail = "\n".join(f"    | {line}" for line in _tail_lines(ev)) or "    (no log lines)"
    remedy = CONSEQUENCE_REMEDY if cause is not None and outcome.missing else c.remedy
    if outcome.grader:
        remedy = GRADER_LIMIT_REMEDY
    text = FAILURE_TEMPLATE.format(status=outcome.status.upper(), label=c.label, criterion_id=c.id,
                                   measured=outcome.measured, expected=outcome.expected, where=outcome.where,
                                   artifacts=ev.run_dir, tail=tail, remedy=remedy)
    if cause is None:
        return text
    head, _, rest = text.partition("\n")
    return head + "\n" + ROOT_CAUSE_TEMPLATE.format(cause_id=cause.cause_id, cause=cause.cause,
                                                   remedy=cause.remedy) + rest


def _with_parsed_log(ev: RunEvidence) -> RunEvidence:
    """Evidence whose log is parsed (from log_path when only the path is known)."""
    if ev.log is None and ev.log_path and Path(ev.log_path).is_file():
        return replace(ev, log=logs.parse_log_file(ev.log_path))
    return ev


def _log_text(ev: RunEvidence) -> str:
    """The whole log as text ('' when there is none)."""
    if ev.log is not None and ev.log.lines:
        return "\n".join(ev.log.lines)
    if ev.log_path and Path(ev.log_path).is_file():
        with open(ev.log_path, errors="replace") as fh:  # bounded: a submitted log may be any size
            return fh.read(2 * KEEP_CHARS)
    return ""


def root_cause(ev: RunEvidence):
    """The diagnosis of a run that failed (crashed, timed out, stopped early, or went NaN); None for a healthy run.

    A recorded log has no exit code: one that stops before --train-iters was stopped, killed or cut, so the
    diagnose table sees it as stalled, and a log with no known cause gets `log-ends-early` rather than a hang.
    """
    from harness.evidence import diagnose as dg

    log, text = ev.log, _log_text(ev)
    parsed = log if log is not None and log.lines else None   # the text is its kept lines: its facts are read from it
    last = log.iterations[-1] if log is not None and log.iterations else None
    end = logs.run_end(log) if log is not None else None     # Megatron-LM's normal end, or where the log stops
    incomplete = end is None or not end.complete
    nan = log is not None and fp16.log_divergence(log) is not None
    crashed = ev.timed_out or ev.exit_code not in (None, 0)
    if not (crashed or incomplete or nan):
        return lines_missing_cause(log) if log is not None else None
    killed = killed_cause(parsed, end) if parsed is not None and not ev.timed_out else None
    if killed is not None:
        return killed
    recorded = ev.exit_code is None and not ev.timed_out
    rules = [r for r in dg.RULES if not (recorded and r.id == "timeout")]
    found = dg.diagnose("train", ev.exit_code, text, timed_out=ev.timed_out, stalled=recorded and incomplete,
                        rules=rules, iterations=log.iterations if log is not None else None, log=parsed)
    if found is not None:
        return found
    last_line = dg.StageOutput("train", ev.exit_code, text).last_line
    if ev.exit_code not in (None, 0):
        return dg.Diagnosis("crashed", f"the run exited with code {ev.exit_code} and its log names no known cause; "
                                       f"last line: {last_line}",
                            "read the traceback at the end of the log", last_line)
    where = "no iteration line" if last is None else f"iteration {last.iteration} of {last.train_iters}"
    if end is not None and last is not None and last.iteration >= last.train_iters:
        where = end.stopped
    error = dg.first_exception(fe.log_events(parsed)) if parsed is not None else dg.first_python_error(text)
    if error:
        return dg.Diagnosis("crashed", f"the log stops at {where} after an error its log names no known cause for: "
                                       f"{error}", "read the traceback that ends with that line in the log", error)
    if log is not None and not text.strip():
        return dg.Diagnosis("log-empty", "the log is empty: none of the run's output reached it",
                            "submit the file the run's output went to (e.g. `bash train.sh 2>&1 | tee train.log`)",
                            "(empty)")
    if log is not None and not (log.markers or log.arguments or log.iterations or log.validations or log.checkpoints):
        return dg.Diagnosis("not-a-training-log", "the log holds none of the lines a Megatron-LM training run "
                                                  "prints (its arguments block, `training ...`, iteration lines): "
                                                  "another file, or a run stopped before it printed its arguments",
                            "submit the file the training run's output went to, from its first line to its last",
                            last_line)
    stopped = end.stopped if end is not None else f"the log stops at {where}"
    tracker = ev.checkpoints.tracker if ev.checkpoints is not None else None
    if log is not None and end is not None and tracker is not None and end.iteration is not None and \
            end.iteration < tracker <= (logs.run_reach(log).train_iters or tracker):
        return dg.Diagnosis("log-cut", f"{stopped}, but the run went on: its --save folder's "
                                       f"latest_checkpointed_iteration.txt says it saved iteration {tracker}, so the "
                                       "log was cut (a copy of the terminal's scrollback, or a log of an earlier "
                                       "attempt)", "submit the whole log of the run that wrote that --save folder "
                                       "(e.g. `bash train.sh 2>&1 | tee train.log`)", f"tracker {tracker}")
    return dg.Diagnosis("log-ends-early", f"{stopped}, with no error in the log: the run was stopped "
                                          "(--exit-interval), killed, or the log was cut",
                        "submit the complete log of a run that reached --train-iters (it ends with the test-set "
                        "loss line)", last_line)


# A process whose peer died fails writing to it or reading from it: these errors are what the survivors of a killed
# process print (a DataLoader worker's queue feeder once the training process is gone), never a cause of their own.
DEAD_PEER_ERRORS = frozenset({"BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError", "EOFError"})
# ...when raised in the machinery that connects processes, not in the program's own code
PLUMBING_FRAMES = ("multiprocessing/", "torch/utils/data/", "concurrent/", "threading.py", "queue.py", "socket.py",
                   "selectors.py", "torch/distributed/elastic/")
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid[^)]{0,80}\) is killed by signal: (?P<sig>Killed|Terminated)")
KILLED_REMEDY = ("find what killed it: most often the kernel's out-of-memory killer (host RAM, not GPU memory: "
                 "`dmesg | grep -i -E 'killed process|out of memory'`), a scheduler's time or memory limit, or a kill "
                 "/ Ctrl-C; give the run that memory (fewer --num-workers) or time, then run it again")


def _dead_peer(e) -> bool:
    """An error a surviving process prints when the process at the other end of its pipe died."""
    return e.kind == "exception" and e.short_type in DEAD_PEER_ERRORS and bool(e.frames) and all(
        any(part in f.file.replace("\\", "/") for part in PLUMBING_FRAMES) for f in e.frames)


def killed_cause(log, end):
    """A run killed from outside, recognised by what its surviving processes print: a DataLoader worker's (or any
    child's) BrokenPipeError / ConnectionResetError / EOFError in the plumbing between processes once the training
    process is gone, torch's `DataLoader worker (pid N) is killed by signal: Killed`, with any launcher or signal
    report around them (torchrun's `Signal 9 (SIGKILL) received`, a shell's `Killed`) and no error of the program's
    own. None when the log shows no such survivor (a launcher's own signal report is the catalogue's to name)."""
    from harness.evidence import diagnose as dg

    found = fe.log_events(log)
    survivors = [e for e in found if _dead_peer(e) or e.kind == "exception" and _WORKER_KILLED.search(e.detail)]
    others = [e for e in found if e not in survivors]
    if not survivors or any(e.kind not in ("launcher", "signal") for e in others):
        return None
    worker = next((e for e in survivors if _WORKER_KILLED.search(e.detail)), None)
    signal = next((e.signal for e in others if e.signal), None) or (
        {"Killed": "SIGKILL", "Terminated": "SIGTERM"}[_WORKER_KILLED.search(worker.detail)["sig"]] if worker else None)
    first = survivors[0]
    where = f"{first.raised_in.where()}" if first.raised_in else "no frame"
    stopped = re.sub(r" \(last line: .*\)$", "", end.stopped) if end is not None else "the log stops"
    what = (f"a DataLoader worker was killed{f' by {signal}' if signal else ''} ({first.evidence.strip()[:160]})"
            if worker else
            f"the training process was killed{f' by {signal}' if signal else ''} from outside ({stopped}): it "
            f"printed no error of its own, and a surviving child process then failed on the pipe to it ("
            f"{first.short_type} in {where}), as a process does when the one at the other end has died")
    return dg.Diagnosis("killed-by-signal", what, KILLED_REMEDY, first.evidence.strip()[:200])


def lines_missing_cause(log):
    """A log whose end proves the run reached its last iteration but that lacks iteration lines Megatron printed on
    the way (logs.Reach.missing_lines): cut or edited. None when none is missing."""
    from harness.evidence import diagnose as dg

    run = logs.run_reach(log)
    gone = run.missing_lines(log) if run.iteration is not None and run.start < run.iteration else ()
    if not gone:
        return None
    span = f"{gone[0]}-{gone[-1]}" if len(gone) > 1 else str(gone[0])
    return dg.Diagnosis("iteration-lines-missing",
                        f"the log proves the run reached {run.says()}, but lacks the iteration line(s) Megatron "
                        f"printed at {span} (every {run.interval}, its --log-interval): lines were cut from the log "
                        "or edited out", "submit the log exactly as the run wrote it, every line", f"iterations {span}")


def provenance_cause(ev: RunEvidence):
    """The first finding that the submitted logs are not one run (harness.evidence.stitch: a resume from a checkpoint
    no earlier log saved, a rerun that loaded a finished run and trained nothing, logs of two runs); None when they
    are. It is the root cause before what the judged log then shows (it stopped early, it trained nothing)."""
    from harness.evidence import diagnose as dg

    if not ev.provenance_failures:
        return None
    fid, cause, fix = ev.provenance_failures[0]
    return dg.Diagnosis(fid, cause, fix, "the submitted logs (log-provenance)")


# Root causes that only say where the log stopped or that an error is in it: a finding about the logs themselves
# (provenance) is more specific, and comes first.
GENERIC_CAUSES = frozenset({"log-ends-early", "crashed", "python-exception"})


def finding_cause(verdicts, first=()):
    """No FAIL without a root cause: when no cause above names one, the failed verdict itself is the root cause (its
    criterion's own finding and remedy), the ids in `first` before the others, then in profile order; None when
    nothing failed."""
    from harness.evidence import diagnose as dg

    failed = [v for v in verdicts if v.status == FAIL]
    failed.sort(key=lambda v: v.criterion_id not in first)
    if not failed:
        return None
    v = failed[0]
    remedy = next((line.split(":", 1)[1].strip() for line in v.message.splitlines()
                   if line.strip().startswith("remedy:")), "")
    return dg.Diagnosis(v.criterion_id, f"{v.label}: {v.measured} (expected {v.expected})",
                        remedy or "read the criterion's verdict", v.where)


def recipe_cause(measured: list):
    """A run that ended normally with the course's flags changed: the change is the root cause of what else fails
    (a loss band missed after `--lr 3e-4`), so the fix named first is the flags, not the loss. `measured`: each
    criterion with its outcome as measured; None when no recipe criterion failed."""
    from harness.evidence import diagnose as dg

    for c, outcome in measured:
        if c.kind == "recipe_matches" and outcome.status == FAIL:
            return dg.Diagnosis("recipe-deviation", f"the run changed the course's training flags: {outcome.measured}",
                                "train with the chapter's flags (each deviation names the flag, the course's value "
                                "and the run's); a variant the course allows is not a deviation", outcome.where)
    return None


def save_cause(ev: RunEvidence):
    """A run without --save (its arguments block prints `save ... None`): the course's literal command, which sets
    --save-interval 100 but no --save, so Megatron-LM saves nothing. None when the run had --save (or it is not
    printed)."""
    from harness.evidence import diagnose as dg

    if ev.log is None or logs.save_argument(ev.log) != "None":
        return None
    interval = (ev.log.arguments or {}).get("save_interval", "").strip()
    return dg.Diagnosis("no-save", "the run had no --save (its arguments block prints `save ... None`, log line "
                                   f"{ev.log.arguments_line}): the course's command sets --save-interval "
                                   f"{interval or '100'} but lacks --save, so Megatron-LM saved no checkpoint",
                        "add `--save DIR` (e.g. `--save checkpoints/bert`) to the training command and run it again",
                        f"save ... None (arguments block at log line {ev.log.arguments_line})")


@dataclass(frozen=True)
class Judgement:
    """One run judged: the course recipe it followed, the root cause when it failed, one verdict per criterion."""

    profile: str
    recipe: str | None
    recipe_how: str
    diagnosis: object                # harness.evidence.diagnose.Diagnosis | None
    verdicts: tuple
    provenance: tuple = ()           # how the judged log was read, stitched or chosen (RunEvidence.provenance)

    @property
    def not_judged(self) -> tuple:
        """The verdicts this suite could not judge (its own limitation, e.g. a release's new checkpoint class)."""
        return tuple(v for v in self.verdicts if v.grader)

    def ids(self, status: str) -> list:
        """Criterion ids with this status, in profile order."""
        return [v.criterion_id for v in self.verdicts if v.status == status]

    @property
    def verdict(self) -> str:
        """'fail' when any criterion failed; not-measured criteria are listed, never counted as passes."""
        return "fail" if self.ids(FAIL) else "pass"


def judge(profile: Profile, evidence: RunEvidence, live: bool = False, exclude=frozenset()) -> Judgement:
    """Judge every criterion of the run's recipe variant of the profile, never stopping at a failure.

    live=True: the run was made now, so a criterion that cannot be measured fails (with the reason).
    exclude: kinds that do not apply to this run (resume_matches for a run that nothing resumes).
    """
    ev = _with_parsed_log(evidence)
    recipe_id, how = detect_recipe(ev.log)
    variant = profile.for_recipe(recipe_id)
    measured = [(c, CHECKERS[c.kind](c, ev, variant.golden)) for c in variant.criteria if c.kind not in exclude]
    cause = root_cause(ev)
    if cause is None or cause.cause_id in GENERIC_CAUSES:
        cause = provenance_cause(ev) or cause
    cause = cause or recipe_cause(measured) or save_cause(ev)
    verdicts = []
    for c, outcome in measured:
        if live and outcome.status == NOT_MEASURABLE and not outcome.grader:
            outcome = Finding(FAIL, f"{outcome.measured} (in a live run every criterion must be measured)",
                              outcome.expected, outcome.where, missing=True)
        consequence = cause.cause_id if cause is not None and outcome.status == FAIL and outcome.missing else None
        verdicts.append(Verdict(criterion_id=c.id, label=c.label, status=outcome.status, measured=outcome.measured,
                                expected=outcome.expected, where=outcome.where,
                                message=render_message(c, outcome, ev, cause if outcome.status != PASS else None),
                                consequence_of=consequence, grader=outcome.grader))
    return Judgement(profile.name, recipe_id, how, cause or finding_cause(verdicts), tuple(verdicts),
                     tuple(ev.provenance))


def evaluate(profile: Profile, evidence: RunEvidence, live: bool = False, exclude=frozenset()) -> list:
    """judge()'s verdicts as a list."""
    return list(judge(profile, evidence, live, exclude).verdicts)


def evidence_from_log_text(text: str, run_dir: str = "(recorded log)", log_path: str | None = None) -> RunEvidence:
    """Evidence that a log alone can give: exit code, device, checkpoints and memory stay unmeasured."""
    return RunEvidence(run_dir=run_dir, log=logs.parse_log(text), log_path=log_path)


def evidence_from_log_file(path: str | Path) -> RunEvidence:
    """evidence_from_log_text for a log file, read as any tool wrote it (harness.evidence.logread); the artifacts path
    is the log's folder."""
    path = Path(path)
    return RunEvidence(run_dir=str(path.parent), log=logs.parse_log_file(path), log_path=str(path))


# ---------------------------------------------------------------- command line


def _cmd_check(args) -> int:
    """Judge a log with a profile; exit 1 when any criterion fails."""
    verdicts = evaluate(load_profile(args.profile), evidence_from_log_file(args.log))
    for v in verdicts:
        print(v.message if v.status == PASS else v.message + "\n")
    return int(any(v.status == FAIL for v in verdicts))


def _cmd_golden(args) -> int:
    """Write a golden file from one or more logs (one per run/seed)."""
    runs = {Path(p).stem: logs.parse_log_file(p) for p in args.logs}
    provenance = json.loads(args.provenance) if args.provenance else {}
    doc = build_golden(runs, provenance, rel_tol_floor=args.rel_tol_floor, k=args.k)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}: {len(runs)} run(s)")
    return 0


def main(argv: list | None = None) -> int:
    """CLI: `check` a log against a profile, or compute a `golden` file from logs."""
    parser = argparse.ArgumentParser(prog="python -m harness criteria")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="judge a training log with a criteria profile")
    check.add_argument("--profile", default="reference")
    check.add_argument("--log", required=True)
    check.set_defaults(func=_cmd_check)
    golden = sub.add_parser("golden", help="compute a golden-values file (bands from the spread of runs)")
    golden.add_argument("--out", required=True)
    golden.add_argument("--provenance", help="JSON object: gpu, versions, date, seeds, ...")
    golden.add_argument("--rel-tol-floor", type=float, default=0.02)
    golden.add_argument("--k", type=float, default=3.0, help="tolerance = max(k * std, floor)")
    golden.add_argument("logs", nargs="+")
    golden.set_defaults(func=_cmd_golden)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
