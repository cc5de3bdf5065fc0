"""--wait-for-load's wait (harness.train.ckpt.wait_for_iteration): it returns once the tracker names the
iteration, and otherwise exits naming what to look at: LOAD.failed, or the tracker after the time given."""

from __future__ import annotations

import os
import threading

import pytest

from harness.train import ckpt
from harness.evidence.checkpoints.inspector import TRACKER_FILE, failed_marker


def _save(load, iteration: int) -> None:
    """The tracker as a save writes it: a temporary file, then os.replace."""
    load.mkdir(parents=True, exist_ok=True)
    (load / "tracker.tmp").write_text(str(iteration))
    os.replace(load / "tracker.tmp", load / TRACKER_FILE)


def test_returns_once_the_tracker_names_the_iteration(tmp_path):
    """An earlier save does not end the wait; the save of the iteration (written meanwhile) does."""
    load = tmp_path / "checkpoints"
    _save(load, 50)
    timer = threading.Timer(0.3, _save, (load, 100))
    timer.start()
    try:
        assert ckpt.wait_for_iteration(str(load), 100, seconds=30) == 100
    finally:
        timer.cancel()


def test_failed_marker_ends_the_wait_naming_it(tmp_path):
    load = tmp_path / "checkpoints"
    failed_marker(str(load)).write_text("run 'reference' ended before its tracker named iteration 100\n")
    with pytest.raises(SystemExit) as exit_info:
        ckpt.wait_for_iteration(str(load), 100, seconds=30)
    message = str(exit_info.value.code)
    assert f"{load}.failed" in message and "run 'reference' ended" in message, message


@pytest.mark.parametrize("earlier", [None, 50], ids=["no-tracker", "earlier-save"])
def test_timeout_names_the_tracker_and_the_fix(tmp_path, earlier):
    load = tmp_path / "checkpoints"
    if earlier is not None:
        _save(load, earlier)
    with pytest.raises(SystemExit) as exit_info:
        ckpt.wait_for_iteration(str(load), 100, seconds=0.2)
    message = str(exit_info.value.code)
    state = "does not exist" if earlier is None else f"names iteration {earlier}"
    assert f"{load / TRACKER_FILE} {state}, not iteration 100" in message, message
    assert "--wait-for-load" in message and "Fix:" in message, message
