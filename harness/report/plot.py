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
from collections import OrderedDict
from pathlib import Path

from harness.base.errors import CriteriaError
from harness.judge.profiles import load_profile, metric_series

COURSE_PROFILE = "course"
MAX_POINTS = 2000
MAX_TITLE = 100
MAX_BACKGROUNDS = 16        # rendered figure backgrounds kept per painter (axes, ticks, bands, legend)
PNG_COMPRESSION = 3         # zlib level: 6 took twice as long for 8% smaller files
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _course_band() -> tuple[float, float] | None:
    """The course's own final-loss band (its text says 6-7), from the course profile."""
    try:
        c = load_profile(COURSE_PROFILE).by_id("final-loss")
    except (CriteriaError, KeyError):
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


PLOT_CLIP = 1e12   # a value beyond +-PLOT_CLIP (a loss of 1.7e308) is drawn at the clip: the axes never overflow


def _clip(v):
    """A finite value clipped to +-PLOT_CLIP (the criteria judge the value itself; only the picture is clipped)."""
    return max(-PLOT_CLIP, min(PLOT_CLIP, v)) if isinstance(v, (int, float)) and math.isfinite(v) else v


def _limits(xs: list, ys: list) -> tuple:
    """Axis limits from rounded data extents (x up to 2 significant digits, y to whole numbers), with margins: most
    runs share them, so their pictures share one rendered background."""
    xmax = max(xs + [1])
    step = 10 ** max(0, int(math.log10(xmax)) - 1) if xmax >= 1 else 1
    xhi, xlo = math.ceil(xmax / step) * step, min(xs + [0])
    ylo, yhi = (math.floor(min(ys)), math.ceil(max(ys))) if ys else (0, 1)
    yhi = yhi if yhi > ylo else ylo + 1
    xpad, ypad = 0.04 * (xhi - xlo or 1), 0.08 * (yhi - ylo)
    return (xlo - xpad, xhi + xpad), (ylo - ypad, yhi + ypad)


class LossCurvePainter:
    """Draws loss-curve PNGs, reusing one figure (fixed layout) per golden band and one rendered background per
    set of axis limits: per picture only the run's points and the title are drawn."""

    def __init__(self):
        self._figures = {}
        self._backgrounds = OrderedDict()

    def _figure(self, golden):
        """(fig, ax, artists, (ymin, ymax) of the static parts) for this golden band, built once."""
        key = id(golden)
        if key in self._figures:
            return self._figures[key][1:]
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
        fig.subplots_adjust(left=0.07, right=0.72, top=0.92, bottom=0.12)
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

    def png(self, log, golden=None, title: str = "", verdict: str | None = None, cause: str | None = None,
            warmup: int = 0) -> bytes | None:
        """The picture as PNG bytes; None when the log has no lm loss to draw. The title ends with the verdict and
        the root cause's id (`- FAIL: nan`); skips in intervals ending by `warmup` (the fp16 loss-scale search the
        profile expects, warmup_of) are not marked: only the skips its criterion counts are."""
        series = metric_series(log, "lm loss") if log is not None else []
        if not series:
            return None
        fig, ax, artists, static, (static_x, static_y) = self._figure(golden)
        points = thin([(_clip(s[0]), _clip(s[1])) for s in series])
        data = {"loss": ([p[0] for p in points], [p[1] if math.isfinite(p[1]) else math.nan for p in points])}
        val = thin([(_clip(v[0]), _clip(v[1])) for v in metric_series(log, "validation lm loss")
                    if math.isfinite(v[1])])
        data["val"] = ([v[0] for v in val], [v[1] for v in val])
        nan = thin([r.iteration for r in log.iterations
                    if (r.nan or 0) > 0 or (r.lm_loss is not None and not math.isfinite(r.lm_loss))])
        skipped = thin([r.iteration for r in log.iterations if (r.skipped or 0) > 0 and r.iteration > warmup])
        xlim, ylim = _limits(data["loss"][0] + data["val"][0] + nan + skipped + static_x,
                             [v for v in data["loss"][1] + data["val"][1] if math.isfinite(v)] + static_y)
        span = ylim[1] - ylim[0]
        data["nan"] = (nan, [ylim[1] - 0.04 * span] * len(nan))          # in the margins the limits leave
        data["skipped"] = (skipped, [ylim[0] + 0.04 * span] * len(skipped))
        shown = tuple(name for name in artists if data[name][0])
        canvas = fig.canvas
        canvas.restore_region(self._background(golden, xlim, ylim, shown))
        for name in shown:
            artists[name].set_data(*data[name])
            ax.draw_artist(artists[name])
        ax.title.set_text(plain_title(title + (f" - {verdict.upper()}" if verdict else "")
                                      + (f": {cause}" if verdict and cause else "")))
        ax.title.set_color("tab:red" if verdict == "fail" else "black")
        ax.draw_artist(ax.title)
        from PIL import Image

        width, height = canvas.get_width_height()
        buf = io.BytesIO()
        rgba = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        rgba.convert("RGB").save(buf, format="png", compress_level=PNG_COMPRESSION)  # opaque: RGB encodes faster
        return buf.getvalue()

    def _background(self, golden, xlim, ylim, shown):
        """The figure without the run's data and title, rendered once per (band, limits, legend entries)."""
        key = (id(golden), xlim, ylim, shown)
        if key in self._backgrounds:
            self._backgrounds.move_to_end(key)
            return self._backgrounds[key]
        fig, ax, artists, static, _ = self._figure(golden)
        for artist in (*artists.values(), ax.title):
            artist.set_animated(False)       # a legend copies `animated` from its handles: draw them there
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.legend(handles=static + [artists[name] for name in shown], fontsize=7, loc="center left",
                  bbox_to_anchor=(1.01, 0.5), framealpha=0.9)  # beside the axes: the points are never under it
        for artist in (*artists.values(), ax.title):
            artist.set_animated(True)        # left out of the background, drawn per picture
        fig.canvas.draw()
        self._backgrounds[key] = fig.canvas.copy_from_bbox(fig.bbox)
        if len(self._backgrounds) > MAX_BACKGROUNDS:
            self._backgrounds.popitem(last=False)
        return self._backgrounds[key]

    def close(self) -> None:
        """Free the figures."""
        plt = _pyplot()
        for _, fig, *_ in self._figures.values():
            plt.close(fig)
        self._figures.clear()
        self._backgrounds.clear()


def warmup_of(profile) -> int:
    """The iterations of fp16's loss-scale search where skips are expected: the profile's skips_only_before
    criterion's `iteration` (40), else the reference profile's (a profile that does not judge skips, like
    `course`, still runs the same fp16 warm-up); 0 when neither has one: then every skip is marked."""
    from harness.judge.profiles import load_profile

    for p in (profile, load_profile("reference")):
        found = [int(c.params.get("iteration", 0)) for c in getattr(p, "criteria", ()) if c.kind == "skips_only_before"]
        if found:
            return found[0]
    return 0


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
