"""Self-tests of harness/run/no_te_launch.py: Megatron-LM's BERT script without Transformer Engine, unchanged.

The fake checkouts (fixtures/checkouts/*-like) model both shapes of bert_layer_specs: core_v0.16.1's own
`import transformer_engine` probe and HEAD's HAVE_TE from megatron.core.extensions. Their pretrain_bert.py imports
the TE spec at module level, as the real scripts do, and prints the spec it got as one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.base.paths import FIXTURES, VOCAB_FILE
from harness.run import megatron_lm as mlm
from harness.run import no_te_launch
from harness.run.launch import run_stage
from harness.run.checkout import NO_TE_LAUNCHER, SPEC_FILE, detect, find_train_script, select_adapters

FAKES = FIXTURES / "checkouts"
CHECKOUTS = [FAKES / "core_v0.16.1-like", FAKES / "main-like"]
TE_MISSING = "ImportError: Transformer Engine is not installed. Please use local Bert layer spec instead."


def _launch(root: Path, args: list[str], *, with_te: Path | None = None, script: Path | None = None):
    """python no_te_launch.py SCRIPT ARGS with the checkout (and a fake transformer_engine) on PYTHONPATH."""
    path = [str(root)] + ([str(with_te)] if with_te else [])
    script = script or find_train_script(root)
    return subprocess.run([sys.executable, str(NO_TE_LAUNCHER), str(script), *args], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)), timeout=60)


def _printed(done) -> dict:
    """The fake script's JSON line."""
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake_te(tmp_path) -> Path:
    """A folder holding an importable `transformer_engine` package."""
    (tmp_path / "te" / "transformer_engine").mkdir(parents=True)
    (tmp_path / "te" / "transformer_engine" / "__init__.py").write_text("# fake Transformer Engine\n")
    return tmp_path / "te"


@pytest.mark.parametrize("root", CHECKOUTS, ids=lambda p: p.name)
def test_applied_without_te_and_with_spec_local(root):
    done = _launch(root, ["--num-layers", "4", "--spec", "local"])
    assert done.returncode == 0, done.stderr
    out = _printed(done)
    assert (out["spec"], out["te_spec"]) == ("local-spec", "local-spec")
    script = str(find_train_script(root))
    assert out["argv"] == [script, "--num-layers", "4", "--spec", "local"]
    assert out["path0"] == os.path.dirname(script)  # as `python SCRIPT` sets it, not the launcher's folder
    assert done.stdout.count(no_te_launch.PATCHED) == 1


@pytest.mark.parametrize("root", CHECKOUTS, ids=lambda p: p.name)
def test_not_applied_when_transformer_engine_is_importable(root, fake_te):
    done = _launch(root, ["--spec", "local"], with_te=fake_te)
    assert done.returncode == 0, done.stderr
    assert _printed(done)["te_spec"].startswith("te-spec") and no_te_launch.PATCHED not in done.stdout


@pytest.mark.parametrize("root", CHECKOUTS, ids=lambda p: p.name)
def test_not_applied_without_spec_local(root):
    done = _launch(root, ["--num-layers", "4"])
    assert done.returncode == 1 and TE_MISSING in done.stderr and no_te_launch.PATCHED not in done.stdout


@pytest.mark.parametrize("args, expected", [
    (["--spec", "local"], True), (["--spec=local"], True), (["--x", "1", "--spec", "local", "--y"], True),
    (["--spec"], False), (["--spec", "te"], False), (["local", "--spec"], False), ([], False),
])
def test_wants_local_spec(args, expected):
    assert no_te_launch.wants_local_spec(args) is expected


@pytest.mark.parametrize("have_te, attrs, patched", [
    (False, {}, True),
    (True, {}, False),
    (False, {"bert_layer_local_spec": None}, False),   # nothing to route to: leave the module alone
])
def test_use_local_spec_changes_only_a_module_without_te(have_te, attrs, patched):
    module = types.ModuleType("specs")
    module.HAVE_TE, module.bert_layer_local_spec = have_te, "local"
    module.get_bert_layer_with_transformer_engine_spec = original = lambda: "te"
    vars(module).update(attrs)
    assert no_te_launch.use_local_spec(module) is patched
    getter = module.get_bert_layer_with_transformer_engine_spec
    assert (getter() == "local") if patched else getter is original


def test_a_missing_script_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, str(NO_TE_LAUNCHER), str(tmp_path / "absent.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and no_te_launch.USAGE in done.stderr and "absent.py" in done.stderr


# ---------------------------------------------------------------- through the training plan (torchrun, on CPU)


def _students_copy(root: Path, tmp_path: Path) -> Path:
    """The checkout's BERT script copied under another name with one harmless change (an extra print)."""
    script = tmp_path / "student" / "my_pretrain_bert.py"
    script.parent.mkdir()
    text = find_train_script(root).read_text()
    script.write_text(text.replace("if __name__ == \"__main__\":\n", "if __name__ == \"__main__\":\n"
                                   "    print(\"student's copy\")\n", 1))
    assert script.read_text() != text
    return script


def _train(root: Path, tmp_path: Path, train_script: Path | None = None, have_te: bool = False):
    """plan_train for a fake checkout, run under the real torchrun: (plan, log text)."""
    plan = mlm.plan_train(detect(root, have_te=have_te), tmp_path / "data" / "corpus_text_sentence", VOCAB_FILE,
                          tmp_path / "run" / "ckpt", train_script, timeout_s=120)
    result = run_stage(plan.stages[0], tmp_path)
    return plan, result, result.log_path.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("root", CHECKOUTS, ids=lambda p: p.name)
def test_train_plan_runs_the_unchanged_script_through_the_launcher(root, tmp_path):
    plan, result, log = _train(root, tmp_path)
    assert result.ok, log[-2000:]
    assert no_te_launch.PATCHED in log and '"te_spec": "local-spec"' in log
    recorded = [a for a in plan.adaptations if a.what.startswith("[no-te-launcher]")]
    assert len(recorded) == 1 and recorded[0].stage == "train" and "--spec local" in recorded[0].why


@pytest.mark.slow
def test_train_script_of_the_student_goes_through_the_same_launcher(tmp_path):
    root = CHECKOUTS[0]
    script = _students_copy(root, tmp_path)
    plan, result, log = _train(root, tmp_path, train_script=script)
    argv = plan.stages[0].argv
    assert argv[argv.index(str(NO_TE_LAUNCHER)) + 1] == str(script)
    assert result.ok and "student's copy" in log and no_te_launch.PATCHED in log, log[-2000:]
    whats = [a.what for a in plan.adaptations]
    assert f"training script {script}" in whats and any(w.startswith("[no-te-launcher]") for w in whats)


def test_no_launcher_when_transformer_engine_is_importable(tmp_path):
    root = CHECKOUTS[0]
    plan = mlm.plan_train(detect(root, have_te=True), tmp_path / "d", VOCAB_FILE, tmp_path / "ckpt")
    assert str(NO_TE_LAUNCHER) not in plan.stages[0].argv
    assert not any("no-te-launcher" in a.what for a in plan.adaptations)


def test_no_launcher_for_a_students_script_without_the_te_import(tmp_path):
    script = tmp_path / "my_bert.py"
    script.write_text("from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec\n")
    plan = mlm.plan_train(detect(CHECKOUTS[0]), tmp_path / "d", VOCAB_FILE, tmp_path / "ckpt", script)
    assert plan.stages[0].argv[7] == str(script) and str(NO_TE_LAUNCHER) not in plan.stages[0].argv


def test_no_launcher_when_the_spec_module_is_not_lazy(tmp_path):
    root = Path(shutil.copytree(CHECKOUTS[0], tmp_path / "old"))
    (root / SPEC_FILE).write_text("import transformer_engine\nbert_layer_with_transformer_engine_spec = 1\n")
    checkout = detect(root)
    assert "no-te-launcher" not in [a.id for a in select_adapters(checkout, "train")]
    assert "no-TE launcher cannot help" in mlm.cannot_run_reason(checkout, python_version=(3, 12))


SPAWNING_SCRIPT = '''\
import multiprocessing as mp
from megatron.core.models.bert.bert_layer_specs import bert_layer_with_transformer_engine_spec, bert_layer_local_spec


def child(queue):
    queue.put("child imported the script")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    print(queue.get(timeout=60))
    process.join()
    print("child exit code", process.exitcode)
'''


def test_processes_the_script_spawns_are_patched_too(tmp_path):
    """torch_dist's checkpoint writer starts with `spawn`, which imports the script again in a fresh interpreter:
    that one must get the patch as well (on the H200 core_v0.16.1 died at its first save without it)."""
    script = tmp_path / "pretrain_bert.py"
    script.write_text(SPAWNING_SCRIPT)
    done = _launch(CHECKOUTS[0], ["--spec", "local"], script=script)
    assert done.returncode == 0 and "child exit code 0" in done.stdout, done.stderr[-3000:]
    assert done.stdout.count(no_te_launch.PATCHED) == 2, done.stdout
