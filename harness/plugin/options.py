"""The suite's pytest settings: each one a command-line flag and an ini key sharing one help text.

``resolve`` turns them into one checked ``Settings`` at start-up: paths are resolved against the directory pytest
was started from, and a bad value is one usage error naming the option and the fix, before any test runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.base.errors import HarnessError
from harness.base.errors import CriteriaError
from harness.judge.profiles import load_profile

# One help text per setting, shared by the command-line flag and the ini key (the pytest-timeout way).
OPTIONS = {
    "run_dir": ("--run-dir", "bert_run_dir", "directory for this session's run (default: a fresh runs/<timestamp>)"),
    "keep_run": ("--keep-run", "bert_keep_run", "keep the run directory even when every test passed"),
    "criteria": ("--criteria", "bert_criteria", "criteria profile: reference (default), course, megatron-lm, or a path to a .toml"),
    "vocab_file": ("--vocab-file", "bert_vocab_file", "WordPiece vocab (default: fixtures/vocab/bert-base-uncased-vocab.txt)"),
    "reuse_run": ("--reuse-run", "bert_reuse_run", "judge an existing run directory instead of training again"),
    "from_log": ("--from-log", "bert_from_log",
                 "judge a submitted Megatron training log (no GPU needed); give a folder to judge every log in it as "
                 "one submission: the logs of a resumed run are stitched by iteration (stdout/stderr pairs and "
                 "compressed or re-encoded logs are read too)"),
    "checkpoint_dir": ("--checkpoint-dir", "bert_checkpoint_dir", "with --from-log: the run's --save directory"),
    "stage_timeout": ("--time-limit", "bert_time_limit", "wall-clock limit per stage in seconds (default 300)"),
    "megatron_lm": ("--megatron-lm", "bert_megatron_lm", "grade a Megatron-LM checkout at PATH instead of the reference trainer"),
    "train_script": ("--train-script", "bert_train_script", "with --megatron-lm: the student's training script"),
    "skip_mutants": ("--skip-mutants", "bert_skip_mutants",
                     "do not train the live mutants (faster; the verdict on the course's criteria is the same)"),
    "no_fork_server": ("--no-fork-server", "bert_no_fork_server",
                       "start every run as a fresh Python process instead of a fork of one pre-imported server "
                       "(slower; for debugging the launcher)"),
    "no_fast_exit": ("--no-fast-exit", "bert_no_fast_exit",
                     "after a training session, let Python tear the process down instead of ending it once pytest "
                     "is done (about 1 s slower with torch loaded; for debugging exit-time code)"),
}
# Old spellings, still read (hidden from --help; one line names the new one): dest -> (old flag, old ini key).
DEPRECATED = {"stage_timeout": ("--stage-timeout", "bert_stage_timeout")}
FLAGS = {"keep_run", "skip_mutants", "no_fork_server", "no_fast_exit"}
# Options whose value is a path (pytest must not take it for a test path).
PATH_OPTIONS = ("run_dir", "criteria", "vocab_file", "reuse_run", "from_log", "checkpoint_dir", "megatron_lm",
                "train_script")
DEFAULT_STAGE_TIMEOUT_S = 300.0
DEFAULT_PROFILE = "reference"


try:  # a pytest stash key when pytest is importable (the harness itself does not need pytest)
    from pytest import StashKey

    SETTINGS_KEY = StashKey()
    EARLY_FORK_KEY = StashKey()  # the fork server a `-m gpu` session starts at pytest start-up
    FAST_EXIT_KEY = StashKey()  # True: a session trained in this process; end it once pytest is done
except ImportError:  # pragma: no cover
    SETTINGS_KEY = "bert_acceptance_settings"
    EARLY_FORK_KEY = "bert_acceptance_early_fork"
    FAST_EXIT_KEY = "bert_acceptance_fast_exit"


def selects_gpu(markexpr: str | None) -> bool:
    """`-m gpu` (or an expression naming gpu without `not`): the session will train on the GPU."""
    tokens = (markexpr or "").replace("(", " ").replace(")", " ").split()
    return "gpu" in tokens and "not" not in tokens


def wants_fork_server(markexpr: str | None, get) -> bool:
    """The session will train here, through a fork server: `-m gpu`, no --no-fork-server, nothing to judge instead
    of training (--from-log, --reuse-run, --megatron-lm), and a GPU this process may see. `get(dest)` reads one
    option's value."""
    return (selects_gpu(markexpr) and not get("no_fork_server")
            and not any(get(dest) for dest in ("from_log", "reuse_run", "megatron_lm")) and gpu_device_visible())


GPU_NODES_ENV = "BERT_ACCEPTANCE_GPU_NODES"
GPU_NODES = "/dev/nvidia[0-9]*:/dev/dxg"     # NVIDIA's device files; /dev/dxg: a GPU under WSL 2


def cuda_hides_every_device() -> bool:
    """CUDA_VISIBLE_DEVICES is set to hide every GPU ("" or "-1"): CUDA, and torch, then see none."""
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")


def gpu_device_visible() -> bool:
    """A look for a GPU that imports nothing and initialises no CUDA: one of its device files exists and
    CUDA_VISIBLE_DEVICES does not hide every device. It only decides whether to start the fork server (and import
    torch) at pytest start-up: without a GPU every GPU test skips, and the 5-10 s of imports would be wasted; a GPU
    it misses only costs that head start (the session starts its server when it trains). BERT_ACCEPTANCE_GPU_NODES
    replaces the device-file patterns (colon-separated globs) and, when set, the CUDA_VISIBLE_DEVICES look too."""
    import glob
    import os

    patterns = os.environ.get(GPU_NODES_ENV)
    if patterns is None and cuda_hides_every_device():
        return False
    return any(glob.glob(p) for p in (patterns if patterns is not None else GPU_NODES).split(":") if p)


class OptionError(HarnessError, ValueError):
    """A bad option value; the message names the option, the value and the fix."""


@dataclass(frozen=True)
class Settings:
    """The effective, checked bert-acceptance settings of one pytest session."""

    run_dir: Path | None
    keep_run: bool
    profile: str
    vocab_file: Path
    reuse_run: Path | None
    from_log: Path | None
    checkpoint_dir: Path | None
    stage_timeout_s: float
    skip_mutants: bool
    megatron_lm: Path | None = None
    train_script: Path | None = None
    fork_server: bool = True
    fast_exit: bool = True


def settings_of(config) -> Settings:
    """The checked Settings of a pytest session (stored at start-up by the suite's root conftest)."""
    return config.stash[SETTINGS_KEY]


def setting(config, dest):
    """Effective value of a setting: command line wins over the ini key; a new spelling over its old one."""
    value = config.getoption(dest)
    if value is None and dest in DEPRECATED:
        value = config.getoption(deprecated_dest(dest), None)
    if value is None:
        value = config.getini(OPTIONS[dest][1])
    if value in (None, "") and dest in DEPRECATED:
        value = config.getini(DEPRECATED[dest][1])
    return value


def deprecated_dest(dest: str) -> str:
    return f"{dest}_deprecated"


def deprecation_notes(config) -> list[str]:
    """One line per old spelling used on the command line or in the ini file, naming the new one."""
    notes = []
    for dest, (flag, ini) in DEPRECATED.items():
        new_flag, new_ini, _ = OPTIONS[dest]
        if config.getoption(deprecated_dest(dest), None) is not None:
            notes.append(f"bert-acceptance: {flag} is deprecated: use {new_flag}")
        if config.getini(ini) not in (None, ""):
            notes.append(f"bert-acceptance: the ini key {ini} is deprecated: use {new_ini}")
    return notes


def used_flag(config, dest: str) -> str:
    """The spelling of `dest` the command line used (an old one when only that was given), for its error."""
    if dest in DEPRECATED and config.getoption(dest) is None \
            and config.getoption(deprecated_dest(dest), None) is not None:
        return DEPRECATED[dest][0]
    return OPTIONS[dest][0]


def _flag(dest: str) -> str:
    return OPTIONS[dest][0]


def _path(value, base: Path) -> Path | None:
    """A path option's value, relative paths taken from where pytest was started."""
    if value in (None, ""):
        return None
    path = Path(str(value)).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def _must_exist(dest: str, path: Path | None, kind: str, fix: str) -> None:
    """Raise OptionError unless path is an existing file ('file') or folder ('dir')."""
    if path is None:
        return
    ok = path.is_file() if kind == "file" else path.is_dir()
    if not ok:
        what = "no such file" if kind == "file" else "no such folder"
        if path.exists():
            what = f"not a {'file' if kind == 'file' else 'folder'}"
        raise OptionError(f"{_flag(dest)} {path}: {what}; {fix}")


def check_repeated(args) -> None:
    """Raise OptionError when an option that takes a value is given twice (`--from-log A --from-log B` would
    silently judge B only)."""
    given: dict = {}
    for i, arg in enumerate(args):
        arg = str(arg)
        if arg == "--":
            break
        for dest, (flag, _, _) in OPTIONS.items():
            if dest in FLAGS:
                continue
            if arg == flag:
                given.setdefault(flag, []).append(str(args[i + 1]) if i + 1 < len(args) else "")
            elif arg.startswith(flag + "="):
                given.setdefault(flag, []).append(arg[len(flag) + 1:])
    for flag, values in given.items():
        if len(values) > 1:
            raise OptionError(f"{flag} given {len(values)} times ({', '.join(map(repr, values))}); only one is "
                              f"used, so give it once (judge several logs with `python -m harness grade DIR`)")


def resolve(get, base: Path, time_limit_flag: str = "--time-limit") -> Settings:
    """Check every option and return the Settings; `get(dest)` reads one raw value (see `setting`);
    `time_limit_flag`: the spelling the command line used, named in its error."""
    from harness.base import paths

    raw_timeout = get("stage_timeout")
    flag = time_limit_flag
    try:
        timeout = float(raw_timeout) if raw_timeout not in (None, "") else DEFAULT_STAGE_TIMEOUT_S
    except (TypeError, ValueError):
        raise OptionError(f"{flag} {raw_timeout!r}: not a number; give seconds, e.g. --time-limit 300")
    if not timeout > 0:
        raise OptionError(f"{flag} {raw_timeout!r}: must be more than 0 seconds, e.g. --time-limit 300")
    p = {dest: _path(get(dest), base) for dest in PATH_OPTIONS if dest != "criteria"}
    if p["from_log"] is None or not p["from_log"].is_dir():
        _must_exist("from_log", p["from_log"], "file",
                    "give the student's training log, or the folder of a resumed run's logs, e.g. --from-log train.log")
    _must_exist("checkpoint_dir", p["checkpoint_dir"], "dir", "give the run's --save folder (holding iter_0000100/ ...)")
    _must_exist("reuse_run", p["reuse_run"], "dir", "give a run directory a previous session kept (--keep-run)")
    if p["reuse_run"] is not None and not (p["reuse_run"] / "session.json").is_file():
        raise OptionError(f"--reuse-run {p['reuse_run']}: no session.json in it; give a run directory that "
                          f"`pytest -m gpu --keep-run` wrote (runs/<timestamp>/)")
    _must_exist("vocab_file", p["vocab_file"], "file",
                f"give the 30522-line BERT uncased vocab, e.g. --vocab-file {paths.VOCAB_FILE}")
    _must_exist("megatron_lm", p["megatron_lm"], "dir", "give the root of a Megatron-LM checkout")
    _must_exist("train_script", p["train_script"], "file", "give the student's training script (a .py file)")
    if p["checkpoint_dir"] is not None and p["from_log"] is None:
        raise OptionError("--checkpoint-dir needs --from-log: it is the --save folder of the submitted log's run")
    if p["train_script"] is not None and p["megatron_lm"] is None:
        raise OptionError("--train-script needs --megatron-lm PATH: the script runs inside that checkout")
    if p["from_log"] is not None and p["reuse_run"] is not None:
        raise OptionError("--from-log and --reuse-run both name the run to judge: give one of them")
    if p["run_dir"] is not None and p["run_dir"].exists() and not p["run_dir"].is_dir():
        raise OptionError(f"--run-dir {p['run_dir']}: exists and is not a folder; give a new or empty folder")
    profile = str(get("criteria") or DEFAULT_PROFILE)
    if profile.endswith(".toml") or "/" in profile:
        profile = str(_path(profile, base))
    try:
        load_profile(profile)
    except CriteriaError as exc:
        raise OptionError(f"--criteria {get('criteria') or DEFAULT_PROFILE}: {exc}")
    return Settings(run_dir=p["run_dir"], keep_run=bool(get("keep_run")), profile=profile,
                    vocab_file=p["vocab_file"] or paths.VOCAB_FILE, reuse_run=p["reuse_run"],
                    from_log=p["from_log"], checkpoint_dir=p["checkpoint_dir"], stage_timeout_s=timeout,
                    skip_mutants=bool(get("skip_mutants")), megatron_lm=p["megatron_lm"],
                    train_script=p["train_script"], fork_server=not get("no_fork_server"),
                    fast_exit=not get("no_fast_exit"))
