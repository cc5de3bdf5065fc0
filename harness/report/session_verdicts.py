"""A finished session judged: every graded run against its recipe's variant of the profile, then the report.

One place for what `pytest -m gpu` (acceptance/conftest.py) and `python -m harness bench suite` both do.
"""

from __future__ import annotations

from harness.judge import criteria
from harness.report import plot, session_report as report
from harness.judge.profiles import Profile


def judge_runs(session, profile: Profile) -> dict:
    """run name -> Judgement; a live run, so unmeasured criteria fail. The plain resume run is judged through its
    source (its log is the source's resumed log); resume-matches applies only where a resume exists."""
    resumed = {o.spec.resume_from for o in session.outcomes.values() if o.spec.resume_from}
    return {name: criteria.judge(profile, session.evidence(name), live=True,
                                 exclude=() if o.spec.is_broken_resume or (o.spec.derived_from or name) in resumed
                                 else {"resume_matches"})
            for name, o in session.outcomes.items()
            if o.spec.graded and not (o.spec.resume_from and not o.spec.is_mutant)}


def draw_loss_curves(session, profile: Profile, judged: dict, processes: int = 4) -> dict:
    """One loss-curve picture per judged run (RUN/<name>/loss-curve.png); name -> path relative to the run dir.

    Drawn by up to `processes` forks of this process (matplotlib renders on the CPU, ~0.15 s a picture); a
    picture a fork did not write is drawn here afterwards.
    """
    import os

    jobs = [(name, session.run_dir / name / "loss-curve.png", session.evidence(name).log,
             profile.for_recipe(j.recipe).golden, f"{name} (recipe {j.recipe or '?'})", j.verdict)
            for name, j in judged.items()]
    for _, path, *_ in jobs:
        path.unlink(missing_ok=True)
    n = min(processes, len(jobs)) if hasattr(os, "fork") else 1
    if n > 1:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401 - imported once here, not in every fork

        pids = []
        for k in range(n):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    for _, path, log, golden, title, verdict in jobs[k::n]:
                        plot.loss_curve(path, log, golden, title, verdict)
                except BaseException:  # noqa: BLE001 - the parent draws what is missing
                    code = 1
                os._exit(code)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
    pictures = {}
    for name, path, log, golden, title, verdict in jobs:
        png = path if path.is_file() else plot.loss_curve(path, log, golden, title, verdict)
        pictures[name] = str(png.relative_to(session.run_dir)) if png else None
    return pictures


def write_report(session, profile_name: str, judged: dict, pictures: dict) -> None:
    """report.json / report.md in the run directory."""
    report.write(session.run_dir, report.build(profile_name, session.outcomes, judged, {
        "wall_s": getattr(session, "wall_s", None), "loss_curves": pictures,
        "stages": {n: round(s.duration_s, 2) for n, s in session.stages.items()}}))
