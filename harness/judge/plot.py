"""Loss-curve pictures: a run's lm loss and validation points over its recipe's golden band (matplotlib, headless).

Drawn for every judged run, live or submitted: the golden mean +/- tolerance as a band, skipped iterations as
marks on the x axis, the course's own final-loss claim shaded for reference, and the verdict in the title.
"""

from __future__ import annotations

from pathlib import Path

from harness.judge import criteria

COURSE_PROFILE = "course"


def _course_band() -> tuple[float, float] | None:
    """The course's own final-loss band (its text says 6-7), from the course profile."""
    try:
        c = criteria.load_profile(COURSE_PROFILE).by_id("final-loss")
    except (criteria.CriteriaError, KeyError):
        return None
    return c.params["lo"], c.params["hi"]


def preload_in_background() -> None:
    """Import matplotlib (headless) in a daemon thread: a session starts this while its runs train, so drawing
    the pictures afterwards does not wait for the import (~0.3 s)."""
    import threading

    def load() -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401

    threading.Thread(target=load, daemon=True, name="matplotlib-import").start()


def loss_curve(path: Path, log, golden=None, title: str = "", verdict: str | None = None) -> Path | None:
    """Write the picture to `path` (PNG); None when the log has no lm loss to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = criteria.metric_series(log, "lm loss") if log is not None else []
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    try:
        band = _course_band()
        if band:
            ax.axhspan(*band, color="tab:orange", alpha=0.12, label=f"course's claim ({band[0]:g}-{band[1]:g})")
        for metric, color in (("lm loss", "tab:blue"), ("validation lm loss", "tab:green")):
            g = golden.metrics.get(metric) if golden is not None else None
            if g is not None:
                lo = [m - t for m, t in zip(g.mean, g.tol)]
                hi = [m + t for m, t in zip(g.mean, g.tol)]
                ax.fill_between(g.iterations, lo, hi, color=color, alpha=0.18, label=f"golden {metric} band")
        import math

        its, values = [s[0] for s in series], [s[1] for s in series]
        ax.plot(its, values, "o-", color="tab:blue", ms=3, lw=1.2, label="lm loss (logged)")
        nan = [r.iteration for r in log.iterations
               if (r.nan or 0) > 0 or (r.lm_loss is not None and not math.isfinite(r.lm_loss))]
        if nan:
            top = max(v for v in values if math.isfinite(v))
            ax.plot(nan, [top + 0.2] * len(nan), "v", color="tab:red", ms=7, label="NaN loss")
        val = criteria.metric_series(log, "validation lm loss")
        if val:
            ax.plot([v[0] for v in val], [v[1] for v in val], "s", color="tab:green", ms=6, label="validation lm loss")
        skipped = [r.iteration for r in log.iterations if (r.skipped or 0) > 0]
        if skipped:
            ymin = min([v for v in values if math.isfinite(v)] + ([band[0]] if band else []))
            ax.plot(skipped, [ymin - 0.15] * len(skipped), "x", color="tab:red", ms=6,
                    label="interval with skipped iterations")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        heading = title + (f" - {verdict.upper()}" if verdict else "")
        ax.set_title(heading, fontsize=10, color="tab:red" if verdict == "fail" else "black")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center right", framealpha=0.9)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
