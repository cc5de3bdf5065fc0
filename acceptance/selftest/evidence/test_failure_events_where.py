"""harness.evidence.failure_events, field by field: where a failure was raised (the root cause's file, line and
function, what `grade` and `diagnose` print as "where") is the exception's own innermost frame, whatever the log
prints after it: a second traceback cut before its exception line, a chained exception, launcher-prefixed frames.
Issue 43: a planted bug that let a trailing traceback's frames overwrite the exception's own got through the suite."""

from __future__ import annotations

import pytest

from harness.evidence import failure_events as fe, logread
from harness.base.paths import FIXTURES

OWN = '''Traceback (most recent call last):
  File "/opt/Megatron-LM/pretrain_bert.py", line 187, in <module>
    pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)
  File "/opt/Megatron-LM/megatron/training/training.py", line 285, in pretrain
    initialize_megatron(extra_args_provider=extra_args_provider)
  File "/opt/Megatron-LM/megatron/core/datasets/utils.py", line 29, in compile_helpers
    raise RuntimeError("cannot compile the helpers")
RuntimeError: cannot compile the helpers
'''
# a second rank's traceback cut before its exception line (the process was killed while printing it)
CUT = '''Traceback (most recent call last):
  File "/opt/Megatron-LM/pretrain_bert.py", line 187, in <module>
    pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)
  File "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
'''
OWN_FRAMES = [("/opt/Megatron-LM/pretrain_bert.py", 187, "<module>",
               "pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)"),
              ("/opt/Megatron-LM/megatron/training/training.py", 285, "pretrain",
               "initialize_megatron(extra_args_provider=extra_args_provider)"),
              ("/opt/Megatron-LM/megatron/core/datasets/utils.py", 29, "compile_helpers",
               'raise RuntimeError("cannot compile the helpers")')]


def _fields(ev):
    return [(f.file, f.line, f.function, f.source) for f in ev.frames]


def _assert_own(ev):
    """Every field a user reads of the exception OWN, as the log printed it."""
    assert (ev.kind, ev.type, ev.message) == ("exception", "RuntimeError", "cannot compile the helpers")
    assert _fields(ev) == OWN_FRAMES
    assert ev.raised_in.where() == "megatron/core/datasets/utils.py:29 in compile_helpers"
    assert (ev.raised_in.file, ev.raised_in.line) == ("/opt/Megatron-LM/megatron/core/datasets/utils.py", 29)
    assert ev.module == "megatron/core/datasets/utils.py"
    assert ev.program == "pretrain_bert.py"


@pytest.mark.parametrize("between", ["", "some output\n", "\n\n"])
def test_a_traceback_followed_by_a_cut_one_keeps_its_own_frames(between):
    found = fe.events(OWN + between + CUT)
    assert len(found) == 1
    _assert_own(found[0])
    _assert_own(fe.first_error(OWN + between + CUT))


@pytest.mark.parametrize("prefix", ["[rank0]: ", "[default0]:", "0: ", "(head, rank=0, pid=4242) ",
                                    "2026-11-29T14:17:59.537Z ", "[80746] [rank0]:"])
def test_launcher_prefixed_frames_and_a_cut_traceback_after_them(prefix):
    """Every line of both tracebacks wrapped by a launcher: the root cause is still the exception's own frame."""
    text = "".join(prefix + line + "\n" for line in (OWN + CUT).splitlines())
    ev = fe.first_error("Megatron says hello\n" * 3 + text)
    _assert_own(ev)


def test_launcher_prefixes_of_two_ranks_interleaved_with_the_cut_one():
    text = ("".join("[rank0]: " + line + "\n" for line in OWN.splitlines())
            + "".join("[rank1]: " + line + "\n" for line in CUT.splitlines()))
    ev = fe.first_error(text)
    _assert_own(ev)
    assert ev.rank == 0


@pytest.mark.parametrize("link", ["During handling of the above exception, another exception occurred:",
                                  "The above exception was the direct cause of the following exception:"])
def test_a_chained_exception_each_link_has_its_own_frames(link):
    second = ('Traceback (most recent call last):\n'
              '  File "/opt/Megatron-LM/megatron/training/checkpointing.py", line 1010, in load_checkpoint\n'
              '    state_dict = torch.load(path)\n'
              'OSError: cannot read the checkpoint\n')
    text = OWN + "\n" + link + "\n\n" + second + CUT
    found = fe.events(text)
    assert [e.type for e in found] == ["RuntimeError", "OSError"]
    _assert_own(found[0])
    _assert_own(fe.first_error(text))                  # the first link is the cause
    assert _fields(found[1]) == [("/opt/Megatron-LM/megatron/training/checkpointing.py", 1010, "load_checkpoint",
                                  "state_dict = torch.load(path)")]
    assert found[1].raised_in.where() == "megatron/training/checkpointing.py:1010 in load_checkpoint"
    assert found[1].program is None


def test_a_cut_traceback_alone_is_never_given_an_exception():
    """Nothing proves what a traceback cut before its exception line raised: no exception event."""
    assert [e for e in fe.events(CUT) if e.kind == "exception"] == []


def test_a_post_that_printed_its_exception_before_its_frames_gets_them():
    """The one case where later frames belong to an exception: it had none of its own."""
    text = "RuntimeError: cannot compile the helpers\n" + OWN.split("\n", 1)[1].rsplit("RuntimeError", 1)[0]
    ev = fe.first_error(text)
    assert ev.type == "RuntimeError" and _fields(ev) == OWN_FRAMES


REAL = sorted([*(FIXTURES / "failures" / "real-h200").glob("*.log.gz"), *(FIXTURES / "failures" / "logs").iterdir(),
               *(FIXTURES / "diagnoses").glob("*.log")])
REAL = [p for p in REAL if p.is_file() and p.suffix != ".md" and not p.name.endswith(".toml")]


def _printed_frames_before(lines, at: int) -> list:
    """The frames printed between the last 'Traceback' header before line `at` and `at` (re-read here)."""
    frames = []
    for _, line in lines[:at]:
        if line.strip().startswith("Traceback (most recent call last)"):
            frames = []
        elif m := fe.FRAME.match(line):
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_every_real_exception_names_the_frames_printed_right_before_it(path):
    """Property over the real failure logs, each also with a cut traceback appended: an exception whose own
    traceback was printed before it is raised in that traceback's innermost frame, never a later one."""
    text = "\n".join(logread.read_lines(path))
    for tail in ("", "\n" + CUT):
        lines = fe.unwrap_lines(text + tail)
        for ev in fe.events(text + tail):
            own = _printed_frames_before(lines, ev.line_no)
            if ev.kind != "exception" or ev.innermost_first or not own or len(own) >= fe.MAX_FRAMES:
                continue
            assert [(f.file, f.line, f.function) for f in ev.frames] == own, (path.name, ev.evidence)
