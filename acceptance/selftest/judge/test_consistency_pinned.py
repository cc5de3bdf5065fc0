"""Pinned examples of harness.judge.consistency's property tests that draw with st.data() (which @example cannot
pin): the example that once found a bug, as a plain test (issue 43). 5789283: a 0.2 s timestamp shift on the 28 s
first interval of a micro-batch-1 run is within the log's own jitter; the property now shifts by 0.2 s + 2 % of the
interval, and at that lower bound the edit is caught, on both micro-batch-1 real logs, either way."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from harness.base.paths import REPO
from harness.evidence import logs
from harness.evidence.logformat import TIMESTAMP_FORMAT
from harness.judge import consistency
from harness.judge.submission import evidence

MBS1 = [REPO / "fixtures/logs/population/a-mbs1-s3104.log.gz", REPO / "fixtures/logs/population/b-mbs1-s3101.log.gz"]


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("path", MBS1, ids=lambda p: p.name)
def test_a_timestamp_shift_at_the_propertys_lower_bound_on_the_long_first_interval_is_caught(path, sign):
    log = evidence(path).log
    assert log.arguments["micro_batch_size"] in (1, "1")
    recs = [r for r in log.iterations if r.timestamp]
    rec, before = recs[1], recs[0]
    interval_s = (rec.elapsed_ms or 0.0) * max(1, rec.iteration - before.iteration) / 1000
    assert interval_s > 15                                           # the long first interval (18-28 s)
    shift = sign * (0.2 + 0.02 * interval_s)
    when = datetime.strptime(rec.timestamp, TIMESTAMP_FORMAT) + timedelta(seconds=shift)
    lines = list(log.lines)
    lines[rec.line_no - 1] = lines[rec.line_no - 1].replace(rec.timestamp, when.strftime(TIMESTAMP_FORMAT))
    result = consistency.check_log(logs.parse_log("\n".join(lines) + "\n"))
    nxt = {r.line_no for r in recs if r.iteration > rec.iteration}
    assert any(b.check == "timestamps" and (b.line == rec.line_no or b.line in nxt) for b in result.breaks), \
        [b.message for b in result.breaks]
