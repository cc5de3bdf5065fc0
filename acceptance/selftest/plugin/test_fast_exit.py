"""After a training session pytest's process ends with os._exit once pytest is done (harness.plugin.pytest_plugin): the
exit status, the summary, the JUnit file and atexit handlers are all still there; --no-fast-exit leaves it to
Python."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CONFTEST = '''
import atexit, os, pathlib, pytest
from harness.plugin.options import FAST_EXIT_KEY

@pytest.fixture
def trained(request):
    """What the GPU session fixture does once its runs trained."""
    request.config.stash[FAST_EXIT_KEY] = not request.config.getoption("no_fast_exit")
    atexit.register(lambda: pathlib.Path("atexit-ran").write_text("yes"))


_real_exit = os._exit


def _marked_exit(code):
    """os._exit, leaving a note that the fast exit ended the process, and with which status."""
    pathlib.Path("fast-exit").write_text(str(code))
    _real_exit(code)


os._exit = _marked_exit
'''


@pytest.mark.parametrize("outcome, code", [("pass", 0), ("fail", 1)])
@pytest.mark.parametrize("flag", [(), ("--no-fast-exit",)])
def test_exit_status_summary_junit_and_atexit_survive(tmp_path, outcome, code, flag):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(textwrap.dedent(f'''
        def test_it(trained):
            assert "{outcome}" == "pass"
        '''))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=j.xml",
                          *flag, "test_it.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stdout + out.stderr
    assert ("1 passed" if code == 0 else "1 failed") in out.stdout
    assert "<testcase" in (tmp_path / "j.xml").read_text()
    assert (tmp_path / "atexit-ran").read_text() == "yes"
    fast = tmp_path / "fast-exit"
    assert fast.exists() != bool(flag), "the process ended with os._exit unless --no-fast-exit"
    assert not fast.exists() or fast.read_text() == str(code)


def test_no_fast_exit_without_a_training_session(tmp_path):
    """A run that trained nothing (the CPU suite, --from-log, --reuse-run) ends as Python ends it."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text("def test_it():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    assert not (tmp_path / "fast-exit").exists()
