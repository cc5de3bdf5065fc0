"""Boundary tests of the log reader's thresholds (harness.evidence.logread), each at the value, just under and just over.

Thresholds: a wrapping style counts when AT LEAST HALF of the non-blank lines of the first DETECT_LINES lines carry
it (blank lines do not count); only the first DETECT_LINES lines are looked at; a line over MAX_LINE_CHARS is cut
(and counted); at most MAX_WRAPPERS wrappings come off one line. The lines are real Megatron-LM core_v0.16.1 lines
(fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log), wrapped the way the real launchers wrap them.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from harness.evidence import logread, logs
from harness.base.paths import FIXTURES

REAL_LOG = FIXTURES / "logs" / "core_v0.16.1_h200_course_flags_binary_head.log"
REAL_LINES = REAL_LOG.read_text().splitlines()
ITERATIONS = len(logs.parse_log(REAL_LOG.read_text()).iterations)        # what the plain log parses to (21)
# one real prefix per style, as the launchers write them
STYLE_PREFIX = {"torchrun-prefix": "[default0]:", "srun-label": "0: ", "iso-timestamp": "2026-11-29T14:17:59.537Z ",
                "datetime-stamp": "2026-11-29 14:17:59 ", "clock-stamp": "[14:17:59] "}
PLAIN = [line for line in REAL_LINES if line.strip() and not logread.detect_wrappers([line])]


def test_every_style_has_a_prefix_here():
    """The table above covers every style the reader knows (a new style needs its boundary test too)."""
    assert set(STYLE_PREFIX) == set(logread.WRAPPERS)
    for name, prefix in STYLE_PREFIX.items():
        assert logread.detect_wrappers([prefix + PLAIN[0]]) == (name,), name
    assert len(PLAIN) > 2 * logread.DETECT_LINES and ITERATIONS >= 20


def wrapped_log(prefix: str, carried: int, window: int) -> str:
    """The real log with `carried` of the first `window` non-blank lines wrapped (spread among them), every line
    after the window wrapped, blank lines kept as they are (they do not count)."""
    out, seen = [], 0
    step = window / carried if carried else 0
    marks = {int(i * step) for i in range(carried)} if carried else set()
    for line in REAL_LINES:
        if not line.strip():
            out.append(line)
            continue
        wrap = (seen in marks) if seen < window else True
        out.append(prefix + line if wrap else line)
        seen += 1
    return "\n".join(out) + "\n"


def head_window(text: str) -> int:
    """Non-blank lines among the first DETECT_LINES lines of a text."""
    return sum(1 for line in text.splitlines()[: logread.DETECT_LINES] if line.strip())


NONBLANK_HEAD = head_window("\n".join(REAL_LINES))


def test_exactly_half_the_lines_wrapped_is_detected_and_every_iteration_parses():
    """'At least half': at exactly half the prefixes come off, and every iteration line (all wrapped) parses."""
    for name, prefix in STYLE_PREFIX.items():
        half = NONBLANK_HEAD // 2 if NONBLANK_HEAD % 2 == 0 else (NONBLANK_HEAD + 1) // 2
        text = wrapped_log(prefix, half, NONBLANK_HEAD)
        head = text.splitlines()[: logread.DETECT_LINES]
        assert sum(1 for line in head if line.startswith(prefix)) * 2 >= head_window(text)
        parsed = logs.parse_log(text)
        assert len(parsed.iterations) == ITERATIONS, (name, len(parsed.iterations))
        assert any(logread.WRAPPER_WORDS[name] in note for note in parsed.source), (name, parsed.source)


def test_the_boundary_of_detect_wrappers_on_even_and_odd_counts():
    """n non-blank lines, m carry a style: detected iff 2m >= n (m = n/2 yes, n/2 - 1 no; odd n: ceil yes)."""
    for name, prefix in STYLE_PREFIX.items():
        for n in (2, 3, 4, 9, 10, 64, 255, 256):
            lines = [prefix + PLAIN[i] if i < (n + 1) // 2 else PLAIN[i] for i in range(n)]
            assert logread.detect_wrappers(lines) == (name,), (name, n, "at half")
            under = [prefix + PLAIN[i] if i < (n + 1) // 2 - 1 else PLAIN[i] for i in range(n)]
            assert logread.detect_wrappers(under) == (), (name, n, "one under half")
            over = [prefix + PLAIN[i] if i < (n + 1) // 2 + 1 else PLAIN[i] for i in range(n)]
            assert logread.detect_wrappers(over) == (name,), (name, n, "one over half")


def test_blank_lines_do_not_count_toward_the_half():
    """Two wrapped lines among four non-blank ones and any number of blank lines: still at least half."""
    lines = ["[rank0]:" + PLAIN[0], PLAIN[1], "", "   ", "[rank0]:" + PLAIN[2], PLAIN[3]] + [""] * 50
    assert logread.detect_wrappers(lines) == ("torchrun-prefix",)
    assert logread.detect_wrappers([""] * 10) == ()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 200), data=st.data(), style=st.sampled_from(sorted(STYLE_PREFIX)))
def test_detected_iff_at_least_half_over_real_lines(n, data, style):
    """Property: over real lines, any positions wrapped; the style is detected exactly when 2 * wrapped >= n."""
    start = data.draw(st.integers(0, len(PLAIN) - n))
    picked = data.draw(st.sets(st.integers(0, n - 1), max_size=n))
    lines = [STYLE_PREFIX[style] + PLAIN[start + i] if i in picked else PLAIN[start + i] for i in range(n)]
    assert (logread.detect_wrappers(lines) == (style,)) == (2 * len(picked) >= n)


def test_only_the_first_detect_lines_are_looked_at():
    """Prefixes only from line DETECT_LINES + 1 on are not a wrapping; from line DETECT_LINES on they count."""
    k = logread.DETECT_LINES
    for first_wrapped, detected in ((k, False), (k - 1, False), (k // 2, True), (k // 2 + 1, False)):
        lines = [("[rank0]:" if i >= first_wrapped else "") + PLAIN[i] for i in range(2 * k)]
        info = logread.ReadInfo("(text)")
        out = list(logread.unwrap(iter(lines), info))
        assert bool(info.wrappers) == detected, (first_wrapped, info.wrappers)
        assert len(out) == 2 * k and out[0][1] == PLAIN[0]


def test_line_length_cap_at_under_and_over():
    """A line of exactly MAX_LINE_CHARS is kept whole; one character more is cut to MAX_LINE_CHARS and counted."""
    cap = logread.MAX_LINE_CHARS
    for length, cut in ((cap - 1, 0), (cap, 0), (cap + 1, 1)):
        info = logread.ReadInfo("(text)")
        got = list(logread.text_lines("x" * length + "\nnext\n", info))
        assert got == ["x" * min(length, cap), "next"] and info.cut_lines == cut, length


def test_at_most_max_wrappers_come_off_one_line():
    """Each style comes off once, outermost first, at most MAX_WRAPPERS of them."""
    order = ["iso-timestamp", "srun-label", "torchrun-prefix"]
    line = "".join(STYLE_PREFIX[s] for s in order) + PLAIN[0]
    info = logread.ReadInfo("(text)")
    (rank, text), = logread.unwrap(iter([line]), info)
    assert info.wrappers == tuple(order) and text == PLAIN[0] and rank == (0, 0)
    assert logread.MAX_WRAPPERS >= len(order)
    # the same style twice: only the outer one comes off (the inner is the rank's own text)
    twice = "[default0]:[rank0]:" + PLAIN[0]
    (rank, text), = logread.unwrap(iter([twice]), logread.ReadInfo("(text)"))
    assert text == "[rank0]:" + PLAIN[0] and rank == (0,)
