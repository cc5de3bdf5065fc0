"""Several torchrun agents on one host standing in for several nodes: the multi-node launch, c10d rendezvous.

    python -m harness.run.nodes --nnodes 2 --rdzv-port 29611 --devices 0 1 -- -m harness.train ARGS...

starts one agent per "node", each `torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID`, the i-th seeing only GPU devices[i] (CUDA_VISIBLE_DEVICES),
exactly as N machines would each run it. Both agents write to this process's output. Exits with the first
non-zero agent exit code (0 when all exit 0); once one agent fails, the others get FAIL_GRACE_S to notice
through the rendezvous, then are terminated, so a lost peer never leaves an agent waiting.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid


POLL_S = 0.2
FAIL_GRACE_S = 30.0
HOST = "127.0.0.1"


def agent_argv(nnodes: int, port: int, rdzv_id: str, program: list[str]) -> list[str]:
    """One node's torchrun command: one process on this node, rendezvous through the c10d store at HOST:port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{port}", "--rdzv-id", rdzv_id, *program]


def command(nnodes: int, port: int, program: list[str], devices: list[str] | None = None,
            rdzv_id: str | None = None, fail_grace_s: float | None = None) -> list[str]:
    """The `python -m harness.run.nodes ...` command line that starts the agents of `program`."""
    argv = [sys.executable, "-m", "harness.run.nodes", "--nnodes", str(nnodes), "--rdzv-port", str(port)]
    if devices:
        argv += ["--devices", *devices]
    if rdzv_id:
        argv += ["--rdzv-id", rdzv_id]
    if fail_grace_s is not None:
        argv += ["--fail-grace-s", str(fail_grace_s)]
    return [*argv, "--", *program]


def _stop(agents: list[subprocess.Popen], sig: int) -> None:
    """Send `sig` to every agent still running (torchrun passes SIGTERM on to its worker)."""
    for agent in agents:
        if agent.poll() is None:
            try:
                agent.send_signal(sig)
            except ProcessLookupError:
                pass


def run_agents(nnodes: int, port: int, program: list[str], devices: list[str] | None = None,
               rdzv_id: str | None = None, fail_grace_s: float = FAIL_GRACE_S) -> int:
    """Start the agents, wait for all; the first failure's code, after stopping the rest."""
    rdzv_id = rdzv_id or uuid.uuid4().hex[:12]
    agents = []
    for node in range(nnodes):
        env = dict(os.environ)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices[node]
        agents.append(subprocess.Popen(agent_argv(nnodes, port, rdzv_id, program), env=env))
    failed_at, code = None, 0
    try:
        while any(a.poll() is None for a in agents):
            bad = [a.returncode for a in agents if a.returncode not in (None, 0)]
            if bad and failed_at is None:
                failed_at, code = time.monotonic(), bad[0]
                print(f"harness.run.nodes: an agent exited with code {code}; stopping the others within "
                      f"{fail_grace_s:g} s", file=sys.stderr, flush=True)
            if failed_at is not None and time.monotonic() - failed_at > fail_grace_s:
                break
            time.sleep(POLL_S)
    finally:
        _stop(agents, signal.SIGTERM)   # agents still alive: a peer failed, or we were interrupted; leave none behind
        for agent in agents:
            try:
                agent.wait(timeout=fail_grace_s)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
    return code or next((a.returncode for a in agents if a.returncode), 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness nodes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=2, help="agents (stand-in nodes) to start")
    p.add_argument("--rdzv-port", type=int, required=True, help=f"port of the c10d store on {HOST}")
    p.add_argument("--rdzv-id", default=None, help="rendezvous id shared by the agents (default: a random one)")
    p.add_argument("--devices", nargs="+", default=None,
                   help="CUDA_VISIBLE_DEVICES of each agent, one per node (default: unchanged)")
    p.add_argument("--fail-grace-s", type=float, default=FAIL_GRACE_S,
                   help="once one agent failed, seconds the others get before they are terminated")
    p.add_argument("program", nargs=argparse.REMAINDER, help="after --: what torchrun runs, e.g. -m harness.train ...")
    args = p.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        p.error("give the program after --, e.g. -- -m harness.train --data-path ...")
    if args.nnodes < 1:
        p.error(f"--nnodes must be at least 1, got {args.nnodes}")
    if args.devices is not None and len(args.devices) != args.nnodes:
        p.error(f"--devices names {len(args.devices)} device(s) for {args.nnodes} nodes: give one per node")
    # SIGTERM (a stage timeout) unwinds through run_agents' cleanup: the agents are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run_agents(args.nnodes, args.rdzv_port, program, args.devices, args.rdzv_id, args.fail_grace_s)


if __name__ == "__main__":
    raise SystemExit(main())
