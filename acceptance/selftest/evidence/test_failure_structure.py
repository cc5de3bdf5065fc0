"""harness.evidence.failure_structure: a failure read by its structure (errno and the run's flag for the path it
names, the package that raised, the flags and environment variables it names, an OOM message's numbers, the stage
the log had reached), each as a property over many inputs: every errno, every path argument of real logs, every
flag of every Megatron-LM release, every stage of a real log, any OOM numbers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from harness.base.paths import RECORDED_LOGS
from harness.evidence import diagnose as dg, failure_events as fe, failure_structure as fs, logread
from harness.tools import failure_catalogue as fc

TABLE = dg.load_table()
HEAD_LOG = fc.HEAD_LOG.read_text(encoding="utf-8")
REAL_LOGS = sorted(RECORDED_LOGS.glob("runs-h200/*.log.gz")) + [fc.HEAD_LOG]
FLAGS = fs.flags_table()
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")


def read(text: str, stalled: bool = False) -> fs.Reading:
    return dg.StageOutput("train", None if stalled else 1, text, stalled=stalled).reading


# ---- errno ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, code", fs._STRERROR, ids=[s for s, _ in fs._STRERROR])
def test_every_errno_is_read_from_its_number_or_from_the_c_librarys_text_for_it(text, code):
    name = errno.errorcode[code]
    for line in (f"OSError: [Errno {code}] {text}: '/x/y'", f"RuntimeError: unable to open /x/y: {text} ({code})",
                 f"RuntimeError: something failed: {text}", f"[E socket.cpp:1] errno: {code} - {text}"):
        got = read(line)
        assert (got.errno, got.errno_name, got.strerror) == (code, name, os.strerror(code)), line


def test_a_vague_text_is_no_errno_without_its_number():
    assert read("ValueError: Invalid argument for --lr").errno is None
    assert read("OSError: [Errno 22] Invalid argument: '/x'").errno_name == "EINVAL"


# ---- the path and the run's flag for it -------------------------------------------------------------------------

def _path_arguments(text: str) -> dict:
    return {k: v.strip("[]' ") for k, v in fs.arguments_of(text).items() if v.strip("[]' ").startswith("/")}


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: p.name)
def test_a_path_under_any_path_argument_of_a_real_run_is_named_by_that_flag(log):
    text = "\n".join(logread.read_lines(log))
    arguments = _path_arguments(text)
    assert arguments, log
    head = text.split("[before the start of training step]")[0]
    for name, value in arguments.items():
        failure = f"OSError: [Errno 28] No space left on device: '{value}/sub/file.pt'\n"
        got = read(head + "\n" + failure)
        want = "--" + name.replace("_", "-")
        owner = next(n for n, v in arguments.items() if fs._same_place(f"{value}/sub/file.pt", v))
        assert got.role == "--" + owner.replace("_", "-") and got.role_how == "the run's arguments block", (name, got)
        assert owner == name or value.startswith(arguments[owner]), (want, owner)


@pytest.mark.parametrize("path, frame, role", [
    ("/dev/shm/torch_12_34", "", "/dev/shm"), ("</torch_1234_567_8>", "", "/dev/shm"),
    ("/root/.cache/torch_extensions/py310/fused/lock", "", "a cache folder"),
    ("/ckpt/iter_0000100/model.pt", "megatron/training/checkpointing.py:save_checkpoint", "--save"),
    ("/ckpt/iter_0000100/model.pt", "megatron/training/checkpointing.py:load_checkpoint", "--load"),
    ("/data/my-vocab.txt", "", "--vocab-file"), ("/data/corpus_text_sentence.bin", "", "--data-path"),
    ("/work/out.txt", "", None)])
def test_without_the_arguments_block_the_path_or_the_traceback_says_what_it_is(path, frame, role):
    frames = ""
    if frame:
        file, func = frame.split(":")
        frames = f'Traceback (most recent call last):\n  File "/opt/Megatron-LM/{file}", line 9, in {func}\n    x()\n'
    got = read(f"{frames}OSError: [Errno 13] Permission denied: '{path}'\n")
    assert got.role == role, got


def test_the_stage_says_what_a_path_is_when_nothing_else_does():
    head = HEAD_LOG.split("[before the start of training step]")[0]
    got = read(head + "saving checkpoint at iteration     100 to /elsewhere\nOSError: [Errno 28] No space left on device\n")
    assert (got.reached, got.role, got.role_how) == ("save", "--save", "the stage the log had reached")


# ---- the stage a log had reached ----------------------------------------------------------------------------------

@pytest.mark.parametrize("point, stage", [("import", "arguments"), ("init", "init"), ("kernels", "kernels"),
                                          ("model", "model"), ("dataset", "dataset"), ("step", "training"),
                                          ("later", "training")])
def test_the_stage_reached_is_the_last_progress_line_of_a_real_log_before_the_error(point, stage):
    text = "\n".join(fc._head(point)) + "\nRuntimeError: boom\n"
    got = read(text)
    assert got.reached == stage and got.log_kind == "training", (point, got.reached)


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=1, max_value=len(HEAD_LOG.splitlines()) - 1))
def test_a_real_log_cut_anywhere_gets_no_cause_but_what_its_stage_means(cut):
    """A healthy run's log stopped at any line, with no error: the grader (no live-run timeout) names at most the
    stage's own meaning (a stale build lock while loading kernels, a rendezvous while initialising, the BERT sample
    index while building datasets), never an error it does not show."""
    lines = HEAD_LOG.splitlines()[:cut]
    text = "\n".join(lines) + "\n"
    rules = [r for r in dg.RULES if r.id != "timeout"]
    found = dg.diagnose("train", None, text, stalled=True, rules=rules)
    reached = read(text, stalled=True).reached
    allowed = {"kernels": "build-lock", "init": "rendezvous-hang", "dataset": "one-sentence-docs"}
    assert found is None or found.cause_id == allowed.get(reached), (cut, reached, found)


def test_a_preprocessing_log_is_read_as_one():
    got = read("Opening data/corpus.json\nTime to startup: 0.5\nProcessed 1000 documents (2000.0 docs/s, 1.0 MB/s).\n",
               stalled=True)
    assert (got.reached, got.log_kind) == ("preprocess", "preprocess")
    tb = ('Traceback (most recent call last):\n  File "/m/tools/preprocess_data.py", line 9, in <module>\n    main()\n'
          "ValueError: bad\n")
    assert read(tb).log_kind == "preprocess"


# ---- an OOM message's numbers -------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(total=st.floats(8, 200), free_share=st.floats(0, 0.05), own_share=st.floats(0.01, 0.99))
def test_another_process_is_named_exactly_when_the_numbers_leave_memory_this_process_does_not_hold(total, free_share,
                                                                                                    own_share):
    free, own = total * free_share, total * own_share
    new = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           f"{total:.2f} GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has "
           f"{own:.2f} GiB memory in use.")
    kind, numbers = fs.oom_numbers(new)
    other = round(total, 2) - round(free, 2) - round(own, 2)
    assert kind == ("other-process" if other > max(1.0, 0.1 * round(total, 2)) else "own"), (kind, numbers)
    assert abs(numbers["other"] - max(0.0, other)) < 1e-6
    old = (f"RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; {total:.2f} GiB total capacity; "
           f"{own:.2f} GiB already allocated; {free * 1024:.2f} MiB free; {own:.2f} GiB reserved in total by PyTorch)")
    kind, numbers = fs.oom_numbers(old)
    assert kind in ("other-process", "own") and numbers["total"] == pytest.approx(round(total, 2))


def test_an_oom_without_numbers_says_nothing_about_other_processes():
    assert fs.oom_numbers("torch.OutOfMemoryError: CUDA out of memory.") == (None, {})
    assert fs.oom_numbers("nothing here") == (None, {})


# ---- flags: the run's arguments and every release's parser --------------------------------------------------------

def test_every_renamed_flag_refused_by_a_parser_is_named_with_its_new_name():
    assert len(FLAGS["renamed"]) >= 15
    for old, (new, release) in FLAGS["renamed"].items():
        _, flag = fs.flags_named(f"unrecognized arguments: {old} 1", {}, frozenset({old}))
        assert (flag.state, flag.new, flag.release) == ("renamed", new, release), old
        assert new in FLAGS["flags"] and release in FLAGS["releases"]


def test_every_other_refused_flag_is_removed_newer_or_known_by_its_releases():
    releases, last = FLAGS["releases"], len(FLAGS["releases"]) - 1
    for name, info in FLAGS["flags"].items():
        if name in FLAGS["renamed"]:
            continue
        flag = fs._flag_state(name, {}, True, False)
        want = ("removed", releases[info["last"] + 1]) if info["last"] < last else \
            ("newer", releases[info["first"]]) if info["first"] > 0 else ("known", None)
        assert (flag.state, flag.release) == want, name


def test_a_flag_of_no_release_is_unknown_with_the_closest_flag():
    flag = fs._flag_state("--micro-batchsize", {}, True, False)
    assert (flag.state, flag.near) == ("unknown", "--micro-batch-size")
    assert fs._flag_state("--completely-made-up-xyz", {}, True, False).near is None


@pytest.mark.parametrize("words, state", [
    ("Specify --no-load-rng or --finetune to prevent attempting to load the rng state", "fix"),
    ("please use --no-load-optim", "fix"), ("consider passing `--no-load-optim`", "fix"),
    ("--no-load-rng is not supported here", "named"), ("--fp16 and --bf16 cannot both be set", "named")])
def test_a_switch_offered_as_the_fix_that_the_run_did_not_turn_on(words, state):
    args = fs.arguments_of(HEAD_LOG)
    _, flag = fs.flags_named(words, args)
    assert flag.state == state, (words, flag)


def test_a_switch_the_run_did_turn_on_is_not_offered_as_the_fix():
    args = dict(fs.arguments_of(HEAD_LOG), no_load_rng="True")
    _, flag = fs.flags_named("Specify --no-load-rng to go on", args)
    assert flag.state == "given"


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no Megatron-LM repository here to derive the table from")
@pytest.mark.parametrize("release", ["23.04", "core_v0.16.1"])
def test_the_flags_table_is_what_the_releases_sources_say(release):
    derived = fc.release_flags(str(MIRROR), release)
    index = FLAGS["releases"].index(release)
    committed = {f for f, info in FLAGS["flags"].items() if info["first"] <= index <= info["last"]}
    assert set(derived) <= committed and len(derived) > 200


def test_the_flags_table_holds_the_dests_a_real_runs_arguments_block_prints():
    index = FLAGS["releases"].index("core_v0.16.1")
    dests = {info["dest"] for info in FLAGS["flags"].values() if info["first"] <= index <= info["last"]}
    printed = set(fs.arguments_of(HEAD_LOG))
    assert len(printed - dests) <= 20, sorted(printed - dests)     # computed ones: rank, world_size, params_dtype ...


# ---- environment variables, the package, the versions ---------------------------------------------------------------

@pytest.mark.parametrize("line, names", [
    ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable MASTER_ADDR "
     "expected, but not set", ("MASTER_ADDR",)),
    ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, "
     "but not set", ("RANK",)),
    ("RuntimeError: CUDA_HOME is not set", ("CUDA_HOME",)),
    ("RuntimeError: CUDA error: out of memory", ()), ("AssertionError: NCCL_ERROR in x", ())])
def test_the_environment_variables_a_message_names(line, names):
    assert read(line).env == names


@pytest.mark.parametrize("file, package", [
    ("/usr/lib/python3.10/site-packages/numpy/core/x.py", "numpy"),
    ("/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py", "torch"),
    ("/usr/local/lib/python3.8/dist-packages/deepspeed-0.9.0-py3.8.egg/deepspeed/x.py", "deepspeed"),
    ("/work/Megatron-LM/megatron/core/utils.py", "megatron"), ("/usr/lib/python3.10/os.py", "python"),
    ("/home/u/train.py", None), (None, None)])
def test_the_package_of_a_file(file, package):
    assert fs.package_of(file) == package


@pytest.mark.parametrize("text, library, version", [
    ("numpy==2.0.1\n", "numpy", "2.0.1"), ("torch version: 2.1.0+cu121", "torch", "2.1.0+cu121"),
    ("Requirement already satisfied: transformers 4.41.2", "transformers", "4.41.2"),
    ("/x/site-packages/numpy-1.24.0.dist-info/METADATA", "numpy", "1.24.0"), ("numpyro 0.9", "numpy", None),
    ("torch", "torch", None)])
def test_the_version_the_log_prints_for_a_library(text, library, version):
    assert fs.version_printed(text, library) == version


def test_the_python_the_frames_ran_and_the_cuda_of_torch_and_the_driver():
    got = read('torch 2.2.0+cu121\nTraceback (most recent call last):\n  File "/usr/lib/python3.8/site-packages/'
               'torch/cuda/__init__.py", line 9, in _lazy_init\n    x()\nRuntimeError: The NVIDIA driver on your '
               "system is too old (found version 11040).\n")
    assert (got.python, got.torch, got.torch_cuda, got.driver_cuda, got.package) == ("3.8", "2.2.0+cu121", "12.1",
                                                                                    "11.4", "torch")


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=400))
def test_any_text_is_read_without_an_exception(text):
    ev = fe.first_error(text)
    got = fs.read(text, ev, stages=TABLE.stages, roles=TABLE.roles)
    assert isinstance(got, fs.Reading)
    for name in ("errno_name", "role", "flag", "flag_state", "oom", "reached", "env", "oom_total"):
        got.value(name)


# ---- syntax newer than the Python that ran it ---------------------------------------------------------------------

SYNTAX_SAMPLES = {   # a line using each construct of causes.toml's [[syntax]] table
    "the walrus operator `:=`": '    if req["specs"] and (specs := req["specs"][0]):',
    "positional-only parameters `/`": "def f(a, b, /, c):",
    "the f-string `=` specifier": '    print(f"{value=}")',
    "the `match` statement": "    match command.split():",
    "parenthesized context managers": "    with (open(a) as f, open(b) as g):",
    "`except*`": "    except* ValueError:",
    "the `type` statement": "type Point = tuple[float, float]",
    "type parameter lists (`def f[T]`, `class C[T]`)": "def first[T](items: list[T]) -> T:",
    "f-strings": '    name = f"{first} {last}"',
}
PLAIN_LINES = ("x = f(a, b)", "if a == b:", "with (open(a)) as f:", "print('match: %s' % x)", "with open(p) as f:", "except ValueError:",
               "def f(a, b=2, *args, **kw):", "types = {'a': 1}", 'text = "{x}".format(x=1)', "case_sensitive = True")


def test_every_construct_of_the_syntax_table_is_read_with_its_python_and_no_plain_line_is():
    assert {s["name"] for s in TABLE.syntaxes} == set(SYNTAX_SAMPLES)
    for syntax in TABLE.syntaxes:
        text = f"  File \"/u/x.py\", line 3\n{SYNTAX_SAMPLES[syntax['name']]}\n        ^\nSyntaxError: invalid syntax\n"
        got = read(text)
        assert (got.syntax_feature, got.syntax_python) == (syntax["name"], syntax["python"]), syntax["name"]
    for line in PLAIN_LINES:
        assert read(f"{line}\n    ^\nSyntaxError: invalid syntax\n").syntax_python is None, line


def test_a_syntax_error_under_a_newer_python_is_named_with_the_version_it_needs():
    found = dg.diagnose("train", 1, f"{SYNTAX_SAMPLES['the `match` statement']}\n    ^\nSyntaxError: invalid syntax\n")
    assert found.cause_id == "python-too-old" and "3.10" in found.cause and "`match`" in found.cause
    typo = dg.diagnose("train", 1, "    x = (1, 2\n          ^\nSyntaxError: invalid syntax\n")
    assert typo is None or typo.cause_id != "python-too-old", "a typo is not a Python version"


def test_the_library_of_a_failed_import_is_the_import_statement_of_the_frame_that_raised():
    tb = ('Traceback (most recent call last):\n  File "/w/train.py", line 3, in <module>\n    from deepspeed.ops '
          "import adam\nImportError: cannot import name 'adam'\n")
    assert read(tb).library == "deepspeed"
    assert read(tb.replace("from deepspeed.ops import adam", "import numpy.linalg")).library == "numpy"
    assert read(tb.replace("ImportError", "ValueError")).library is None
