"""Loss-curve pictures: a run's lm loss and validation points over its recipe's golden band (matplotlib, headless).

Drawn for every judged run, live or submitted: the golden mean +/- tolerance as a band, skipped iterations as
marks on the x axis, the course's own final-loss claim shaded for reference, and the verdict in the title.
A picture draws at most MAX_POINTS points per series (a huge log is thinned evenly, first and last kept), so its
cost and matplotlib's cell-block limit do not depend on the log's size; non-finite losses are marked, not drawn.
``LossCurvePainter`` keeps one figure per golden band and only swaps the data, for drawing many pictures.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

from harness.judge import criteria

COURSE_PROFILE = "course"
MAX_POINTS = 2000
MAX_TITLE = 100
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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

    threading.Thread(target=_pyplot, daemon=True, name="matplotlib-import").start()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def thin(points: list, limit: int = MAX_POINTS) -> list:
    """At most `limit` evenly spaced items of `points`, the first and the last always kept."""
    if len(points) <= limit:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def plain_title(text: str) -> str:
    """A title matplotlib draws as written: control characters shown as '?', '$' not taken for mathtext."""
    text = _UNPRINTABLE.sub("?", text)
    text = text if len(text) <= MAX_TITLE else text[:MAX_TITLE - 3] + "..."
    return text.replace("$", r"\$")


class LossCurvePainter:
    """Draws loss-curve PNGs, reusing one figure (fixed layout) per golden band: only the run's data changes."""

    def __init__(self):
        self._figures = {}

    def _figure(self, golden):
        """(fig, ax, artists, (ymin, ymax) of the static parts) for this golden band, built once."""
        key = id(golden)
        if key in self._figures:
            return self._figures[key][1:]
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
        fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.12)
        static_y, static_x = [], [0.0]
        band = _course_band()
        if band:
            ax.axhspan(*band, color="tab:orange", alpha=0.12, label=f"course's claim ({band[0]:g}-{band[1]:g})")
            static_y += list(band)
        for metric, color in (("lm loss", "tab:blue"), ("validation lm loss", "tab:green")):
            g = golden.metrics.get(metric) if golden is not None else None
            if g is not None:
                lo = [m - t for m, t in zip(g.mean, g.tol)]
                hi = [m + t for m, t in zip(g.mean, g.tol)]
                ax.fill_between(g.iterations, lo, hi, color=color, alpha=0.18, label=f"golden {metric} band")
                static_y += lo + hi
                static_x += list(g.iterations)
        artists = {
            "loss": ax.plot([], [], "o-", color="tab:blue", ms=3, lw=1.2, label="lm loss (logged)")[0],
            "nan": ax.plot([], [], "v", color="tab:red", ms=7, label="NaN loss")[0],
            "val": ax.plot([], [], "s", color="tab:green", ms=6, label="validation lm loss")[0],
            "skipped": ax.plot([], [], "x", color="tab:red", ms=6, label="interval with skipped iterations")[0],
        }
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        static = [a for a in ax.patches + ax.collections]
        self._figures[key] = (golden, fig, ax, artists, static, (static_x, static_y))
        return fig, ax, artists, static, (static_x, static_y)

    def png(self, log, golden=None, title: str = "", verdict: str | None = None) -> bytes | None:
        """The picture as PNG bytes; None when the log has no lm loss to draw."""
        series = criteria.metric_series(log, "lm loss") if log is not None else []
        if not series:
            return None
        fig, ax, artists, static, (static_x, static_y) = self._figure(golden)
        points = thin([(s[0], s[1]) for s in series])
        its = [p[0] for p in points]
        values = [p[1] if math.isfinite(p[1]) else math.nan for p in points]
        finite = [v for v in values if math.isfinite(v)]
        ys = finite + static_y
        top, bottom = (max(ys), min(ys)) if ys else (1.0, 0.0)
        artists["loss"].set_data(its, values)
        nan = thin([r.iteration for r in log.iterations
                    if (r.nan or 0) > 0 or (r.lm_loss is not None and not math.isfinite(r.lm_loss))])
        artists["nan"].set_data(nan, [top + 0.2] * len(nan))
        val = thin([(v[0], v[1]) for v in criteria.metric_series(log, "validation lm loss") if math.isfinite(v[1])])
        artists["val"].set_data([v[0] for v in val], [v[1] for v in val])
        skipped = thin([r.iteration for r in log.iterations if (r.skipped or 0) > 0])
        artists["skipped"].set_data(skipped, [bottom - 0.15] * len(skipped))
        xs = its + nan + skipped + static_x
        ylo, yhi = bottom - (0.15 if skipped else 0), top + (0.2 if nan else 0)
        xpad, ypad = 0.05 * ((max(xs) - min(xs)) or 1), 0.05 * ((yhi - ylo) or 1)
        ax.set_xlim(min(xs) - xpad, max(xs) + xpad)
        ax.set_ylim(ylo - ypad, yhi + ypad)
        heading = plain_title(title) + (f" - {verdict.upper()}" if verdict else "")
        ax.set_title(heading, fontsize=10, color="tab:red" if verdict == "fail" else "black")
        shown = static + [a for a in artists.values() if len(a.get_xdata())]
        ax.legend(handles=shown, fontsize=7, loc="center right", framealpha=0.9)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    def close(self) -> None:
        """Free the figures."""
        plt = _pyplot()
        for _, fig, *_ in self._figures.values():
            plt.close(fig)
        self._figures.clear()


def loss_curve(path: Path, log, golden=None, title: str = "", verdict: str | None = None) -> Path | None:
    """Write the picture to `path` (PNG); None when the log has no lm loss to draw."""
    painter = LossCurvePainter()
    try:
        data = painter.png(log, golden, title, verdict)
    finally:
        painter.close()
    if data is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
