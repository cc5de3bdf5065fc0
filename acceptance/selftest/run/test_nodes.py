"""harness.run.nodes: two torchrun agents on one host rendezvous (c10d) into one world, and a failing node stops it.

The program under the agents is a few lines of Python, not the trainer (test_parallel_cpu.py trains under them):
what is tested here is the launch itself, fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.run import nodes
from harness.run.launch import StageSpec, current_pids, run_stage
from harness.run.session import python_env
from harness.base.proc import free_port

pytestmark = pytest.mark.slow

STAGE_TIMEOUT_S = 120.0
GRACE_S = 2.0
# Each worker records what torchrun gave it, then exits with the code its rank is told to (EXIT_<rank>, default 0)
# or, with SLEEP_<rank>, waits that long first (a peer that never notices the other node failed).
WORKER = '''\
import json, os, pathlib, sys, time
rank = os.environ["RANK"]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT")
pathlib.Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
time.sleep(float(os.environ.get(f"SLEEP_{rank}", "0")))
sys.exit(int(os.environ.get(f"EXIT_{rank}", "0")))
'''


def launch(tmp_path: Path, env: dict | None = None, devices=("a", "b")):
    """The two agents running WORKER as one stage; (result, {rank: what it saw})."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = nodes.command(2, free_port(), [str(script), str(tmp_path)], list(devices), fail_grace_s=GRACE_S)
    spec = StageSpec("nodes", tuple(argv), STAGE_TIMEOUT_S, env=python_env(env), cwd=str(tmp_path))
    result = run_stage(spec, tmp_path)
    seen = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    return result, seen


def test_two_agents_form_one_world_each_on_its_own_device(tmp_path):
    """Ranks 0 and 1 of a world of 2, one per agent (group rank 0 and 1), each seeing only its own device."""
    result, seen = launch(tmp_path)
    assert result.ok, result.failure_message()
    assert sorted(seen) == [0, 1], seen
    assert {s["WORLD_SIZE"] for s in seen.values()} == {"2"}, seen
    assert {s["LOCAL_RANK"] for s in seen.values()} == {"0"}, seen                 # one process per node
    assert sorted(s["GROUP_RANK"] for s in seen.values()) == ["0", "1"], seen      # two nodes
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen.values()) == ["a", "b"], seen
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen.values()}) == 1, seen


def test_a_failing_node_fails_the_launch_and_stops_the_other(tmp_path):
    """Rank 0 exits 3 while rank 1 would sleep 600 s: the launch exits non-zero within the grace, nothing left."""
    started = time.monotonic()
    result, seen = launch(tmp_path, env={"EXIT_0": "3", "SLEEP_1": "600"})
    assert result.returncode not in (0, None) and not result.timed_out, result.failure_message()
    assert time.monotonic() - started < STAGE_TIMEOUT_S / 2, "the surviving agent was not stopped in time"
    assert sorted(seen) == [0, 1], seen
    assert not current_pids(result), f"still running: {sorted(current_pids(result))}"


def test_devices_must_match_the_nodes(capsys):
    """One device for two nodes is refused, saying what to give."""
    with pytest.raises(SystemExit) as exit_info:
        nodes.main(["--nnodes", "2", "--rdzv-port", "1", "--devices", "0", "--", "-m", "harness.train"])
    assert exit_info.value.code == 2 and "give one per node" in capsys.readouterr().err
