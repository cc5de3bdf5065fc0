"""The suite's pytest options as a plugin that pytest loads before it reads the command line (entry point pytest11).

Options defined in a conftest.py are unknown while pytest first scans its arguments, so in
``pytest -m gpu --from-log /submissions/alice/train.log`` the log path looks like a test path: pytest roots itself
at /submissions/alice, never finds this project's configuration and stops with "unrecognized arguments". As a
plugin the options are known early; when a path option pulled pytest's rootdir away, ``_reroot`` finds the
configuration again from the arguments that really are test paths (or the working directory).
"""

from __future__ import annotations

import argparse
import copy
import inspect
from pathlib import Path

import pytest

from harness.plugin.options import DEPRECATED, FLAGS, OPTIONS, PATH_OPTIONS, deprecated_dest


def pytest_addoption(parser):
    group = parser.getgroup("bert-acceptance")
    for dest, (flag, ini, help_text) in OPTIONS.items():
        if dest in FLAGS:
            group.addoption(flag, dest=dest, action="store_true", default=None, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            group.addoption(flag, dest=dest, default=None, metavar="S" if dest == "stage_timeout" else dest.upper(),
                            help=help_text)
            parser.addini(ini, help_text, default=None)
    for dest, (flag, ini) in DEPRECATED.items():     # old spellings: still read, hidden, one line names the new one
        group.addoption(flag, dest=deprecated_dest(dest), default=None, help=argparse.SUPPRESS)
        parser.addini(ini, f"deprecated: use {OPTIONS[dest][1]}", default=None)


def _determine_setup(early_config, ns):
    """pytest's own rootdir/ini search, on the arguments that remain once the options took their values."""
    from _pytest.config.findpaths import determine_setup

    kwargs = dict(inifile=ns.inifilename, override_ini=getattr(ns, "override_ini", None), args=ns.file_or_dir,
                  rootdir_cmd_arg=ns.rootdir or None, invocation_dir=early_config.invocation_params.dir)
    accepted = inspect.signature(determine_setup).parameters
    found = determine_setup(**{k: v for k, v in kwargs.items() if k in accepted})
    return found[0], found[1], found[2]


def _start_fork_server(early_config, ns) -> None:
    """`pytest -m gpu` that will train: start the session's fork server now, so that torch and megatron-core are
    imported while pytest loads its conftests, collects and runs the preflight (see harness.run.forkserver)."""
    from harness.plugin.options import EARLY_FORK_KEY, wants_fork_server

    if not wants_fork_server(getattr(ns, "markexpr", ""), lambda dest: getattr(ns, dest, None)):
        return
    from pathlib import Path

    from harness.run.session import start_early_fork_server

    run_dir = getattr(ns, "run_dir", None)
    run_dir = Path(early_config.invocation_params.dir, str(run_dir)).resolve() if run_dir else None
    early_config.stash[EARLY_FORK_KEY] = start_early_fork_server(run_dir)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, args, parser):
    """Start the fork server of a training session; re-root pytest when a path given as `--opt PATH` was
    mistaken for a test path."""
    ns = early_config.known_args_namespace
    _start_fork_server(early_config, ns)
    if not any(getattr(ns, dest, None) for dest in PATH_OPTIONS):
        return
    rootpath, inipath, inicfg = _determine_setup(early_config, ns)
    if inipath is None or inipath == early_config.inipath:
        return
    early_config._rootpath, early_config._inipath, early_config._inicfg = rootpath, inipath, inicfg
    early_config._inicache.clear()
    early_config._parser.extra_info.update(rootdir=str(rootpath), inifile=str(inipath))
    args[:] = early_config._validate_args(early_config.getini("addopts"), "via addopts config") + args
    early_config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(early_config.option))
    early_config.known_args_namespace.confcutdir = ns.confcutdir or str(inipath.parent)


_SESSION_KEY = pytest.StashKey()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    session.config.stash[_SESSION_KEY] = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """After a training session (the GPU session fixture sets FAST_EXIT_KEY), end the process here: pytest has
    written its summary, JUnit file and cache; what is left is Python tearing down torch's modules (about 1 s).
    pytest's output capture is stopped first, as its own clean-up would do next."""
    from harness.plugin.options import FAST_EXIT_KEY

    session = config.stash.get(_SESSION_KEY, None)
    if session is None or not config.stash.get(FAST_EXIT_KEY, False):
        return
    from harness.run.forkserver import exit_without_teardown

    try:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.stop_global_capturing()  # idempotent
    finally:
        exit_without_teardown(int(session.exitstatus))


def self_test_workers(cores: int | None) -> int:
    """xdist workers for the CPU self-tests: one more than the cores. Part of their time the tests wait (a stall
    watchdog, a subprocess starting, a grader's grace period), and a spare worker keeps the cores busy then:
    on 2 cores the suite took 206 s with 2 workers and 181 s with 3 (4: 185 s)."""
    return max(1, cores or 1) + 1


def longest_files_first(items, durations: dict[str, float], root) -> None:
    """Order the files longest first, by their recorded seconds (`durations`: a file's path relative to `root` ->
    seconds, acceptance/selftest/durations.json), each file's tests in their own order.

    With `--dist loadfile` xdist hands out files in this order (conftest turns its own reordering, by number of
    tests, off), so the long files start at once on the workers and the short ones fill in at the end: longest
    processing time first. A file with no record (new since the last recording) counts as long when it holds a
    `slow` test, as short otherwise; a stale record only costs balance, never a test."""
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    longest = max(durations.values(), default=0.0)

    def seconds(path) -> float:
        try:
            key = Path(path).relative_to(root).as_posix()
        except ValueError:   # a test file named on the command line from outside the repository: no record
            key = None
        if key in durations:
            return durations[key]
        return longest + 1 if any("slow" in i.keywords for i in by_file[path]) else 0.0

    cost = {path: seconds(path) for path in by_file}
    items.sort(key=lambda item: -cost[item.path])      # stable: collection order within a file and among equals
