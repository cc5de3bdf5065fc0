"""A pre-imported fork server: torch and megatron-core imported once, every run a fork of it.

A fresh interpreter pays 5-12 s of imports (torch, megatron-core, torch.distributed.checkpoint) before its first
line; a session starts ~20 of them at once. The server imports them once, before any CUDA initialisation, and
forks one child per stage on request. Each child is still its own process: it calls setsid() (its own process
group, which the launcher kills on timeout, stall or interrupt exactly as before), gets the stage's environment,
working directory and nice level, writes stdout/stderr into the launcher's pipe, and runs the entry point's
`main(argv)` as `python -m MODULE ARGV` would, atexit handlers included. The server reaps its children and
reports each exit status back, so the launcher sees a Popen-like object (pid, poll, wait, kill, stdout).

Only the entry points in ENTRY_POINTS are forked (the reference trainer, preprocessing, the corpus); anything
else (torchrun, a Megatron-LM checkout's script) starts as a fresh process. When the server cannot start, or
its imports initialised CUDA (a fork would then break CUDA in the child), `spawner()` returns None for every
stage and the launcher starts fresh processes: slower, never different.

    server = ForkServer.start()          # begins importing in the background
    popen = server.spawn(argv, env, cwd) # a ForkedProcess, or None when argv is not a forkable entry point
    server.close()                       # the server exits; children it still has are killed
"""

from __future__ import annotations

import atexit
import gc
import importlib
import inspect
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.base.proc import pid_alive

ENTRY_POINTS = {  # `python -m MODULE` -> the function it runs
    "harness.train": "harness.train.__main__:main",
    "harness.data.preprocess": "harness.data.preprocess:main",
    "harness.data.corpus": "harness.data.corpus:main",
    "harness.evidence.checkpoints.inspector": "harness.evidence.checkpoints.inspector:main",
}
# What the children need, imported once (lazily imported modules included: the first checkpoint save would
# otherwise import torch.distributed.checkpoint in every run).
PRELOAD = ("torch", "numpy", "harness.train.trainer", "harness.train.step", "harness.train.data",
           "harness.train.ckpt", "harness.data.preprocess", "harness.data.corpus", "harness.evidence.checkpoints.inspector",
           "megatron.core.models.bert.bert_model", "megatron.core.models.bert.bert_layer_specs",
           "megatron.core.datasets.bert_dataset", "megatron.core.datasets.blended_megatron_dataset_builder",
           "megatron.core.dist_checkpointing", "megatron.core.dist_checkpointing.strategies.torch",
           "megatron.core.dist_checkpointing.strategies.filesystem_async", "torch.distributed.checkpoint")
READY_TIMEOUT_S = 120.0
MAX_MESSAGE = 1 << 20
NICE_PREFIX = ("nice", "-n")


# ---------------------------------------------------------------- server side (python -m harness.run.forkserver FD)

def _send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _preload(modules: list[str]) -> dict:
    """Import every module that exists; never initialise CUDA (torch.cuda.is_available() asks NVML only).

    When any of them is megatron's, megatron-core is imported first, with a lazy torch.compile (harness.base.imports).
    """
    from harness.base.imports import collector_paused, import_megatron_core

    started = time.monotonic()
    missing = {}

    def attempt(name: str, load) -> None:
        try:
            load()
        except Exception as exc:  # noqa: BLE001 - a module this Python lacks is the child's business, not ours
            missing[name] = f"{type(exc).__name__}: {exc}"
    with collector_paused():  # and frozen: the forks do not walk (or copy the pages of) what the server loaded
        if any(m.startswith("megatron") for m in modules):
            attempt("megatron.core", import_megatron_core)
        for name in modules:
            attempt(name, lambda: importlib.import_module(name))
    torch = sys.modules.get("torch")
    cuda = bool(torch is not None and torch.cuda.is_initialized())
    return {"import_s": round(time.monotonic() - started, 2), "missing": missing, "cuda_initialized": cuda,
            "threads": threading.active_count(), "dynamo_imported": "torch._dynamo" in sys.modules,
            "frozen_objects": gc.get_freeze_count()}


def _child(request: dict, out_fd: int, sock: socket.socket) -> None:
    """In the forked child: become the stage's process and run its entry point; never returns."""
    code = 1
    try:
        os.setsid()
        sock.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        for fd in (null, out_fd):
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        if request.get("nice"):
            os.nice(int(request["nice"]))
        os.chdir(request["cwd"] or os.getcwd())
        os.environ.clear()
        os.environ.update(request["env"])
        module, args = request["module"], list(request["args"])
        sys.argv = [module, *args]
        torch = sys.modules.get("torch")
        if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # libgomp read the server's value at load
        mod_name, func_name = ENTRY_POINTS[module].split(":")
        func = getattr(importlib.import_module(mod_name), func_name)
        result = func(args) if inspect.signature(func).parameters else func()
        code = _exit_code(result)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - print it as the interpreter would, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        exit_without_teardown(code)


def exit_without_teardown(code: int) -> None:
    """What interpreter exit does that matters, then os._exit(code): wait for non-daemon threads, run the atexit
    handlers (multiprocessing's finalizers, the checkpoint writer), flush the streams; no module teardown (with
    torch imported, about 1 s)."""
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the exit status is decided: nothing may stop the exit now
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _exit_code(value) -> int:
    """sys.exit(value)'s exit status: None -> 0, an int as is, anything else printed to stderr -> 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def serve(fd: int, modules: list[str]) -> int:
    """The server's loop: preload, say ready, fork on request, report exits; on EOF kill what is left, exit."""
    sock = socket.socket(fileno=fd)
    info = _preload(modules)
    _send(sock, {"ready": not info["cuda_initialized"], **info})
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.02)
        _reap(sock, children)
        if not readable:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds[0], sock)
        for f in fds:
            os.close(f)
        children.add(pid)
        _send(sock, {"id": request["id"], "pid": pid})
    for pid in children:  # the launcher is gone: no child outlives it (its group, and itself if not yet setsid)
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return 0


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Report every child that exited since the last look: {"pid": ..., "rc": Popen-style returncode}."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            _send(sock, {"pid": pid, "rc": os.waitstatus_to_exitcode(status)})
        except OSError:
            return


# ---------------------------------------------------------------- launcher side

class ForkedProcess:
    """The launcher's handle on a forked child: the subset of subprocess.Popen that run_stage uses."""

    def __init__(self, server: "ForkServer", pid: int, stdout):
        self.server, self.pid, self.stdout = server, pid, stdout
        self.args = None
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        if self.returncode is None and not self.server.alive() and not pid_alive(self.pid):
            self._set_exit(-signal.SIGKILL)  # the server died before it could report: the child is gone too
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
            self._exited.wait(left)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkServer:
    """The launcher's end of the server: start it, fork stages from it, close it."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, log_path: Path | None):
        self.proc, self.sock, self.log_path = proc, sock, log_path
        self.info: dict | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self._replied = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True, name="forkserver-reader")
        self._reader.start()

    @classmethod
    def start(cls, modules=PRELOAD, log_path: Path | None = None, env: dict | None = None) -> "ForkServer":
        """Start the server process; it imports `modules` in the background (see ready())."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        out = open(log_path, "w") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen([sys.executable, "-m", "harness.run.forkserver", str(theirs.fileno()), *modules],
                                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        finally:
            theirs.close()
            if log_path:
                out.close()
        return cls(proc, ours, log_path)

    # -- state
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """True once the imports are done and CUDA is untouched; False if the server failed or took too long."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if not self.alive() or time.monotonic() > deadline:
                return False
        return bool(self.info and self.info.get("ready"))

    def why_not_ready(self) -> str:
        """One line: why stages start as fresh processes instead."""
        if self.info is None:
            state = "exited with code %s" % self.proc.returncode if not self.alive() else "did not finish importing"
            return f"the fork server {state} (log: {self.log_path})"
        if self.info.get("cuda_initialized"):
            return "importing the trainer's modules initialised CUDA, so forked children could not use the GPU"
        return "the fork server is not ready"

    # -- forking
    @staticmethod
    def forkable(argv) -> tuple[str, list[str], int] | None:
        """(module, args, nice) when argv is `[nice -n N] PYTHON -m MODULE ARGS` for a known entry point."""
        argv, nice = list(argv), 0
        if len(argv) > 3 and Path(argv[0]).name == NICE_PREFIX[0] and argv[1] == NICE_PREFIX[1]:
            nice, argv = int(argv[2]), argv[3:]
        if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in ENTRY_POINTS:
            return argv[2], argv[3:], nice
        return None

    def spawn(self, argv, env: dict, cwd) -> ForkedProcess | None:
        """Fork argv's entry point with this environment and working directory; None when not forkable/ready."""
        target = self.forkable(argv)
        if target is None or not self.ready():
            return None
        module, args, nice = target
        read_fd, write_fd = os.pipe()
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            try:
                _send(self.sock, {"id": rid, "module": module, "args": args, "env": dict(env),
                                  "cwd": str(cwd) if cwd else None, "nice": nice}, (write_fd,))
            except OSError:
                os.close(read_fd)
                return None
            finally:
                os.close(write_fd)
        reply = self._await_reply(rid)
        if reply is None:
            os.close(read_fd)
            return None
        proc = ForkedProcess(self, reply["pid"], os.fdopen(read_fd, "rb"))
        proc.args = list(argv)
        with self._replied:
            self._children[proc.pid] = proc
            if proc.pid in self._early_exits:
                proc._set_exit(self._early_exits.pop(proc.pid))
        return proc

    def _await_reply(self, rid: int, timeout: float = 30.0) -> dict | None:
        deadline = time.monotonic() + timeout
        with self._replied:
            while rid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    return None
                self._replied.wait(min(left, 0.1))
            return self._replies.pop(rid)

    def _read(self) -> None:
        """Dispatch the server's messages: ready, spawn replies, exit statuses."""
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "ready" in message:
                self.info = message
                self._ready.set()
                continue
            with self._replied:
                if "id" in message:
                    self._replies[message["id"]] = message
                elif "rc" in message:
                    child = self._children.pop(message["pid"], None)
                    if child is None:
                        self._early_exits[message["pid"]] = message["rc"]
                    else:
                        child._set_exit(message["rc"])
                self._replied.notify_all()
        self._ready.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the server: it kills any child still running (the launcher already killed its stages)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us by closing the socket
    code = serve(int(argv[0]), argv[1:])
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown (with torch imported, ~1 s the session would wait for)


if __name__ == "__main__":
    sys.exit(main())
