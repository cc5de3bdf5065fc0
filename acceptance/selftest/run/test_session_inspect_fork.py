"""The live session inspects each checkpoint folder in a fork of its pre-imported server, never in a fresh
interpreter, and the inspection stays bounded there: its own process in its own session, the inspector's
address-space and CPU-time rlimits set in it, the wall clock enforced from outside. An inspection that eats memory
or hangs (the server here imports a hook that makes inspections of folders so named misbehave) ends in the budget's
report, the grader's limit, and the session goes on."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from harness.base.paths import REPO
from harness.evidence.checkpoints.inspector import BUDGET_MB
from harness.run.forkserver import PRELOAD, ForkServer
from harness.run.runs import RunSpec
from harness.run.session import Session

pytestmark = pytest.mark.slow   # the server imports torch and megatron-core; one inspection hangs for its budget

HOOK_BUDGET_S = 6
HOOK = textwrap.dedent(f'''
    """Imported by this test's fork server only: every inspection says where it ran; folders named eats-memory or
    hangs make it map address space until refused, or spin, as a hostile checkpoint would."""
    import json, mmap, os, resource, sys
    from pathlib import Path

    from harness.evidence.checkpoints import inspector

    inspector.BUDGET_S = {HOOK_BUDGET_S}   # this server's inspections: a short wall-clock budget
    real = inspector.inspect_with_notes


    def hooked(save_dir, *args, **kwargs):
        run = Path(save_dir).parent   # RUN_DIR/<run>/checkpoints
        stage_stat = Path(f"/proc/{{os.getppid()}}/stat").read_text()   # the waiting stage, read while it waits
        probe = {{"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
                  "stage_ppid": int(stage_stat.rsplit(")", 1)[1].split()[1]),
                  "cmdline": Path("/proc/self/cmdline").read_bytes().decode(errors="replace"),
                  "torch": "torch" in sys.modules, "megatron": "megatron.core" in sys.modules,
                  "as": resource.getrlimit(resource.RLIMIT_AS), "cpu": resource.getrlimit(resource.RLIMIT_CPU)}}
        (run / "probe.json").write_text(json.dumps(probe))
        if run.name == "eats-memory":
            held = []
            while True:
                try:
                    held.append(mmap.mmap(-1, 256 << 20))   # address space, never touched
                except OSError:
                    raise MemoryError(f"refused after {{len(held) * 256}} MB")
        if run.name == "hangs":
            while True:
                pass
        return real(save_dir, *args, **kwargs)


    inspector.inspect_with_notes = hooked
''')


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "inspect_hook.py").write_text(HOOK)
    run_dir = tmp_path_factory.mktemp("session")
    server = ForkServer.start(modules=(*PRELOAD, "inspect_hook"), log_path=run_dir / "forkserver.log",
                              env={"PYTHONPATH": f"{hooks}:{REPO}"})
    assert server.ready(), server.why_not_ready()
    assert "inspect_hook" not in server.info["missing"], server.info["missing"]
    s = Session(run_dir, fork_server=server)
    yield s
    s.close()


def _inspect(session: Session, name: str):
    """The session's inspection of a copy of a real save's small files as run `name`'s --save folder: the report
    (from the inspection's own process: never the fallback in this one) and what the hook saw."""
    spec = RunSpec(name, "a run whose checkpoint folder is " + name)
    save = session.save_dir(spec)
    shutil.copytree(REPO / "fixtures" / "checkpoints" / "core_v0.16.1", save)
    report = session._inspect(spec, save)
    assert (save.parent / "checkpoints-report.json").is_file(), "inspected in this process, not in the fork"
    probe = save.parent / "probe.json"
    return report, json.loads(probe.read_text()) if probe.is_file() else None


def test_the_inspection_is_a_fork_of_the_server_in_a_session_of_its_own(session):
    """The hook ran (it exists in the server only), in a child of a fork of the server whose command line is the
    server's (no exec), with torch and megatron-core imported before it started, under the inspector's limits."""
    report, probe = _inspect(session, "good")
    assert probe is not None, "the inspection did not run in a fork of the server"
    server = session.forkserver.proc.pid
    assert probe["stage_ppid"] == server and probe["ppid"] != server and probe["sid"] == probe["pid"]
    assert probe["cmdline"] == Path(f"/proc/{server}/cmdline").read_bytes().decode(errors="replace")
    assert probe["torch"] and probe["megatron"]
    assert probe["cpu"] == [HOOK_BUDGET_S + 5, HOOK_BUDGET_S + 10]
    assert probe["as"][0] >= BUDGET_MB << 20   # the budget on top of what the server maps
    assert report.format == "torch_dist" and report.shapes_ok and report.tracker == 200   # the real inspection
    assert report.problems and all("distcp" in p for p in report.problems)   # the fixture's shards are not there


def test_an_inspection_that_eats_memory_is_stopped_by_the_address_space_limit(session):
    report, probe = _inspect(session, "eats-memory")
    assert probe is not None
    assert len(report.problems) == 1 and "the checkpoint inspector stopped" in report.problems[0], report.problems
    assert f"over its {BUDGET_MB} MB address-space budget" in report.problems[0]
    assert "refused after" in report.problems[0] and not report.loaded


def test_an_inspection_that_hangs_is_killed_at_the_wall_clock_budget(session):
    import time

    start = time.monotonic()
    report, probe = _inspect(session, "hangs")
    assert probe is not None and time.monotonic() - start < HOOK_BUDGET_S + 20
    assert len(report.problems) == 1 and f"ran past its {HOOK_BUDGET_S} s budget" in report.problems[0], report.problems
    assert not Path(f"/proc/{probe['pid']}").exists() or " Z " in Path(f"/proc/{probe['pid']}/stat").read_text()
