"""The runs of one acceptance session, as a table of data (the torchtitan way).

`reference` is the course's recipe; `resume` continues it from iter_0000100; every other entry is a live
mutant: a deliberately broken run that must fail exactly `expected_failures` of the reference profile,
proving that each criterion can fail. Train-then-resume is one dependency, not two tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunSpec:
    """One training run: what to add to the course's command, and what the verdict must be."""

    name: str
    description: str
    extra_args: tuple[str, ...] = ()
    save: bool = True
    resume_from: str | None = None            # name of the run whose iter_0000100 this one loads
    env: dict = field(default_factory=dict)
    timeout_s: float | None = None            # None: the session's stage timeout
    expected_failures: frozenset[str] = frozenset()
    tolerated_failures: frozenset[str] = frozenset()  # may also fail, for a documented reason (`why_tolerated`)
    why_tolerated: str = ""
    derived_from: str | None = None           # no training: a transformation of another run's artifacts ...
    derivation: str | None = None             # ... named in harness.run.outcomes.DERIVATIONS
    needs_gpu: bool = True
    graded: bool = True                       # False: a failure-mode run, judged by its diagnosis, not the criteria
    nice: int = 0                             # CPU priority: mutants yield to preprocessing and the reference run
    recipe: str = "a"                         # the course recipe (fixtures/criteria/course-recipe.toml): its data
    diagnosis: str | None = None              # the harness.evidence.diagnose cause id its failed stage must get

    @property
    def is_mutant(self) -> bool:
        return bool(self.expected_failures)

    @property
    def is_broken_resume(self) -> bool:
        """A mutant that resumes another run: judged as that run, with this run's log as its resumed log."""
        return self.is_mutant and self.resume_from is not None

    def judge(self, failed: set[str]) -> tuple[list[str], list[str]]:
        """(criteria that should have failed but passed, criteria that failed but should not have)."""
        missed = sorted(self.expected_failures - failed)
        extra = sorted(failed - self.expected_failures - self.tolerated_failures)
        return missed, extra


REFERENCE = RunSpec("reference", "the course's flags on the course corpus (10 lines per document)")
REFERENCE_B = RunSpec("reference-b", "recipe (b): the course's literal one-line documents with --bert-no-binary-head",
                      recipe="b")
RESUME = RunSpec("resume", "reload iter_0000100 of the reference run and train to iteration 110",
                 extra_args=("--ckpt-step", "100", "--exit-interval", "10"), resume_from="reference",
                 save=False)  # judged by its losses only: a save at 110 would only lengthen the critical path

# The eager step over the first 50 iterations: acceptance/test_cuda_graph.py compares its losses with the reference's.
EAGER = RunSpec("eager", "the reference recipe with the eager step (--cuda-graph off), stopped at iteration 50",
                extra_args=("--cuda-graph", "off", "--exit-interval", "50"), save=False, graded=False, nice=5)

GOLDEN = frozenset({"golden-final-loss", "golden-curve"})
CHECKPOINTS = frozenset({"checkpoints-saved", "checkpoint-tracker", "checkpoint-loads"})
# Everything a run shows once its data is built: a run that dies in the dataset build fails all of it.
AFTER_DATA = frozenset({"training-started", "first-loss", "loss-decreases", "final-loss", "no-nan", "skips-early-only",
                        "exit-code", "cuda-graph"}) | CHECKPOINTS | GOLDEN
# A broken resume trains on past iteration 110 so that its first logged lm loss exists even when it restarts the
# fp16 loss-scale search (17 skipped steps from 2^32); --exit-interval 30 from iteration 100 stops at 130.
_BROKEN_RESUME = ("--ckpt-step", "100", "--exit-interval", "30")

LIVE_MUTANTS = (
    RunSpec("mutant-lr-zero", "learning rate 0: the loss cannot go down",
            extra_args=("--lr", "0", "--min-lr", "0"),
            expected_failures=frozenset({"recipe", "loss-decreases", "final-loss"}) | GOLDEN, nice=5,
            tolerated_failures=frozenset({"skips-early-only"}),
            why_tolerated="an untrained model's fp16 gradients overflow now and then at the searched loss scale "
                          "(seen on the H200: one skipped step at iteration ~70)"),
    RunSpec("mutant-nan", "diverged at iteration 120: the loss is NaN on every step from there, each step overflows "
                          "and is skipped, the fp16 loss scale collapses to its minimum (a single overflow is normal)",
            extra_args=("--inject-nan-at", "120"),
            expected_failures=frozenset({"no-nan", "skips-early-only", "final-loss"}) | GOLDEN,
            nice=5),
    RunSpec("mutant-memory-leak", "holds 512 MiB more on the GPU through the allocator for the whole run (a leak, or "
                                  "a larger model): the training's own memory leaves its band, whatever the context",
            extra_args=("--inject-leak-mib", "512"), expected_failures=frozenset({"gpu-memory"}), nice=5),
    RunSpec("mutant-crash-110", "the trainer raises an error after iteration 110: traceback, exit code 1",
            extra_args=("--inject-crash-at", "110"), nice=5,
            expected_failures=frozenset({"exit-code", "final-loss", "checkpoints-saved",
                                         "checkpoint-tracker"}) | GOLDEN),
    RunSpec("mutant-no-data", "--data-path names no .bin/.idx: the dataset build fails at once (no waiting for data)",
            extra_args=("--data-path", "/nonexistent/data/corpus_text_sentence", "--wait-for-data", "0"), nice=5,
            expected_failures=AFTER_DATA | {"datasets-built"}, diagnosis="data-missing",
            tolerated_failures=frozenset({"gpu-memory"}),
            why_tolerated="the run dies during setup, seconds after CUDA starts: NVML sees at most the CUDA context "
                          "and the model, far below the band, or nothing when the process ends between two samples"),
    # The eager step takes ~70 ms/iter (10x the graph): stopping at iteration 80 keeps it off the suite's critical
    # path (80 still logs the 6 losses loss-decreases needs), so it also fails what needs the whole run, exactly as
    # mutant-stopped-110 does (the run completed among them: its log stops at 80).
    RunSpec("mutant-capture-fails", "CUDA graph capture raises; the trainer falls back to the eager step "
            "(stopped at iteration 80)",
            extra_args=("--inject-capture-failure", "--exit-interval", "80"), nice=5,
            expected_failures=frozenset({"cuda-graph", "final-loss", "checkpoints-saved",
                                         "checkpoint-tracker", "exit-code"}) | GOLDEN,
            tolerated_failures=frozenset({"gpu-memory"}),
            why_tolerated="the failed capture leaves its graph memory pool allocated and the eager step allocates "
                          "its own buffers on top (measured 2638 MiB on the H200, above the graphed run's band)"),
    RunSpec("mutant-resume-no-optim", "resume from iter_0000100 without the optimizer state (Megatron's "
            "--no-load-optim: Adam moments, loss scale and LR schedule start over)",
            extra_args=_BROKEN_RESUME + ("--no-load-optim",), resume_from="reference", save=False, nice=5,
            expected_failures=frozenset({"resume-matches"})),
    RunSpec("mutant-resume-data-restart", "resume from iter_0000100 reading the data from sample 0 again "
            "(consumed samples not restored)",
            extra_args=_BROKEN_RESUME + ("--inject-data-restart",), resume_from="reference", save=False, nice=5,
            expected_failures=frozenset({"resume-matches"})),
    RunSpec("mutant-stopped-110", "training stops at iteration 110",
            extra_args=("--exit-interval", "110"), nice=5,
            expected_failures=frozenset({"final-loss", "checkpoints-saved", "checkpoint-tracker",
                                         "exit-code"}) | GOLDEN),
    # 200 CPU iterations take ~150 s on the H200 host: the CPU mutant stops at iteration 2, so it also
    # fails every criterion that needs the whole run; ran-on-gpu and gpu-memory are the ones it is for.
    RunSpec("mutant-cpu", "training on the CPU (fp32), stopped at iteration 2 to bound the suite's time",
            extra_args=("--device", "cpu", "--exit-interval", "2"),
            env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4"},
            needs_gpu=False, nice=5,
            expected_failures=frozenset({"ran-on-gpu", "gpu-memory", "loss-decreases", "final-loss",
                                         "checkpoints-saved", "checkpoint-tracker", "cuda-graph",
                                         "exit-code"}) | GOLDEN),
)

DERIVED_MUTANTS = (
    RunSpec("mutant-corrupt-checkpoint", "the reference run with the .distcp files of iter_0000200 cut in half",
            derived_from="reference", derivation="corrupt-checkpoint",
            expected_failures=frozenset({"checkpoint-loads"})),
    RunSpec("mutant-no-save", "the course's command as printed: no --save, so no checkpoints (the reference run "
            "without its checkpoint folder, its save lines and its `save` argument)",
            derived_from="reference", derivation="no-save", expected_failures=CHECKPOINTS),
    RunSpec("mutant-truncated-log", "the reference run's log cut before `training ...`",
            derived_from="reference", derivation="truncate-log",
            expected_failures=frozenset({"training-started", "first-loss", "loss-decreases", "final-loss",
                                         "no-nan", "skips-early-only", "resume-matches", "exit-code"}) | GOLDEN),
)


# CUDA out of memory on the course's minimum card (8 GB), then the course's remedy under the same cap.
# --micro-batch-size 512 at --seq-length 512: the lm head's fp16 logits alone are 512 x 512 x 30592 x 2 B = 16 GB.
_CAPPED = ("--train-iters", "4", "--log-interval", "2", "--eval-interval", "4", "--eval-iters", "1",
           "--seq-length", "512", "--max-position-embeddings", "512", "--memory-cap-gb", "8")
FAILURE_RUNS = (
    RunSpec("oom-8gb", "micro-batch 512 x 512 tokens on a card capped to 8 GB: CUDA out of memory",
            extra_args=_CAPPED + ("--micro-batch-size", "512", "--global-batch-size", "512"), save=False,
            graded=False, nice=5),
    RunSpec("oom-8gb-remedy", "the course's remedy, --micro-batch-size 2, under the same 8 GB cap",
            extra_args=_CAPPED + ("--micro-batch-size", "2", "--global-batch-size", "16"), save=False,
            graded=False, nice=5),
)


def session_runs(with_mutants: bool = True) -> tuple[RunSpec, ...]:
    """Everything one `pytest -m gpu` session runs, in dependency order."""
    runs = (REFERENCE, RESUME, REFERENCE_B)
    return runs + ((EAGER,) + LIVE_MUTANTS + FAILURE_RUNS + DERIVED_MUTANTS if with_mutants else ())
