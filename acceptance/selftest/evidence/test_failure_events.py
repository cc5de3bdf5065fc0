"""harness.evidence.failure_events: a failure read as a structure (the run's first error event), through any prefix."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings, strategies as st

from harness.evidence import failure_events as fe, logread
from harness.base.paths import FIXTURES, RECORDED_LOGS

REAL_LOGS = sorted((RECORDED_LOGS / "population").glob("*.log.gz")) + sorted(RECORDED_LOGS.glob("*.log"))
TRACEBACK = '''Traceback (most recent call last):
  File "/opt/Megatron-LM/tools/preprocess_data.py", line 25, in <module>
    from megatron.training.tokenizer import build_tokenizer
  File "/opt/Megatron-LM/megatron/training/tokenizer/tokenizer.py", line 17, in <module>
    from megatron.training.tokenizer.multimodal_tokenizer import MultimodalTokenizer
ModuleNotFoundError: No module named 'transformer_engine'
'''


def _text(path) -> str:
    return "\n".join(logread.read_lines(path))


@pytest.mark.parametrize("path", REAL_LOGS + [FIXTURES / "diagnoses" / "healthy.log"], ids=lambda p: p.name)
def test_a_real_healthy_log_has_no_error_event(path):
    """Megatron's warnings, NCCL's [W] guesses, UserWarnings: none of them is an error."""
    assert fe.events(_text(path)) == []


def test_a_traceback_is_read_into_type_message_frames_program_and_module():
    ev = fe.first_error(TRACEBACK)
    assert (ev.kind, ev.type, ev.message) == ("exception", "ModuleNotFoundError", "No module named 'transformer_engine'")
    assert [f.function for f in ev.frames] == ["<module>", "<module>"]
    assert ev.frames[0].source == "from megatron.training.tokenizer import build_tokenizer"
    assert ev.program == "tools/preprocess_data.py"
    assert ev.module == "megatron/training/tokenizer/tokenizer.py"
    assert ev.raised_in.where() == "megatron/training/tokenizer/tokenizer.py:17 in <module>"


@pytest.mark.parametrize("prefix", ["[rank3]: ", "[default3]:", "3: ", "(head, rank=3, pid=4242) ",
                                    "(MegatronPolicyWorker pid=1391870) ", "2026-11-29T14:17:59.537Z ",
                                    "2026-11-29 14:17:59,537 ", "[14:17:59] ", "[80746] ", "stderr: ",
                                    "[80746] [rank3]:", "0: [rank3]: "])
def test_the_same_event_through_any_prefix(prefix):
    """A launcher's or logger's wrapping is taken off every line, whether or not the rest of the log has it."""
    head = "Megatron says hello\n" * 3
    wrapped = head + "".join(prefix + line + "\n" for line in TRACEBACK.splitlines())
    ev = fe.first_error(wrapped)
    assert (ev.type, ev.message, ev.program) == ("ModuleNotFoundError", "No module named 'transformer_engine'",
                                                 "tools/preprocess_data.py"), prefix
    if any(tag in prefix for tag in ("rank3", "default3", "rank=3")) or prefix == "3: ":
        assert ev.rank == 3, prefix          # the innermost prefix's rank (srun's task id is outside torchrun's)


def test_argparse_usage_and_error_name_the_program():
    ev = fe.first_error("usage: pretrain_bert.py [-h] [--num-layers N]\n"
                        "pretrain_bert.py: error: unrecognized arguments: --legacy-tokenizer\n")
    assert (ev.kind, ev.program, ev.message) == ("argparse", "pretrain_bert.py",
                                                 "unrecognized arguments: --legacy-tokenizer")


def test_torchruns_report_is_a_consequence_of_the_worker_error_it_follows():
    worker = "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1, in <module>\n" \
             "[rank0]: AssertionError: bad split\n"
    launcher = ("E1202 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 "
                "(pid: 9) of binary: /usr/bin/python\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                "pretrain_bert.py FAILED\nRoot Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
                "  exitcode  : 1 (pid: 9)\n=====\n")
    assert fe.first_error(worker + launcher).type == "AssertionError"
    alone = fe.first_error(launcher)
    assert alone.kind == "launcher" and alone.exit_code == 1
    child = [e for e in fe.events(launcher) if e.type == "ChildFailedError"][0]
    assert (child.program, child.rank, child.exit_code) == ("pretrain_bert.py", 0, 1)


@pytest.mark.parametrize("line, signal", [
    ("failed (exitcode: -9) local_rank: 0 (pid: 1) of binary: /usr/bin/python", "SIGKILL"),
    ("exits with return code = -7", "SIGBUS"),
    ("[610867610e4b:2498 :0:2599] Caught signal 7 (Bus error: nonexistent physical address)", "SIGBUS"),
    ("Segmentation fault (core dumped)", "SIGSEGV"),
    ("WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers", "SIGHUP"),
    ("Received Signals.SIGTERM death signal, shutting down workers", "SIGTERM"),
])
def test_a_signal_is_named_from_an_exit_code_or_the_crash_line(line, signal):
    assert fe.first_error(line + "\n").signal == signal


def test_what_a_stopped_run_prints_while_torn_down_is_not_a_cause():
    """torchrun's SignalException is the launcher receiving a signal; the teardown errors after it are its noise."""
    text = ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 4082 got signal: 15\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"/usr/lib/python3.12/pathlib.py\", line 441, in __str__\n"
            "AttributeError: 'PosixPath' object has no attribute '_str'\n")
    found = fe.events(text)
    assert (found[0].kind, found[0].type, found[0].signal) == ("launcher", "death-signal", "SIGTERM")
    assert fe.before_stopped(found) == [] and len(found) == 2


def test_nccl_terminate_and_logged_errors_are_events():
    nccl = fe.first_error("host:1:2 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on "
                          "CUDA device 1000\n")
    assert nccl.kind == "nccl" and "Duplicate GPU" in nccl.detail
    term = fe.first_error("terminate called after throwing an instance of 'c10::Error'\n"
                          "  what():  CUDA error: device-side assert triggered\n")
    assert (term.kind, term.type, term.message) == ("terminate", "c10::Error", "CUDA error: device-side assert triggered")
    logged = fe.first_error("ERROR:megatron.core.datasets.utils:Failed to compile the C++ dataset helper functions\n")
    assert (logged.kind, logged.type) == ("logged", "megatron.core.datasets.utils")
    cpp = fe.first_error("[W socket.cpp:401] [c10d] errno: 98 - Address already in use\n"
                         "[E socket.cpp:435] [c10d] The server socket has failed to listen on any local address.\n")
    assert cpp.kind == "logged" and "errno: 98" in cpp.text


def test_the_first_exception_of_a_chain_is_the_cause():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in load\nKeyError: 'iteration'\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"a.py\", line 3, in load\nKeyError: 'total_iters'\n")
    ev = fe.first_error(text)
    assert ev.message == "'iteration'" and ev.raised_in.where() == "a.py:1 in load"


def test_a_message_keeps_the_lines_that_continue_it():
    ev = fe.first_error("torch.distributed.DistBackendError: NCCL error in: x.cpp:1, invalid usage\n"
                        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
                        "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device f000\n")
    assert ev.short_type == "DistBackendError" and "Duplicate GPU detected" in ev.detail
    assert len(fe.events("torch.distributed.DistBackendError: x\nncclInvalidUsage: y\n")) == 1


def test_a_long_hostile_log_is_read_in_bounded_time():
    line = " [2026-11-29 14:17:22] iteration 1/ 200 | lm loss: 1.0 |\n"
    text = line * 20_000 + "x" * (2 << 20) + "\n" + ("  File \"a.py\", line 1, in f\n" * 5000) + "ValueError: x\n"
    started = time.monotonic()
    ev = fe.first_error(text)
    assert time.monotonic() - started < 15
    assert ev.type == "ValueError" and len(ev.frames) == fe.MAX_FRAMES


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_any_text_is_read_without_an_exception(text):
    for ev in fe.events(text):
        assert ev.kind in ("exception", "argparse", "launcher", "nccl", "terminate", "signal", "logged")
        assert 0 <= ev.line_no <= text.count("\n") + text.count("\r") + 1


@settings(max_examples=80, deadline=None)
@given(prefix=st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="\\"), min_size=1,
                      max_size=60).filter(lambda p: p.strip() and "Traceback" not in p and "File" not in p))
def test_a_traceback_behind_a_wrapper_no_pattern_knows_is_read_through_its_own_first_line(prefix):
    """Whatever precedes `Traceback (most recent call last)` on its line and begins the next line too is a wrapper
    (a job runner's `[177/train/578 (pid 28936)] [uuid] `): the same event as without it."""
    wrapped = "Megatron says hello\n" + "".join(prefix + line + "\n" for line in TRACEBACK.splitlines())
    ev = fe.first_error(wrapped)
    assert ev is not None and (ev.type, ev.message, ev.program) == (
        "ModuleNotFoundError", "No module named 'transformer_engine'", "tools/preprocess_data.py"), prefix


def test_an_ipython_traceback_is_read_into_its_frames_and_the_line_each_arrow_marks():
    text = ("ImportError                               Traceback (most recent call last)\n"
            "<ipython-input-2-4dd6bfff15e9> in <module>()\n     12 import os\n---> 14 from transformers import (\n"
            "     15     BertConfig,\n\n"
            "~/env/lib/python3.8/site-packages/transformers/__init__.py in <module>\n---> 3 from .x import y\n\n"
            "ImportError: cannot import name 'GradientAccumulator'\n")
    ev = fe.first_error(text)
    assert (ev.type, ev.message) == ("ImportError", "cannot import name 'GradientAccumulator'")
    assert [(f.file, f.line, f.function, f.source) for f in ev.frames] == [
        ("<ipython-input-2-4dd6bfff15e9>", 14, "<module>", "from transformers import ("),
        ("~/env/lib/python3.8/site-packages/transformers/__init__.py", 3, "<module>", "from .x import y")]
    new = ("---------------------------------------------------------------------------\nValueError    Traceback (most "
           "recent call last)\nCell In[3], line 5\n----> 5 f(1)\nFile ~/lib/python3.11/site-packages/m/x.py:12, in "
           "f(a)\n---> 12 raise ValueError('no')\nValueError: no\n")
    assert [(f.file, f.line, f.source) for f in fe.first_error(new).frames] == [
        ("Cell In[3]", 5, "f(1)"), ("~/lib/python3.11/site-packages/m/x.py", 12, "raise ValueError('no')")]


def test_a_traceback_cut_before_its_exception_line_is_the_statement_that_raised():
    cut = ('Traceback (most recent call last):\n  File "train.py", line 11, in <module>\n    dist.init()\n'
           '  File "/u/torch/distributed/rendezvous.py", line 166, in _env_rendezvous_handler\n'
           '    raise _env_error("MASTER_ADDR")\n')
    ev = fe.first_error(cut)
    assert (ev.kind, ev.message, ev.program, ev.raised_in.function) == (
        "exception", 'raise _env_error("MASTER_ADDR")', "train.py", "_env_rendezvous_handler")
    assert fe.first_error(cut.replace("raise ValueError", "x").replace('raise _env_error("MASTER_ADDR")', "x = 1")) \
        is None, "a traceback cut elsewhere than at a raise names nothing"
    named = fe.first_error(cut.replace('_env_error("MASTER_ADDR")', 'KeyError("k")'))
    assert named.type == "KeyError"
    # cut, then another traceback that ends: both events, in the order they were printed
    both = fe.events(cut + 'Traceback (most recent call last):\n  File "b.py", line 1, in <module>\nOSError: no\n')
    assert [e.type for e in both] == ["exception", "OSError"]
    # frames with no traceback line of their own (faulthandler's dump) are no cut traceback
    dump = 'Timeout (0:02:00)!\nFile "/u/torch/utils/file_baton.py", line 50 in wait\n    raise X()\n'
    assert fe.events(dump) == []
