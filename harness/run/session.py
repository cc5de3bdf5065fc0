"""One acceptance session: make the corpus, preprocess it, run every training run, gather the evidence.

Everything lands under one run directory:
    RUN/corpus.json, RUN/data/*.bin|idx        the course corpus and its Megatron dataset
    RUN/<run>.log, RUN/<run>/checkpoints/      each run's merged output and --save directory
    RUN/<run>/summary.json                     the trainer's own timings and versions
    RUN/report.json, RUN/report.md             verdicts (written by harness.report.session_report)
Every run starts at once and trains concurrently on the one GPU (the model is tiny), each followed by its own NVML
sampler; a resuming run sets up (model, data, CUDA graphs) while its source trains, then waits in the trainer
(--wait-for-load) for the checkpoint it loads. SIGINT or SIGTERM stops every run of the session (process trees killed
within KILL_GRACE_S), keeps the run directory and raises `SessionInterrupted`, which says where it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from harness.evidence import logs

from harness.base import paths
from harness.data import preprocess_argv
from harness.evidence.checkpoints.inspector import (BUDGET_S as INSPECT_BUDGET_S, TRACKER_FILE, failed_marker,
                                                    inspect_save_dir, report_from_json, tracker_iteration)
from harness.evidence.checkpoints.model_shapes import course_model, expected_sharded_shapes
from harness.evidence.records import CheckpointReport, MemoryReport, RunEvidence
from harness.base.proc import LOAD_WAIT_MARKER, usable_cores
from harness.run.gpumem import NvmlSampler
from harness.run.forkserver import ForkServer
from harness.run.launch import DATASET_MARKER, Interrupted, StageResult, StageSpec, run_stage, signals_interrupt
from harness.run.runs import RunSpec
from harness.run.outcomes import DERIVATIONS, RunOutcome, device_of
from harness.train.args import COURSE_FLAGS
from harness.train.samples import samples_stage_workers

DEFAULT_STAGE_TIMEOUT_S = 300.0
DATASET_STALL_S = 60.0  # Megatron's sample-index build on 1-sentence documents spins silently for hours
INTERRUPTED = "session interrupted by {signame}; stages stopped: {stopped}; run directory kept: {run_dir}"


class SessionInterrupted(Interrupted):
    """The session was stopped by SIGINT/SIGTERM; its message names the kept run directory."""

    def __init__(self, signame: str, message: str):
        KeyboardInterrupt.__init__(self, message)
        self.signame = signame


def child_threads(cores: int | None = None) -> int:
    """CPU threads per child's pools. Several trainers share the host, so each gets few: 2, and 1 on a machine of
    at most 4 cores, where 2 each outnumber the cores and libgomp's spin-waiting threads burn what the others need
    (five tiny CPU trainings at once on 2 cores: 66 s of CPU with 2 threads each, 17 s with 1)."""
    cores = usable_cores() if cores is None else cores   # a Slurm or container limit, not the machine's count
    return 1 if cores <= 4 else 2


def python_env(extra: dict | None = None) -> dict:
    """The child environment: this checkout importable, output unbuffered, NVLink multicast off.

    Warnings are not silenced: a child's warnings land in its own log, next to its output.
    """
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(paths.REPO), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0",
           "OMP_NUM_THREADS": str(child_threads()), "TOKENIZERS_PARALLELISM": "false"}
    env.update(extra or {})
    return env


class EarlyForkServer:
    """A fork server started before the session exists (at pytest start-up), with the run directory it logs in."""

    def __init__(self, run_dir: Path, server: ForkServer):
        self.run_dir, self.server, self.taken = run_dir, server, False

    def take(self) -> ForkServer:
        self.taken = True
        return self.server

    def discard(self) -> None:
        """At exit: stop a server no session took, and remove the run directory if it holds nothing else."""
        if self.taken:
            return
        self.server.close()
        try:
            if {p.name for p in self.run_dir.iterdir()} <= {"forkserver.log"}:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        except FileNotFoundError:
            pass


def default_run_dir() -> Path:
    """A new runs/<timestamp>[-N] directory, created here: two sessions started in the same second get two."""
    base = paths.REPO / "runs" / time.strftime("%Y%m%d-%H%M%S")
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory next to {base}: give --run-dir DIR")


def start_early_fork_server(run_dir: Path | None) -> EarlyForkServer:
    """Start the session's fork server now, logging into the (given or default) run directory."""
    run_dir = Path(run_dir) if run_dir else default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    return EarlyForkServer(run_dir, ForkServer.start(log_path=run_dir / "forkserver.log"))


class Session:
    """Stages of one session, sharing a run directory, a vocab file and a stage timeout."""

    def __init__(self, run_dir: Path, vocab_file: Path = paths.VOCAB_FILE,
                 stage_timeout_s: float = DEFAULT_STAGE_TIMEOUT_S, on_line=None,
                 fork_server: "bool | ForkServer" = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Every stage's environment starts from this snapshot: the session's own threads may change os.environ
        # for a moment (building a BertModel sets NVTE_* variables), and no stage may inherit that.
        self.base_env = dict(os.environ)
        # fork_server: the session's Python stages are forks of one pre-imported process (harness.run.forkserver);
        # True starts one now, a ForkServer (started earlier) is used as it is
        if isinstance(fork_server, ForkServer):
            self.forkserver = fork_server
        else:
            self.forkserver = ForkServer.start(log_path=self.run_dir / "forkserver.log") if fork_server else None
        self._fork_noted = False
        self.fork_info: dict | None = None  # the server's import report (import_s, missing, ...), kept at close
        self.vocab_file = Path(vocab_file)
        self.stage_timeout_s = stage_timeout_s
        self.on_line = on_line
        self.outcomes: dict[str, RunOutcome] = {}
        self.stages: dict[str, StageResult] = {}
        self._inspect_lock = threading.Lock()  # inspections in this process (not in forks of the server)
        self.cancel = threading.Event()  # set on SIGINT/SIGTERM: every running stage stops, no new one starts
        self.interrupted: list[str] = []  # names of the stages an interrupt stopped
        self.data_prefix = self.run_dir / "data" / "corpus_text_sentence"  # what prepare_data writes for recipe (a)

    # ---- data --------------------------------------------------------------------------------------------
    def stage(self, name: str, argv: list[str], **kw) -> StageResult:
        spec = StageSpec(name, tuple(argv), kw.pop("timeout_s", self.stage_timeout_s), env=python_env(kw.pop("env", None)),
                         cwd=str(paths.REPO), base_env=self.base_env, **kw)
        try:
            result = run_stage(spec, self.run_dir, on_line=self.on_line, cancel=self.cancel, spawner=self._spawner())
        except KeyboardInterrupt:
            self.interrupted.append(name)  # killed by run_stage before the interrupt reached us
            raise
        self.stages[name] = result
        return result

    def data_prefix_for(self, recipe: str) -> Path:
        """The .bin/.idx prefix of a course recipe's corpus (recipe (a) keeps the historical name)."""
        return self.data_prefix if recipe == "a" else self.run_dir / "data" / f"corpus-{recipe}_text_sentence"

    def prepare_data(self, recipe: str = "a") -> StageResult:
        """The course corpus in the recipe's layout, then preprocessing, each a subprocess stage."""
        from harness.evidence.recipe import load_recipe

        layout = load_recipe().variants[recipe].corpus_layout
        suffix = "" if recipe == "a" else f"-{recipe}"
        corpus = self.run_dir / f"corpus{suffix}.json"
        (self.run_dir / "data").mkdir(exist_ok=True)
        made = self.stage(f"corpus{suffix}", [sys.executable, "-m", "harness.data.corpus", str(corpus),
                                              "--layout", layout])
        if not made.ok:
            return made
        prefix = self.run_dir / "data" / f"corpus{suffix}"
        return self.stage(f"preprocess{suffix}", preprocess_argv(corpus, prefix, self.vocab_file))

    def prepare_samples(self, recipe: str = "a", extra_args: tuple[str, ...] = ()) -> StageResult:
        """The masked samples of the recipe's runs with these flags, built once and in parallel for every run of
        the session to read (the shared sample cache) while the trainers start. Not fatal: a trainer builds
        whatever is missing itself."""
        suffix = "" if recipe == "a" else f"-{recipe}"
        spec = RunSpec(f"samples{suffix}", "the recipe's samples for the shared cache", save=False, recipe=recipe,
                       extra_args=tuple(extra_args))
        argv = self.train_argv(spec) + ["--samples-only", "--sample-workers", str(samples_stage_workers()),
                                        "--device", "cpu",
                                        "--data-cache-path", str(self.run_dir / spec.name / "index-cache")]
        return self.stage(spec.name, argv)

    # ---- training ----------------------------------------------------------------------------------------
    def save_dir(self, spec: RunSpec) -> Path:
        return self.run_dir / spec.name / "checkpoints"

    def train_argv(self, spec: RunSpec) -> list[str]:
        """The course's command with this run's changes; a run's own flags come last and win."""
        from harness.evidence.recipe import load_recipe

        argv = [sys.executable, "-m", "harness.train", *COURSE_FLAGS, *load_recipe().variants[spec.recipe].extra_args,
                "--data-path", str(self.data_prefix_for(spec.recipe)),
                "--vocab-file", str(self.vocab_file), "--wait-for-data", str(self.stage_timeout_s),
                "--data-cache-path", str(self.run_dir / spec.name / "index-cache"),
                "--sample-cache", str(self.run_dir / "data" / "sample-cache"), "--sample-workers", "1", "--stream-samples",
                "--summary-json", str(self.run_dir / spec.name / "summary.json")]
        if spec.save:
            argv += ["--save", str(self.save_dir(spec))]
        if spec.resume_from:  # it sets up while its source trains, then waits for the checkpoint (stage timeout)
            argv += ["--load", str(self.save_dir(self._spec(spec.resume_from))),
                     "--wait-for-load", str(spec.timeout_s or self.stage_timeout_s)]
        return argv + list(spec.extra_args)

    def _spawner(self):
        """run_stage's spawner: a fork of the session's server, or None (then the stage starts fresh)."""
        server = self.forkserver
        if server is None:
            return None

        def spawn(argv, env, cwd):
            proc = server.spawn(argv, env, cwd)
            if proc is None and server.forkable(argv) and not self._fork_noted:
                self._fork_noted = True
                self._say(f"stages start as fresh processes: {server.why_not_ready()}")
            return proc
        return spawn

    def close(self) -> None:
        """Stop the session's fork server (idempotent); the stages it forked have ended by now."""
        if self.forkserver is not None:
            self.fork_info = dict(self.forkserver.info or {})  # "ready": the stages were forks of it
            self.forkserver.close()
            self.forkserver = None

    def _spec(self, name: str) -> RunSpec:
        return self.outcomes[name].spec

    def train(self, spec: RunSpec, cancel=None) -> RunOutcome:
        """One training run as a stage, with an NVML sampler following its process tree; `cancel` (default: the
        session's) stops it."""
        outcome = self.outcomes.setdefault(spec.name, RunOutcome(spec))
        (self.run_dir / spec.name).mkdir(parents=True, exist_ok=True)
        started: dict = {}
        argv = self.train_argv(spec)
        if spec.nice and shutil.which("nice"):
            argv = ["nice", "-n", str(spec.nice), *argv]
        stage_spec = StageSpec(f"train-{spec.name}", tuple(argv),
                               spec.timeout_s or self.stage_timeout_s, env=python_env(spec.env), cwd=str(paths.REPO),
                               stall_timeout_s=DATASET_STALL_S, stall_after_marker=DATASET_MARKER,
                               stall_quiet_marker=LOAD_WAIT_MARKER, base_env=self.base_env)
        t0 = time.monotonic()
        with NvmlSampler(lambda: started.get("pid")) as sampler:
            outcome.stage = run_stage(stage_spec, self.run_dir, on_line=self.on_line, cancel=cancel or self.cancel,
                                      on_start=lambda popen: started.update(pid=popen.pid), spawner=self._spawner())
        outcome.seconds = time.monotonic() - t0
        outcome.memory = sampler.report()
        outcome.save_dir = self.save_dir(spec) if spec.save else None
        summary = self.run_dir / spec.name / "summary.json"
        outcome.summary = json.loads(summary.read_text()) if summary.is_file() else {}
        return outcome

    def run_all(self, specs: tuple[RunSpec, ...], prepare: bool = False) -> StageResult | None:
        """Every run at once; a resuming run sets up while its source trains and waits for its checkpoint.

        With prepare=True the trainers start while the corpus is preprocessed (they wait for the data, and
        give up at once if preprocessing fails); returns the preprocessing result then.
        SIGINT/SIGTERM stop every run and raise SessionInterrupted; the run directory is kept.
        """
        try:
            with signals_interrupt():
                return self._run_all(specs, prepare)
        except KeyboardInterrupt as exc:
            self.interrupted += [r.name for r in self._stage_results() if r.interrupted]
            stopped = ", ".join(self.interrupted) or "none"
            signame = getattr(exc, "signame", "SIGINT")
            message = INTERRUPTED.format(signame=signame, stopped=stopped, run_dir=self.run_dir)
            self._say(message)
            raise SessionInterrupted(signame, message) from exc

    def _run_all(self, specs: tuple[RunSpec, ...], prepare: bool) -> StageResult | None:
        """run_all's body: on any exception the other runs are cancelled and waited for (KILL_GRACE_S)."""
        for spec in specs:
            self.outcomes[spec.name] = RunOutcome(spec)
            if spec.resume_from:  # a previous session's tracker or marker in this run directory would mislead it
                source = self.save_dir(self._spec(spec.resume_from))
                (source / TRACKER_FILE).unlink(missing_ok=True)
                failed_marker(source).unlink(missing_ok=True)
        trained = [s for s in specs if not s.derived_from]
        done = {s.name: threading.Event() for s in trained}
        derived_done: set[str] = set()

        def shapes() -> None:  # the inspector's expected shapes, built while the runs start (stages use base_env)
            with self._inspect_lock:
                expected_sharded_shapes()
                expected_sharded_shapes(course_model(binary_head=False))
        if self.forkserver is None:  # else checkpoints are inspected in forks of the server (Session.checkpoints)
            threading.Thread(target=shapes, daemon=True, name="expected-shapes").start()
        prepared = None

        recipes = list(dict.fromkeys(s.recipe for s in trained))
        data_ready = {recipe: threading.Event() for recipe in recipes}
        if not prepare:
            for event in data_ready.values():
                event.set()

        def job(spec: RunSpec) -> None:
            try:
                if spec.nice:  # low-priority runs start once their corpus is preprocessed: less contention for it
                    data_ready[spec.recipe].wait()
                if self.cancel.is_set():
                    return
                early = self._inspect_when_saved(spec, done[spec.name]) if spec.save and self._forking() else None
                if spec.resume_from:
                    outcome = self._train_resuming(spec, done[spec.resume_from])
                    if outcome.stage is None:
                        return
                else:
                    outcome = self.train(spec)
                done[spec.name].set()  # a resume waiting for it stops if it saved nothing; inspect meanwhile
                report = early.result() if early else None
                if self.cancel.is_set():
                    return
                if report is None:
                    report = self.checkpoints(outcome)
                outcome.checkpoint_report = report
                for derived in specs:  # its derived mutants now, while other runs still train
                    if derived.derived_from == spec.name and not self.cancel.is_set():
                        self.derive(derived)
                        derived_done.add(derived.name)
            finally:
                done[spec.name].set()

        pool = ThreadPoolExecutor(max_workers=max(1, len(trained)))
        prep_pool = None
        try:
            futures = [pool.submit(job, s) for s in trained]
            if prepare:
                def prepare_recipe(recipe: str) -> StageResult:
                    try:
                        done_prep = self.prepare_data(recipe)
                        if not done_prep.ok:
                            Path(f"{self.data_prefix_for(recipe)}.failed").write_text(done_prep.headline())
                    finally:
                        data_ready[recipe].set()
                    if done_prep.ok and not self.cancel.is_set():  # for the recipe's first run and all alike
                        self.prepare_samples(recipe, next(s.extra_args for s in trained if s.recipe == recipe))
                    return done_prep

                prep_pool = ThreadPoolExecutor(max_workers=max(1, len(recipes)))  # every recipe's data at once
                for done_prep in prep_pool.map(prepare_recipe, recipes):  # (a) first: the first failure wins
                    prepared = done_prep if prepared is None or prepared.ok else prepared
            for future in futures:
                future.result()
        except BaseException:
            self.cancel.set()  # the workers' stages see it within POLL_S and kill their process trees
            for event in data_ready.values():
                event.set()
            raise
        finally:
            if prep_pool is not None:
                prep_pool.shutdown(wait=True)
            pool.shutdown(wait=True)
            self.close()
        for spec in specs:
            if spec.derived_from and spec.name not in derived_done:
                self.derive(spec)
        return prepared

    def _stage_results(self) -> list[StageResult]:
        """Every stage result of the session so far (data stages and training runs)."""
        return list(self.stages.values()) + [o.stage for o in self.outcomes.values() if o.stage is not None]

    def _say(self, text: str) -> None:
        """One line to the session's progress printer, else to the real terminal's stderr."""
        if hasattr(self.on_line, "note"):
            self.on_line.note(text)
        else:
            print(text, file=sys.__stderr__ or sys.stderr, flush=True)

    def _train_resuming(self, spec: RunSpec, source_done: threading.Event) -> RunOutcome:
        """A resuming run, started at once: it sets up while its source trains, then waits (--wait-for-load).

        When the source ends (or the session is stopped) before its tracker reaches the resume's --ckpt-step, the
        source's `<save dir>.failed` says so, the run is stopped, and its outcome stays without a stage, as if it
        had never started: the source is what failed.
        """
        source = self.save_dir(self._spec(spec.resume_from))
        gone = _SourceGone(self.cancel, source_done, source, _ckpt_step(spec), spec.resume_from)
        outcome = self.outcomes[spec.name] if gone.is_set() else self.train(spec, cancel=gone)
        if gone.fired:
            if outcome.stage is not None and outcome.stage.interrupted and self.cancel.is_set():
                self.interrupted.append(outcome.stage.name)  # stopped by the interrupt all the same
            outcome = self.outcomes[spec.name] = RunOutcome(spec)
        return outcome

    # ---- persistence (--reuse-run) -----------------------------------------------------------------------
    def dump(self) -> Path:
        """session.json: enough to judge this run directory again later without training."""
        runs = {}
        for name, o in self.outcomes.items():
            st = o.stage
            runs[name] = {
                "stage": None if st is None else {"name": st.name, "argv": list(st.argv), "returncode": st.returncode,
                                                  "timed_out": st.timed_out, "stalled": st.stalled,
                                                  "duration_s": st.duration_s, "log_path": str(st.log_path)},
                "memory": asdict(o.memory) if o.memory else None,
                "save_dir": str(o.save_dir) if o.save_dir else None,
                "summary": o.summary, "seconds": o.seconds}
        path = self.run_dir / "session.json"
        path.write_text(json.dumps({"data_prefix": str(self.data_prefix), "runs": runs}, indent=2, default=str))
        return path

    @classmethod
    def load(cls, run_dir: Path) -> "Session":
        """Rebuild a finished session from its session.json (paths are taken relative to run_dir if moved)."""
        from harness.run.runs import session_runs

        run_dir = Path(run_dir)
        state_file = run_dir / "session.json"
        if not state_file.is_file():
            raise FileNotFoundError(f"{state_file} not found: --reuse-run needs a run directory written by a "
                                    "previous `pytest -m gpu --keep-run` session")
        state = json.loads(state_file.read_text())
        session = cls(run_dir)
        known = {s.name: s for s in session_runs()}
        for name, raw in state["runs"].items():
            outcome = RunOutcome(known.get(name, RunSpec(name, "(from session.json)")))
            if raw["stage"]:
                st = raw["stage"]
                log_path = _relocated(Path(st["log_path"]), run_dir)
                tail = tuple(log_path.read_text(errors="replace").splitlines()[-50:]) if log_path.is_file() else ()
                outcome.stage = StageResult(st["name"], tuple(st["argv"]), st["returncode"], st["timed_out"],
                                            st["stalled"], False, st["duration_s"], log_path, run_dir, tail, ())
            outcome.memory = MemoryReport(**raw["memory"]) if raw["memory"] else None
            outcome.save_dir = _relocated(Path(raw["save_dir"]), run_dir) if raw["save_dir"] else None
            outcome.summary, outcome.seconds = raw["summary"], raw["seconds"]
            session.outcomes[name] = outcome
        return session

    # ---- evidence ----------------------------------------------------------------------------------------
    def derive(self, spec: RunSpec) -> None:
        """A mutant made from another run's artifacts (no training): its `derivation` breaks a copy of them."""
        base = self.outcomes[spec.derived_from]
        outcome = self.outcomes[spec.name]
        outcome.memory, outcome.summary, outcome.stage = base.memory, base.summary, base.stage
        outcome.save_dir = base.save_dir
        if base.stage is None:
            return
        target = self.run_dir / spec.name
        target.mkdir(parents=True, exist_ok=True)
        log_text = DERIVATIONS[spec.derivation](base, outcome, target)
        log_path = target / "train.log"
        log_path.write_text(log_text)
        outcome.stage = replace(base.stage, log_path=log_path)
        # inspected now, while the fork server is up (judging would otherwise import megatron-core here)
        if outcome.save_dir == base.save_dir and base.checkpoint_report is not None:
            outcome.checkpoint_report = base.checkpoint_report
        elif outcome.save_dir is not None:
            outcome.checkpoint_report = self.checkpoints(outcome)

    def evidence(self, name: str) -> RunEvidence:
        """RunEvidence for one run; a run that another run resumed gets that run's log attached.

        A broken-resume mutant is judged as the run it resumed, with its own log as the resumed log: only
        resume-matches can tell them apart.
        """
        outcome = self.outcomes[name]
        if outcome.evidence is not None:
            return outcome.evidence
        stage = outcome.stage
        log_path = stage.log_path if stage else None
        parsed = logs.parse_log_file(log_path) if log_path and Path(log_path).is_file() else None
        if outcome.spec.is_broken_resume:
            outcome.evidence = replace(self.evidence(outcome.spec.resume_from), resume_log=parsed)
            return outcome.evidence
        origin = outcome.spec.derived_from or outcome.spec.name
        resumed = next((o for o in self.outcomes.values()
                        if o.spec.resume_from == origin and o.stage and o.spec.graded and not o.spec.is_mutant), None)
        outcome.evidence = RunEvidence(
            run_dir=str(self.run_dir), exit_code=stage.returncode if stage else None,
            timed_out=bool(stage and (stage.timed_out or stage.stalled)), log=parsed,
            log_path=str(log_path) if log_path else None,
            checkpoints=outcome.checkpoint_report or self.checkpoints(outcome),
            memory=outcome.memory, resume_log=logs.parse_log_file(resumed.stage.log_path) if resumed else None,
            device=device_of(outcome), extra={"summary": outcome.summary, "seconds": round(outcome.seconds, 2)})
        return outcome.evidence

    def checkpoints(self, outcome: RunOutcome) -> CheckpointReport:
        """Inspect where the checkpoints should be; a run without --save gets a report that says so."""
        if outcome.save_dir is None:
            return CheckpointReport(save_dir="(none)", problems=(
                "no checkpoint directory: the training command has no --save DIR, so nothing was saved; "
                "add --save to the command (the course's command forgot it)",))
        return self._inspect(outcome.spec, outcome.save_dir)

    def _inspect(self, spec: RunSpec, save_dir: Path) -> CheckpointReport:
        """inspect_save_dir for the run's recipe; in a fork of the server when there is one (megatron-core is
        imported there, not in this process, whose threads pump the stages' output), whose bounded child is a fork
        of it in turn (--bounded-fork: the inspector's budgets, set in that child; no fresh interpreter importing
        torch and megatron-core again)."""
        from harness.evidence.recipe import load_recipe

        binary_head = load_recipe().variants[spec.recipe].flags.get("bert_binary_head", True)
        train_argv = self.train_argv(spec)
        sizes = {flag: _flag_value(train_argv, flag) for flag in ("--hidden-size", "--ffn-hidden-size", "--num-layers")}
        if self._forking():
            out = self.run_dir / spec.name / "checkpoints-report.json"
            out.unlink(missing_ok=True)   # an earlier session's in this run directory is not this inspection's
            argv = [sys.executable, "-m", "harness.evidence.checkpoints.inspector", str(save_dir), "--json-out", str(out),
                    "--bounded-fork", *(a for flag, value in sizes.items() if value is not None for a in (flag, value))]
            stage = self.stage(f"inspect-{spec.name}", argv + ([] if binary_head else ["--no-binary-head"]),
                               timeout_s=max(self.stage_timeout_s, INSPECT_BUDGET_S + 30))  # its budget ends it first
            if out.is_file():
                return report_from_json(out)
            self._say(f"checkpoint inspection of {spec.name} failed in its own process "
                      f"({stage.headline()}); inspecting here")
        with self._inspect_lock:  # megatron-core's model-parallel state is per process: one inspection at a time
            return inspect_save_dir(save_dir, course_model(binary_head, **{
                flag.lstrip("-").replace("-", "_"): value for flag, value in sizes.items()}))

    def _inspect_when_saved(self, spec: RunSpec, ended: threading.Event) -> Future:
        """Inspect the run's checkpoints as soon as its tracker names its last iteration (--train-iters), while it
        still evaluates and exits; a run that stops before never gets there and is inspected after it ends.
        The future's result is the report, or None when `ended` (the run's) came first, or a cancel."""
        last, save_dir = int(_flag_value(self.train_argv(spec), "--train-iters")), self.save_dir(spec)

        def watch() -> CheckpointReport | None:
            while not (ended.is_set() or self.cancel.is_set()):
                named = tracker_iteration(save_dir)
                if named is not None and named >= last:
                    return self._inspect(spec, save_dir)
                time.sleep(0.05)
            return None
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"inspect-{spec.name}")
        future = pool.submit(watch)
        pool.shutdown(wait=False)
        return future

    def _forking(self) -> bool:
        """The session's Python stages are forks of its ready server (not fresh interpreters)."""
        return self.forkserver is not None and self.forkserver.ready()


def _flag_value(argv, flag: str) -> str | None:
    """The value of the last `flag VALUE` in argv (the one argparse keeps), or None."""
    argv = list(argv)
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else None


def _ckpt_step(spec: RunSpec) -> int | None:
    """The iteration a resuming run loads: the last --ckpt-step of its flags (None: the tracker's)."""
    step = _flag_value(spec.extra_args, "--ckpt-step")
    return None if step is None else int(step)


class _SourceGone:
    """run_stage's `cancel` for a resuming run: set when the session is stopped, or when its source run ended
    before its tracker reached the iteration to resume from; either way, short of that iteration, it writes
    `<source save dir>.failed` (one line: why) first and `fired` says the resume never got its checkpoint."""

    def __init__(self, cancel: threading.Event, source_done: threading.Event, save_dir: Path, step: int | None,
                 source: str):
        self.cancel, self.source_done, self.save_dir, self.step, self.source = (cancel, source_done, save_dir,
                                                                                step, source)
        self.fired = False

    def _reached(self) -> bool:
        """The source's tracker names the iteration to resume from, or a later one."""
        named = tracker_iteration(self.save_dir)
        return named is not None and named >= (self.step or 0)

    def is_set(self) -> bool:
        """Polled by run_stage; fires at most once, writing the marker."""
        if self.fired:
            return True
        stopped, ended = self.cancel.is_set(), self.source_done.is_set()
        if not (stopped or ended) or self._reached():
            return stopped
        why = "the session was stopped" if stopped else f"run {self.source!r} ended"
        step = "any iteration" if self.step is None else f"iteration {self.step}"
        self.fired = True
        try:
            self.save_dir.parent.mkdir(parents=True, exist_ok=True)
            failed_marker(self.save_dir).write_text(f"{why} before {self.save_dir / TRACKER_FILE} named {step}\n")
        except OSError:  # the run is stopped all the same
            pass
        return True


def _relocated(path: Path, run_dir: Path) -> Path:
    """A path recorded in session.json, re-rooted under run_dir when the directory was moved or copied."""
    if path.exists():
        return path
    for i in range(1, len(path.parts)):
        candidate = run_dir.joinpath(*path.parts[i:])
        if candidate.exists():
            return candidate
    return path
