"""Self-tests of harness.run.megatron_lm: detection, adapters, plans, the #1052 rerun, offline NLTK and tokenizer.

Fake checkouts live in fixtures/checkouts/ (version files and stub scripts only). The real Megatron-LM snapshots
in .megatron/ (git-ignored, read only) are used when present: the most valuable test runs core_v0.16.1's own
tools/preprocess_data.py on the CPU with the offline NLTK stand-in and reads its .bin/.idx back.

Where the tests run: detection and flag tests read the real snapshot or, without one, its recorded excerpt
(fixtures/megatron/, every machine). The four that execute Megatron-LM itself (preprocess_data.py, pretrain_bert.py
twice) or transformers need a whole checkout and those packages: the GPU nightly job clones core_v0.16.1 into
.megatron/ and runs them with NEED_MEGATRON_SNAPSHOT=1, which turns their skip into a failure there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.run import megatron_lm as mlm
from harness.evidence.diagnose import diagnose
from harness.run.no_te_launch import PATCHED as NO_TE_PATCHED
from harness.base.paths import FIXTURES, REPO, VOCAB_FILE
from harness.train.args import COURSE_FLAGS
from harness.judge.profiles import load_profile
from harness.run.checkout import (Adaptation, CheckoutError, HF_TOKENIZER_NAME, NLTK_OFFLINE, NO_TE_LAUNCHER, SPEC_FILE, VERSION_FILE, build_hf_tokenizer_dir, detect, flag_defined, imports_te_spec_at_import_time, probe_modules, select_adapters, te_getter_is_lazy)
from harness.run.launch import DATASET_MARKER

FAKES = FIXTURES / "checkouts"
FAKE_016, FAKE_MAIN, FAKE_NO_OUTPUT = FAKES / "core_v0.16.1-like", FAKES / "main-like", FAKES / "no-output-like"
SNAPSHOTS = REPO / ".megatron"
REAL_016, REAL_MAIN = SNAPSHOTS / "core_v0.16.1", SNAPSHOTS / "main"
NO_SNAPSHOT = "no Megatron-LM snapshot at {path} (git-ignored; clone NVIDIA/Megatron-LM there to run this test)"
# Recorded excerpts of the same refs (fixtures/megatron/: the files detect() and flag_defined() read, each naming its
# commit; make_excerpts.py rebuilds them from a clone): the detection and flag tests run on them where no snapshot is.
EXCERPTS = FIXTURES / "megatron"


def snapshot_or_excerpt(name: str) -> Path:
    """.megatron/<name> when that snapshot is here, else its recorded excerpt."""
    real = SNAPSHOTS / name
    return real if (real / VERSION_FILE).is_file() else EXCERPTS / name
REAL_016_MODULES = ("pydantic", "six", "regex", "yaml")  # core_v0.16.1's megatron.training imports them
TRAIN_ADAPTER_FLAGS = ["--spec", "local", "--attention-backend", "local", "--no-persist-layer-norm",
                       "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion"]

# CPU torch has no triton, but megatron.training imports a triton kernel module at import time. This test-only
# sitecustomize loads that one module against a placeholder triton and removes the placeholder again, so torch's
# own triton checks stay negative. No kernel runs during preprocessing. Not used outside the CPU self-tests.
TRITON_SHIM = '''
import importlib.util, os, sys, types
import torch  # noqa: F401  (torch first, while there is no triton)

KERNELS = ("megatron.core.transformer.custom_layers.batch_invariant_kernels",)


def _placeholder():
    triton, language = types.ModuleType("triton"), types.ModuleType("triton.language")
    triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    triton.autotune = lambda *a, **kw: (lambda f: f)
    triton.cdiv = lambda a, b: -(-a // b)
    triton.language, language.constexpr, language.dtype = language, type("constexpr", (), {}), type("dtype", (), {})
    return {"triton": triton, "triton.language": language}


def _load(dotted):
    relative = os.path.join(*dotted.split(".")) + ".py"
    path = next((os.path.join(e or ".", relative) for e in sys.path if os.path.isfile(os.path.join(e or ".", relative))), None)
    if path is None:
        return
    fakes = _placeholder()
    sys.modules.update(fakes)
    try:
        spec = importlib.util.spec_from_file_location(dotted, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[dotted] = module
    finally:
        for name in fakes:
            sys.modules.pop(name, None)


for _dotted in KERNELS:
    _load(_dotted)
'''


def _needs_modules(modules) -> None:
    """Skip, with the reason, when the checkout's own import-time dependencies are absent (pip-only CPU venv)."""
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        _skip_or_fail(f"Megatron-LM's megatron.training needs {', '.join(absent)} (not a suite dependency): "
                    f"pip install {' '.join(absent)} to run this test")


def _needs(path: Path) -> None:
    """Skip, with the reason, when a real snapshot is absent."""
    if not (path / VERSION_FILE).is_file():
        _skip_or_fail(NO_SNAPSHOT.format(path=path))


def _skip_or_fail(reason: str) -> None:
    """Skip here; fail where the job promised a whole checkout (NEED_MEGATRON_SNAPSHOT=1: the GPU nightly)."""
    if os.environ.get("NEED_MEGATRON_SNAPSHOT") == "1":
        pytest.fail(f"NEED_MEGATRON_SNAPSHOT=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _copy(src: Path, tmp_path: Path) -> Path:
    """A writable copy of a fake checkout."""
    return Path(shutil.copytree(src, tmp_path / src.name))


def _corpus(path: Path, documents: int) -> Path:
    """The course corpus, grouped 10 sentences per document."""
    from harness.data.corpus import write_corpus

    return write_corpus(path, lines=documents * 10)


@pytest.fixture(scope="module")
def triton_shim(tmp_path_factory) -> str:
    """A folder whose sitecustomize lets megatron.training import on CPU torch (see TRITON_SHIM)."""
    folder = tmp_path_factory.mktemp("triton-shim")
    (folder / "sitecustomize.py").write_text(TRITON_SHIM)
    return str(folder)


# ---------------------------------------------------------------- detection


def test_detects_the_016_like_fake_checkout():
    c = detect(FAKE_016)
    assert (str(c.version), c.is_git, c.git_commit) == ("0.16.1", False, None)
    assert c.train_script == FAKE_016.resolve() / "pretrain_bert.py"
    assert c.preprocess_tool == FAKE_016.resolve() / "tools" / "preprocess_data.py"
    assert c.has_legacy_tokenizer and c.imports_te_spec and c.requires_python == ">=3.10"


def test_detects_the_main_like_fake_checkout():
    c = detect(FAKE_MAIN, have_te=True)
    assert str(c.version) == "0.20.0" and c.have_te and not c.have_apex
    assert c.train_script == FAKE_MAIN.resolve() / "examples" / "bert" / "pretrain_bert.py"
    assert not c.has_legacy_tokenizer and c.imports_te_spec and c.requires_python == ">=3.12"


@pytest.mark.parametrize("make, problem", [
    (lambda tmp: tmp / "absent", "no such directory"),
    (lambda tmp: tmp, "megatron/core/package_info.py is missing"),
])
def test_a_folder_that_is_not_a_checkout_is_named_with_the_fix(tmp_path, make, problem):
    with pytest.raises(CheckoutError) as info:
        detect(make(tmp_path))
    assert problem in str(info.value) and str(make(tmp_path)) in str(info.value)
    assert "Fix: pass the root of a Megatron-LM clone" in str(info.value)


def test_an_unreadable_version_file_is_a_checkout_error(tmp_path):
    root = _copy(FAKE_016, tmp_path)
    (root / VERSION_FILE).write_text("MAJOR = 0\nMINOR = 'x'\n")
    with pytest.raises(CheckoutError, match="cannot read MAJOR/MINOR/PATCH"):
        detect(root)


def test_a_git_checkout_reports_its_commit(tmp_path):
    root = _copy(FAKE_016, tmp_path)
    commit = "0123456789abcdef0123456789abcdef01234567"
    (root / ".git" / "refs" / "heads").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "refs" / "heads" / "main").write_text(commit + "\n")
    c = detect(root)
    assert c.is_git and c.git_commit == commit and "@ 0123456789ab" in c.describe()


@pytest.mark.parametrize("source, expected", [
    ("from m.bert_layer_specs import bert_layer_with_transformer_engine_spec\n", True),
    ("import m.bert_layer_specs as s\nSPEC = s.bert_layer_with_transformer_engine_spec\n", True),
    ("if True:\n    from m import bert_layer_with_transformer_engine_spec\n", True),
    ("try:\n    from m import bert_layer_with_transformer_engine_spec\nexcept ImportError:\n    pass\n", False),
    ("def provider():\n    from m import bert_layer_with_transformer_engine_spec\n", False),
    ("from m import bert_layer_local_spec\n", False),
    ("from m import bert_layer_with_transformer_engine_spec\nmatch = 1 +\n", True),  # unparsable: text fallback
])
def test_te_spec_import_at_module_level(tmp_path, source, expected):
    script = tmp_path / "pretrain_bert.py"
    script.write_text(source)
    assert imports_te_spec_at_import_time(script) is expected


def test_probe_modules_runs_the_target_python():
    assert probe_modules(("json", "no_such_module_bert_acceptance")) == {
        "json": True, "no_such_module_bert_acceptance": False}


@pytest.mark.parametrize("name, version, script, legacy", [
    ("core_v0.16.1", "0.16.1", "pretrain_bert.py", True),
    ("main", "0.20.0", "examples/bert/pretrain_bert.py", False),
])
def test_detects_the_real_snapshots(name, version, script, legacy):
    snapshot = snapshot_or_excerpt(name)
    c = detect(snapshot)
    assert str(c.version) == version and c.train_script == snapshot.resolve() / script
    assert c.has_legacy_tokenizer is legacy and c.imports_te_spec  # both import the TE spec at import time
    assert te_getter_is_lazy(c.root) and "no-te-launcher" in [a.id for a in select_adapters(c, "train")]
    assert mlm.cannot_run_reason(c, python_version=(3, 12)) is None  # the no-TE launcher makes it runnable


# ---------------------------------------------------------------- adapters


@pytest.mark.parametrize("root, have_te, have_apex, stage, expected", [
    (FAKE_016, False, False, "train", ["hf-offline", "local-spec", "no-te-launcher", "no-fused-kernels", "legacy-tokenizer"]),
    (FAKE_016, True, False, "train", ["hf-offline", "no-fused-kernels", "legacy-tokenizer"]),
    (FAKE_016, True, True, "train", ["hf-offline", "legacy-tokenizer"]),
    (FAKE_016, False, False, "preprocess", ["hf-offline", "legacy-tokenizer", "nltk-stand-in"]),
    (FAKE_MAIN, False, False, "train", ["hf-offline", "local-spec", "no-te-launcher", "no-fused-kernels", "hf-local-tokenizer"]),
    (FAKE_MAIN, False, False, "preprocess", ["hf-offline", "hf-local-tokenizer", "hf-no-special-tokens", "nltk-stand-in"]),
])
def test_adapter_selection_per_version(root, have_te, have_apex, stage, expected):
    checkout = detect(root, have_te=have_te, have_apex=have_apex)
    assert [a.id for a in select_adapters(checkout, stage)] == expected


def test_no_adapter_outside_its_version_range(tmp_path):
    root = _copy(FAKE_016, tmp_path)
    (root / VERSION_FILE).write_text("MAJOR = 0\nMINOR = 14\nPATCH = 0\nPRE_RELEASE = ''\n")
    # the version-ranged adapters stop below 0.15; what the source shows (a hub tokenizer) and offline mode stay
    assert [a.id for a in select_adapters(detect(root), "train")] == ["hf-offline", "legacy-tokenizer"]


@pytest.mark.parametrize("name", ["core_v0.16.1", "main"])
def test_every_adapter_flag_exists_in_the_real_snapshot(name):
    snapshot = snapshot_or_excerpt(name)
    checkout = detect(snapshot)
    for stage in ("preprocess", "train"):
        for adapter in select_adapters(checkout, stage):
            for flag in (f for f in adapter.flags if f.startswith("--")):
                assert flag_defined(checkout.root, flag), f"{adapter.id}: {flag} not in {snapshot.name}"
    assert not flag_defined(checkout.root, "--no-such-flag-bert-acceptance")


def test_a_flag_the_checkout_lacks_is_refused_before_running(tmp_path):
    root = _copy(FAKE_016, tmp_path)
    arguments = root / "megatron" / "training" / "arguments.py"
    arguments.write_text(arguments.read_text().replace("'--spec', ", ""))
    with pytest.raises(CheckoutError, match=r"adapter 'local-spec' adds --spec, which Megatron-LM 0.16.1"):
        mlm.plan_train(detect(root), tmp_path / "data", VOCAB_FILE, tmp_path / "ckpt")


# ---------------------------------------------------------------- preprocessing plan


def _plan(root: Path, tmp_path: Path, **kw) -> mlm.Plan:
    """A preprocess plan for a 100-document corpus under tmp_path."""
    corpus = _corpus(tmp_path / "corpus.json", 100)
    return mlm.plan_preprocess(detect(root), corpus, tmp_path / "data" / "corpus", VOCAB_FILE,
                               tmp_path / "work", **kw)


def test_preprocess_plan_runs_the_checkouts_tool_with_the_course_flags(tmp_path):
    plan = _plan(FAKE_016, tmp_path)
    first, second = plan.stages
    assert (first.name, second.name) == ("preprocess", "preprocess-rerun") and first.argv == second.argv
    assert first.argv[1] == str(FAKE_016.resolve() / "tools" / "preprocess_data.py")
    assert list(first.argv[2:]) == ["--input", str(tmp_path / "corpus.json"), "--output-prefix",
                                    str(tmp_path / "data" / "corpus"), "--vocab-file", str(VOCAB_FILE),
                                    "--tokenizer-type", "BertWordPieceLowerCase", "--split-sentences",
                                    "--workers", "1", "--json-keys", "text", "--legacy-tokenizer"]
    path = first.env["PYTHONPATH"].split(os.pathsep)
    assert path[:2] == [str(NLTK_OFFLINE), str(FAKE_016.resolve())]
    assert first.timeout_s == mlm.PREPROCESS_TIMEOUT_S and first.stall_timeout_s == mlm.PREPROCESS_STALL_S
    assert first.cwd == str(tmp_path / "work")
    assert plan.expected == (tmp_path / "data" / "corpus_text_sentence.bin",
                             tmp_path / "data" / "corpus_text_sentence.idx")
    whats = [a.what for a in plan.adaptations]
    assert whats[0].startswith(f"PYTHONPATH={FAKE_016.resolve()}") and "[legacy-tokenizer] --legacy-tokenizer" in whats


def test_preprocess_plan_at_head_builds_a_local_tokenizer_folder(tmp_path):
    plan = _plan(FAKE_MAIN, tmp_path)
    stage = plan.stages[0]
    assert stage.argv[-1] == "--tokenizer-hf-no-include-special-tokens" and "--legacy-tokenizer" not in stage.argv
    assert stage.env["HF_HUB_OFFLINE"] == "1" and stage.env["TRANSFORMERS_OFFLINE"] == "1"
    folder = Path(stage.cwd) / HF_TOKENIZER_NAME
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "special_tokens_map.json", "tokenizer.json",
                                                       "tokenizer_config.json", "vocab.txt"]
    assert any(a.what.startswith("[hf-local-tokenizer]") and str(folder) in a.what for a in plan.adaptations)


def test_preprocess_plan_without_the_nltk_stand_in(tmp_path):
    plan = _plan(FAKE_016, tmp_path, nltk_stand_in=False)
    assert str(NLTK_OFFLINE) not in plan.stages[0].env["PYTHONPATH"]
    assert not any("nltk-stand-in" in a.what for a in plan.adaptations)


def test_issue_1052_split_then_exit_0_is_run_a_second_time(tmp_path):
    plan = _plan(FAKE_016, tmp_path)
    (tmp_path / "data").mkdir()
    done = mlm.run_preprocess(plan, tmp_path)
    assert done.ok and [r.name for r in done.results] == ["preprocess", "preprocess-rerun"]
    assert done.data_prefix == tmp_path / "data" / "corpus_text_sentence"
    assert (tmp_path / "data" / "corpus_text_sentence.bin").read_text() == "100 documents, 1000 sentences\n"
    calls = [json.loads(line) for line in (tmp_path / "data" / "corpus_calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and calls[0]["argv"] == calls[1]["argv"] and calls[0]["cwd"] == str(tmp_path / "work")
    rerun = done.adaptations[-1]
    assert rerun.what == "ran the identical preprocess command again (preprocess-rerun)"
    assert "issue #1052" in rerun.why and str(tmp_path / "corpus_ss.json") in rerun.why


def test_a_tool_that_never_writes_output_is_diagnosed_preprocess_no_output(tmp_path):
    plan = _plan(FAKE_NO_OUTPUT, tmp_path)
    done = mlm.run_preprocess(plan, tmp_path)
    assert not done.ok and len(done.results) == 2 and done.data_prefix is None
    assert done.missing == tuple(str(p) for p in plan.expected)
    assert done.diagnosis.cause_id == "preprocess-no-output"
    message = done.failure_message()
    assert message.startswith("stage 'preprocess-rerun' exited 0 2 time(s) but these outputs are missing: ")
    assert "likely cause [preprocess-no-output]" in message and "command: " in message


def test_a_failing_first_run_is_not_repeated(tmp_path):
    root = _copy(FAKE_NO_OUTPUT, tmp_path)
    (root / "tools" / "preprocess_data.py").write_text("raise SystemExit(3)\n")
    done = mlm.run_preprocess(_plan(root, tmp_path), tmp_path)
    assert [r.returncode for r in done.results] == [3] and done.diagnosis is None
    assert done.failure_message().startswith("stage 'preprocess' failed: exit code 3")


# ---------------------------------------------------------------- training plan


def test_train_stage_is_torchrun_with_course_flags_and_adapters(tmp_path):
    checkout = detect(FAKE_016)
    plan = mlm.plan_train(checkout, tmp_path / "data" / "corpus_text_sentence", VOCAB_FILE, tmp_path / "run" / "ckpt",
                          master_port=29555, extra=("--exit-interval", "10"))
    spec = plan.stages[0]
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port", "29555",
            str(NO_TE_LAUNCHER), str(checkout.train_script)]
    assert list(spec.argv[:9]) == head and list(spec.argv[9:9 + len(COURSE_FLAGS)]) == COURSE_FLAGS
    rest = list(spec.argv[9 + len(COURSE_FLAGS):])
    assert rest[:8] == ["--data-path", str(tmp_path / "data" / "corpus_text_sentence"), "--vocab-file",
                        str(VOCAB_FILE), "--save", str(tmp_path / "run" / "ckpt"), "--data-cache-path",
                        str(tmp_path / "run" / "index-cache")]
    assert rest[8:] == TRAIN_ADAPTER_FLAGS + ["--legacy-tokenizer", "--exit-interval", "10"]
    assert spec.env["PYTHONPATH"].split(os.pathsep)[0] == str(checkout.root)
    assert (spec.env["NCCL_NVLS_ENABLE"], spec.env["CUDA_DEVICE_MAX_CONNECTIONS"]) == ("0", "1")
    assert spec.stall_after_marker == DATASET_MARKER and spec.stall_timeout_s == mlm.TRAIN_STALL_S
    whats = " | ".join(a.what for a in plan.adaptations)
    assert "--save " in whats and "[local-spec] --spec local --attention-backend local" in whats
    assert f"[no-te-launcher] torchrun starts {NO_TE_LAUNCHER} SCRIPT ARGS" in whats


def test_train_stage_with_transformer_engine_and_apex_adds_no_kernel_flags(tmp_path):
    spec = mlm.train_stage(detect(FAKE_016, have_te=True, have_apex=True), tmp_path / "d", VOCAB_FILE,
                           tmp_path / "ckpt", nproc=2)
    assert not set(TRAIN_ADAPTER_FLAGS) & set(spec.argv) and spec.argv[4] == "2"
    assert str(NO_TE_LAUNCHER) not in spec.argv and spec.argv[7] == str(detect(FAKE_016).train_script)


def test_train_stage_with_the_students_script_records_it(tmp_path):
    script = tmp_path / "my_bert.py"
    script.write_text("from m import bert_layer_local_spec\n")
    plan = mlm.plan_train(detect(FAKE_016), tmp_path / "d", VOCAB_FILE, tmp_path / "ckpt", train_script=script)
    assert plan.stages[0].argv[7] == str(script)
    assert plan.adaptations[-1].what == f"training script {script}"


def _eager_te_spec(tmp_path: Path) -> Path:
    """A copy of the 0.16.1-like fake whose bert_layer_specs builds the TE spec eagerly (pre-0.16 style)."""
    root = _copy(FAKE_016, tmp_path)
    (root / SPEC_FILE).write_text("import transformer_engine\nbert_layer_with_transformer_engine_spec = 1\n"
                                      "bert_layer_local_spec = 2\n")
    return root


@pytest.mark.parametrize("root, have_te, script, python, expect", [
    (FAKE_016, False, None, (3, 12), None),   # the no-TE launcher routes the TE spec to the local one
    (_eager_te_spec, False, None, (3, 12), "imports bert_layer_with_transformer_engine_spec at import time"),
    (FAKE_016, True, None, (3, 12), None),
    (FAKE_016, False, "from m import bert_layer_local_spec\n", (3, 12), None),
    (FAKE_MAIN, True, None, (3, 11), "requires Python >=3.12, the target Python is 3.11"),
    (FAKE_NO_OUTPUT, True, None, (3, 12), "no BERT training script"),
])
def test_cannot_run_reason_is_said_before_launching(tmp_path, root, have_te, script, python, expect):
    path = None
    if script:
        path = tmp_path / "script.py"
        path.write_text(script)
    root = root(tmp_path) if callable(root) else root
    reason = mlm.cannot_run_reason(detect(root), have_te, path, python_version=python)
    if expect is None:
        assert reason is None
    else:
        assert expect in reason and "Fix: " in reason


def test_cannot_run_reason_names_all_three_fixes(tmp_path):
    reason = mlm.cannot_run_reason(detect(_eager_te_spec(tmp_path)), python_version=(3, 12))
    assert "install Transformer Engine" in reason and "honours --spec local" in reason
    assert "reference trainer" in reason and "ImportError" in reason and "no-TE launcher cannot help" in reason


# ---------------------------------------------------------------- offline NLTK stand-in

STAND_IN_SCRIPT = """
import json, nltk
from nltk.tokenize.punkt import PunktLanguageVars
class CustomLanguageVars(PunktLanguageVars):
    _period_context_fmt = r"changed"
splitter = nltk.load("nltk:tokenizers/punkt/english.pickle")
keep = nltk.tokenize.punkt.PunktSentenceTokenizer(train_text=splitter._params, lang_vars=CustomLanguageVars())
text = "the model train. the gpu batch! Dr. Smith said \\"ok.\\" Then\\nit ended"
print(json.dumps({"download": nltk.download("punkt", quiet=True, download_dir=None),
                  "file": type(nltk.load("file:/x/tokenizers/punkt/english.pickle")).__name__,
                  "split": splitter.tokenize(text), "keep": keep.tokenize("one. two.\\n three."),
                  "stand_in": nltk.STAND_IN}))
"""


def test_nltk_stand_in_splits_the_way_preprocess_data_calls_it():
    env = dict(os.environ, PYTHONPATH=str(NLTK_OFFLINE))
    done = subprocess.run([sys.executable, "-c", STAND_IN_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    out = json.loads(done.stdout)
    assert out["download"] is True and out["file"] == "PunktSentenceTokenizer" and out["stand_in"] is True
    assert out["split"] == ["the model train.", "the gpu batch!", 'Dr. Smith said "ok."', "Then\nit ended"]
    assert out["keep"] == ["one. ", "two.\n ", "three."]


def test_nltk_stand_in_refuses_other_resources():
    env = dict(os.environ, PYTHONPATH=str(NLTK_OFFLINE))
    done = subprocess.run([sys.executable, "-c", "import nltk; nltk.load('nltk:corpora/wordnet')"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "LookupError: Resource 'nltk:corpora/wordnet' not found" in done.stderr


def _punkt_module():
    """The stand-in's punkt module, loaded under a private name (no `nltk` enters sys.modules)."""
    path = NLTK_OFFLINE / "nltk" / "tokenize" / "punkt.py"
    spec = importlib.util.spec_from_file_location("_bert_acceptance_punkt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PUNKT = _punkt_module()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab .!?\n\"", max_size=60))
def test_nltk_stand_in_loses_no_text(text):
    sentences = PUNKT.PunktSentenceTokenizer().tokenize(text)
    assert "".join("".join(sentences).split()) == "".join(text.split())  # every visible character, in order
    assert all(s == s.strip() and s for s in sentences)


# ---------------------------------------------------------------- the real core_v0.16.1 tool, on CPU


@pytest.mark.slow
def test_real_core_v0161_preprocess_runs_offline_on_cpu_and_its_output_reads_back(tmp_path, triton_shim):
    _needs(REAL_016)
    _needs_modules(REAL_016_MODULES)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    corpus = _corpus(tmp_path / "corpus.json", 300)
    (tmp_path / "data").mkdir()
    plan = mlm.plan_preprocess(detect(REAL_016), corpus, tmp_path / "data" / "corpus", VOCAB_FILE,
                               tmp_path / "work", extra_pythonpath=[triton_shim])
    done = mlm.run_preprocess(plan, tmp_path)
    assert done.ok, done.failure_message()
    assert len(done.results) == 2, "core_v0.16.1 with --split-sentences should need the second run (#1052)"
    dataset = IndexedDataset(str(done.data_prefix))
    assert len(dataset.document_indices) == 301 and len(dataset) == 3000  # 300 documents of 10 sentences
    assert list(dataset[0]) == [1996, 2944, 3345, 2951, 14246, 2226, 14108, 6741, 3086, 1996, 2944, 3345, 2951,
                                14246, 2226, 1012]  # "the model train data gpu batch layer attention ... gpu."
    _same_as_the_suites_preprocess(corpus, tmp_path, dataset)


def _same_as_the_suites_preprocess(corpus: Path, tmp_path: Path, dataset) -> None:
    """harness.data.preprocess (the suite's drop-in) encodes the same corpus to the same tokens and sentences."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from harness.data import preprocess   # the project's own module: failing to import it fails this test
    preprocess.preprocess(corpus, tmp_path / "suite", VOCAB_FILE, split_sentences=True)
    ours = IndexedDataset(str(tmp_path / "suite_text_sentence"))
    assert numpy.array_equal(ours.sequence_lengths, dataset.sequence_lengths)
    assert numpy.array_equal(ours.document_indices, dataset.document_indices)
    assert all(numpy.array_equal(ours[i], dataset[i]) for i in range(0, len(dataset), 97))


def _real_016_script(tmp_path: Path, triton_shim: str, *, launcher: bool) -> str:
    """core_v0.16.1's pretrain_bert.py with `--spec local`, directly or through the no-TE launcher: its log."""
    _needs(REAL_016)
    _needs_modules(REAL_016_MODULES)
    checkout = detect(REAL_016)
    head = [str(NO_TE_LAUNCHER)] if launcher else []
    path = [triton_shim, str(checkout.root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    done = subprocess.run([sys.executable, *head, str(checkout.train_script), "--spec", "local"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=180)
    assert done.returncode != 0  # no data, no flags, no torchrun: it must stop, the question is where
    return done.stdout + done.stderr


@pytest.mark.slow
def test_real_core_v0161_training_script_fails_without_te_as_predicted(tmp_path, triton_shim):
    log = _real_016_script(tmp_path, triton_shim, launcher=False)
    assert "ImportError: Transformer Engine is not installed" in log and NO_TE_PATCHED not in log
    assert diagnose("train", 1, log).cause_id == "transformer-engine"


@pytest.mark.slow
def test_real_core_v0161_training_script_passes_its_imports_through_the_no_te_launcher(tmp_path, triton_shim):
    log = _real_016_script(tmp_path, triton_shim, launcher=True)
    assert NO_TE_PATCHED in log and "Transformer Engine is not installed" not in log, log[-3000:]
    assert "in pretrain" in log or "in initialize_megatron" in log, log[-3000:]  # it reached Megatron's main


# ---------------------------------------------------------------- local HF tokenizer folder


def test_local_tokenizer_folder_loads_offline_with_tokenizers(tmp_path):
    from tokenizers import Tokenizer

    folder = build_hf_tokenizer_dir(VOCAB_FILE, tmp_path / HF_TOKENIZER_NAME)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 30522
    assert tokenizer.encode("The model TRAIN.", add_special_tokens=False).ids == [1996, 2944, 3345, 1012]
    assert tokenizer.encode("gpu").ids == [101, 14246, 2226, 102]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert (folder / "vocab.txt").read_bytes() == VOCAB_FILE.read_bytes()


TRANSFORMERS_SCRIPT = """
import json
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(pretrained_model_name_or_path="bert-large-uncased", vocab_file=VOCAB, use_fast=True)
print(json.dumps({"size": len(t), "ids": t("The model TRAIN.", add_special_tokens=False).input_ids}))
"""


def test_local_tokenizer_folder_loads_offline_with_transformers_as_main_calls_it(tmp_path):
    if importlib.util.find_spec("transformers") is None:
        _skip_or_fail("transformers is not installed here (pip install transformers to run this test)")
    build_hf_tokenizer_dir(VOCAB_FILE, tmp_path / HF_TOKENIZER_NAME)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    code = TRANSFORMERS_SCRIPT.replace("VOCAB", repr(str(VOCAB_FILE)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"size": 30522, "ids": [1996, 2944, 3345, 1012]}


def test_tokenizer_folder_needs_an_existing_vocab(tmp_path):
    with pytest.raises(CheckoutError, match="vocab file not found"):
        build_hf_tokenizer_dir(tmp_path / "nope.txt", tmp_path / "out")


# ---------------------------------------------------------------- compatibility matrix


def _rows() -> list[dict]:
    """Two versions x two stages."""
    old, new = detect(FAKE_016), detect(FAKE_MAIN)
    te = Adaptation("[local-spec] --spec local --attention-backend local", "no TE")
    return [mlm.version_matrix_row(old, "preprocess", "pass", adaptations=[te]),
            mlm.version_matrix_row(old, "train", "cannot-run", "imports the TE spec"),
            mlm.version_matrix_row(new, "preprocess", "fail", "[preprocess-no-output] nothing written")]


def test_matrix_markdown_is_version_by_stage():
    text = mlm.matrix_markdown(_rows())
    lines = text.splitlines()
    assert lines[:4] == ["| Megatron-LM | preprocess | train |", "|---|---|---|", "| 0.16.1 | pass | cannot-run |",
                         "| 0.20.0 | fail |  |"]
    assert "- train: cannot-run: imports the TE spec" in text and "  - [local-spec] --spec local" in text


def test_matrix_row_refuses_an_unknown_outcome():
    with pytest.raises(ValueError, match="outcome 'ok' is not one of pass, fail, cannot-run, not-run"):
        mlm.version_matrix_row(detect(FAKE_016), "train", "ok")


def test_table_command_writes_markdown_and_json(tmp_path, capsys):
    results = tmp_path / "RESULTS.json"
    results.write_text(json.dumps(_rows()))
    assert mlm.main(["table", str(results), "--markdown", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json")]) == 0
    assert capsys.readouterr().out == (tmp_path / "t.md").read_text()
    assert json.loads((tmp_path / "t.json").read_text())["rows"] == _rows()


def test_table_command_names_the_bad_file_and_row(tmp_path, capsys):
    results = tmp_path / "RESULTS.json"
    results.write_text(json.dumps([{"version": "0.16.1", "stage": "train"}]))
    assert mlm.main(["table", str(results)]) == 2
    assert f"{results}: row 0 lacks outcome" in capsys.readouterr().err


def test_row_from_a_failed_stage_carries_its_diagnosis(tmp_path):
    root = _copy(FAKE_NO_OUTPUT, tmp_path)
    done = mlm.run_preprocess(_plan(root, tmp_path), tmp_path)
    row = mlm.row_from_result(detect(root), done, "preprocess", done.adaptations)
    assert row["outcome"] == "fail" and row["detail"].startswith("[preprocess-no-output]")
    assert row["adaptations"][-1].startswith("ran the identical preprocess command again")


# ---------------------------------------------------------------- speed against the reference trainer

RECORDED_LOG = FIXTURES / "logs" / "core_v0.16.1_h200_course_flags_binary_head.log"


def test_speed_command_puts_megatron_next_to_the_reference_trainer(tmp_path, capsys):
    from statistics import median

    from harness.evidence.logs import parse_log_file

    report = {"checkout": {"version": "0.16.1"}, "runs": [{"seconds": 77.0, "log": str(RECORDED_LOG)}]}
    bench = {"runs": {mlm.REFERENCE_VARIANT: {"wall_s": 24.7, "ms_per_iter_median": 8.4}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert mlm.main(["speed", str(tmp_path / "report.json"), str(tmp_path / "bench.json"), "--out",
                     str(tmp_path / "speed.json")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp_path / "speed.json").read_text())
    logged = median(r.elapsed_ms for r in parse_log_file(RECORDED_LOG).iterations[1:])
    assert result["megatron_lm"]["ms_per_iter_median"] == round(logged, 2)
    assert result["wall_ratio"] == round(77.0 / 24.7, 2)
    assert result["ms_per_iter_ratio"] == round(round(logged, 2) / 8.4, 2)


def test_speed_command_names_a_bad_report(tmp_path, capsys):
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "bench.json").write_text("{}")
    assert mlm.main(["speed", str(tmp_path / "report.json"), str(tmp_path / "bench.json")]) == 2
    assert f"{tmp_path / 'report.json'}: cannot compare speed" in capsys.readouterr().err


def test_run_summary_of_a_checkout_run_names_gpu_versions_and_speed():
    """The report header of a checkout run: the GPU NVML saw, the versions, and Megatron's own median ms/iter."""
    from types import SimpleNamespace

    from harness.base import paths
    from harness.evidence.records import MemoryReport

    log = paths.REPO / "fixtures" / "logs" / "core_v0.16.1_h200_course_flags_binary_head.log"
    memory = MemoryReport(method="nvml-process", peak_mib=3222, samples=10, gpu_name="NVIDIA H200", saw_process=True)
    summary = mlm.run_summary(SimpleNamespace(version="0.16.1"), log, memory)
    assert summary["gpu"] == "NVIDIA H200" and summary["device"] == "cuda" and summary["iterations"] == 200
    assert summary["versions"]["megatron_lm"] == "0.16.1" and summary["versions"]["torch"]
    from statistics import median

    from harness.evidence.logs import parse_log_file

    intervals = [r.elapsed_ms for r in parse_log_file(log).iterations[1:]]
    assert summary["ms_per_iter_median"] == round(median(intervals), 2) and 80 < summary["ms_per_iter_median"] < 200


def test_checkout_mode_has_one_test_per_criterion_of_its_profile_but_resume_matches():
    """Checkout mode trains no resume run; every other criterion of the megatron-lm profile is a test of its own."""

    spec = importlib.util.spec_from_file_location("checkout_tests", REPO / "acceptance" / "test_checkout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    profile_ids = [c.id for c in load_profile("megatron-lm").criteria]
    assert sorted(module.CRITERIA) == sorted(set(profile_ids) - {"resume-matches"})
