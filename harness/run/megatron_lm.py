"""Grade a student's own Megatron-LM checkout: what it is, what it needs, and the stages that run it.

    checkout = detect(path, have_te=False, have_apex=False)     # version, scripts, legacy tokenizer, TE import
    plan = plan_preprocess(checkout, corpus, prefix, vocab, workdir)
    done = run_preprocess(plan, run_dir)                        # runs twice when issue #1052 bites
    reason = cannot_run_reason(checkout)                        # say it BEFORE launching
    spec = train_stage(checkout, done.data_prefix, vocab, save_dir)

Everything the suite adds to the course's commands is data (``ADAPTERS``, keyed by version ranges) and comes
back as ``Adaptation(what, why)`` records, so the report shows exactly what ran. The student's files are never
edited: offline NLTK, the local Hugging Face tokenizer and the no-TE launcher (harness/run/no_te_launch.py, which
starts the unchanged BERT script when Transformer Engine is absent) live outside the checkout.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.judge.diagnose import RULES, Diagnosis, diagnose, missing_files
from harness.errors import InputError
from harness.run.launch import DATASET_MARKER, StageResult, StageSpec, free_port, run_stage
from harness.run.no_te_launch import TE_GETTER, wants_local_spec
from harness.train.args import COURSE_FLAGS

VERSION_FILE = "megatron/core/package_info.py"
PREPROCESS_TOOL = "tools/preprocess_data.py"
LEGACY_TOKENIZER = "megatron/training/tokenizer/bert_tokenization.py"
TRAIN_SCRIPTS = ("pretrain_bert.py", "examples/bert/pretrain_bert.py")  # root up to 0.16.x, examples/ at HEAD
TE_SPEC = "bert_layer_with_transformer_engine_spec"
SPEC_FILE = "megatron/core/models/bert/bert_layer_specs.py"  # builds TE_SPEC lazily through TE_GETTER (0.16+)
NO_TE_LAUNCHER = Path(__file__).resolve().with_name("no_te_launch.py")
NLTK_OFFLINE = Path(__file__).resolve().parents[1] / "data" / "nltk_offline"
HF_TOKENIZER_NAME = "bert-large-uncased"  # what main's BertWordPieceLowerCase hands to AutoTokenizer
FLAG_SOURCES = ("megatron/training/arguments.py", "megatron/training/config", "megatron/core/transformer/"
                "transformer_config.py", "megatron/core/model_parallel_config.py", PREPROCESS_TOOL)
BERT_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                       "mask_token": "[MASK]"}

PREPROCESS_TIMEOUT_S = 300.0
PREPROCESS_STALL_S = 120.0
TRAIN_TIMEOUT_S = 600.0
TRAIN_STALL_S = 60.0      # Megatron's sample-index build on 1-sentence documents spins silently for hours

NOT_A_CHECKOUT = "{path} is not a Megatron-LM checkout: {problem}"
NOT_A_CHECKOUT_FIX = ("pass the root of a Megatron-LM clone (git clone https://github.com/NVIDIA/Megatron-LM; "
                      "git checkout core_v0.16.1), the folder that holds megatron/ and tools/")
CANNOT_RUN_TE = ("{script} imports {spec} at import time, and Transformer Engine is not importable here: it "
                 "fails with ImportError before reading any flag, even with --spec local; the suite's no-TE "
                 "launcher cannot help, because this checkout's " + SPEC_FILE + " does not build that spec "
                 "lazily through " + TE_GETTER + " (Megatron-LM 0.16 and later do)")
CANNOT_RUN_TE_FIX = ("install Transformer Engine matching this torch/CUDA, or use a Megatron-LM version whose BERT "
                     "script imports only bert_layer_local_spec and honours --spec local, or grade with the suite's "
                     "reference trainer (pytest -m gpu without --megatron-lm)")
NO_OUTPUT = ("stage '{name}' exited 0 {runs} time(s) but these outputs are missing: {missing}")
RERUN_WHY = ("Megatron-LM issue #1052: with --split-sentences and the default --partitions 1 the tool writes "
             "{ss} and exits 0 without .bin/.idx; the identical second run encodes it")


class CheckoutError(InputError):
    """The path is not a Megatron-LM checkout, or the suite cannot adapt the course's commands to it."""


# ---------------------------------------------------------------- detection


@dataclass(frozen=True, order=True)
class Version:
    """MAJOR.MINOR.PATCH[PRE_RELEASE] from megatron/core/package_info.py."""

    major: int
    minor: int
    patch: int
    pre: str = ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}{self.pre}"

    @property
    def key(self) -> tuple[int, int, int]:
        """(major, minor, patch): what the adapter ranges compare."""
        return (self.major, self.minor, self.patch)


@dataclass(frozen=True)
class Checkout:
    """What the suite needs to know about a Megatron-LM checkout (detected from files, never imported)."""

    root: Path
    version: Version
    is_git: bool
    git_commit: str | None
    train_script: Path | None
    preprocess_tool: Path | None
    has_legacy_tokenizer: bool
    imports_te_spec: bool          # the BERT script imports the TE layer spec at module level
    have_te: bool = False          # Transformer Engine importable in the target Python (the caller probes)
    have_apex: bool = False
    requires_python: str | None = None  # pyproject.toml's requires-python, e.g. ">=3.12" at HEAD

    def describe(self) -> str:
        """One line for headers and reports."""
        commit = f" @ {self.git_commit[:12]}" if self.git_commit else "" if self.is_git else " (not a git checkout)"
        return f"Megatron-LM {self.version}{commit} at {self.root}"


def detect(path: str | os.PathLike, *, have_te: bool = False, have_apex: bool = False) -> Checkout:
    """Read a checkout's version and layout; CheckoutError (path and fix) when it is not one."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise CheckoutError(NOT_A_CHECKOUT.format(path=root, problem="no such directory"), path=root,
                            fix=NOT_A_CHECKOUT_FIX)
    script = find_train_script(root)
    return Checkout(root=root, version=read_version(root), is_git=(root / ".git").exists(),
                    git_commit=git_commit(root), train_script=script,
                    preprocess_tool=_file_or_none(root / PREPROCESS_TOOL),
                    has_legacy_tokenizer=(root / LEGACY_TOKENIZER).is_file(),
                    imports_te_spec=bool(script and imports_te_spec_at_import_time(script)),
                    have_te=have_te, have_apex=have_apex, requires_python=read_requires_python(root))


def read_requires_python(root: Path) -> str | None:
    """`requires-python` of the checkout's pyproject.toml, or None (a regex: tomllib is 3.11+)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"""^requires-python\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    return found[1] if found else None


def python_too_old(checkout: Checkout, python_version: Sequence[int] = tuple(sys.version_info[:2])) -> str | None:
    """Why the target Python is below the checkout's `>=X.Y` requirement (HEAD needs 3.12), else None."""
    found = re.search(r">=\s*(\d+)\.(\d+)", checkout.requires_python or "")
    if not found or tuple(python_version[:2]) >= (int(found[1]), int(found[2])):
        return None
    have = ".".join(map(str, python_version[:2]))
    return (f"Megatron-LM {checkout.version} requires Python {checkout.requires_python}, the target Python is "
            f"{have}. Fix: run the suite with a Python {found[1]}.{found[2]}+ (megatron-core >= 0.17 needs 3.12), or grade "
            "an older checkout (core_v0.16.1 supports 3.10+)")


def read_version(root: Path) -> Version:
    """MAJOR/MINOR/PATCH/PRE_RELEASE assignments of package_info.py, read as literals (the file is not run)."""
    info = root / VERSION_FILE
    if not info.is_file():
        raise CheckoutError(NOT_A_CHECKOUT.format(path=root, problem=f"{VERSION_FILE} is missing"), path=root,
                            fix=NOT_A_CHECKOUT_FIX)
    values = _literal_assignments(info, ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"))
    try:
        return Version(int(values["MAJOR"]), int(values["MINOR"]), int(values["PATCH"]),
                       str(values.get("PRE_RELEASE") or ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckoutError(f"{info}: cannot read MAJOR/MINOR/PATCH ({exc!r})", path=info,
                            fix=NOT_A_CHECKOUT_FIX) from None


def _literal_assignments(path: Path, names: Sequence[str]) -> dict:
    """Top-level `NAME = <literal>` assignments of a Python file."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except SyntaxError as exc:
        raise CheckoutError(f"{path}: not valid Python ({exc.msg}, line {exc.lineno})", path=path,
                            fix=NOT_A_CHECKOUT_FIX) from None
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in names and isinstance(node.value, ast.Constant):
                found[name] = node.value.value
    return found


def git_commit(root: Path) -> str | None:
    """HEAD's commit read from .git files (no git needed); None when not a git checkout or unreadable."""
    git = root / ".git"
    if git.is_file():  # a worktree or submodule: "gitdir: PATH"
        target = git.read_text(errors="replace").partition("gitdir:")[2].strip()
        git = (root / target).resolve() if target else git
    head = git / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text(errors="replace").strip()
    if not ref.startswith("ref:"):
        return ref or None
    return _resolve_ref(git, ref[4:].strip())


def _resolve_ref(git: Path, ref: str) -> str | None:
    """A ref's commit from its loose file or packed-refs."""
    loose = git / ref
    if loose.is_file():
        return loose.read_text(errors="replace").strip() or None
    packed = git / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(errors="replace").splitlines():
            commit, _, name = line.partition(" ")
            if name.strip() == ref:
                return commit
    return None


def find_train_script(root: Path) -> Path | None:
    """The BERT pretraining script: root pretrain_bert.py (up to 0.16.x) or examples/bert/pretrain_bert.py."""
    for relative in TRAIN_SCRIPTS:
        if (root / relative).is_file():
            return root / relative
    return None


def _file_or_none(path: Path) -> Path | None:
    """The path when it is a file."""
    return path if path.is_file() else None


def imports_te_spec_at_import_time(script: Path) -> bool:
    """The script imports the TE layer spec at module level, outside a try that catches ImportError."""
    text = Path(script).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text, str(script))
    except SyntaxError:  # newer syntax than this Python parses: fall back to the text
        return re.search(rf"^from\s+\S+\s+import\s+[^\n]*\b{TE_SPEC}\b", text, re.MULTILINE) is not None
    return any(_names_te_spec(node) for node in _module_level(tree.body))


def _module_level(body: list) -> Iterable[ast.stmt]:
    """Statements that run at import time: the body, and if-branches, but not guarded try blocks or defs."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try) and not _catches_import_error(node):
            yield from _module_level(node.body)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try)):
            yield node


def _catches_import_error(node: ast.Try) -> bool:
    """Some handler catches ImportError (or a base of it)."""
    names = set()
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names.update(t.id for t in types if isinstance(t, ast.Name))
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _names_te_spec(node: ast.stmt) -> bool:
    """An import of the TE spec, or any attribute access to it, in this statement."""
    if isinstance(node, ast.ImportFrom):
        return any(alias.name == TE_SPEC for alias in node.names)
    return any(isinstance(n, ast.Attribute) and n.attr == TE_SPEC for n in ast.walk(node))


def probe_modules(modules: Sequence[str], python: str = sys.executable, timeout_s: float = 60.0) -> dict[str, bool]:
    """Which modules the target Python can import (a subprocess: the suite's own Python may differ)."""
    code = ("import importlib, json, sys\nfound = {}\nfor m in sys.argv[1:]:\n    try:\n"
            "        importlib.import_module(m); found[m] = True\n    except Exception:\n        found[m] = False\n"
            "print(json.dumps(found))")
    try:
        done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=timeout_s)
        return {m: bool(v) for m, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {m: False for m in modules}


# ---------------------------------------------------------------- adapters (data)


@dataclass(frozen=True)
class Adaptation:
    """One thing the suite added to or changed around the course's commands, and why."""

    what: str
    why: str
    stage: str = ""     # "preprocess" | "train": where it applied


@dataclass(frozen=True)
class Context:
    """What an adapter's condition may look at."""

    checkout: Checkout
    split_sentences: bool = True
    nltk_stand_in: bool = True
    imports_te_spec: bool | None = None    # the script that will run (--train-script); None: the checkout's


def _script_imports_te_spec(ctx: Context) -> bool:
    """The script that will run imports the TE spec at import time."""
    return ctx.checkout.imports_te_spec if ctx.imports_te_spec is None else ctx.imports_te_spec


def te_getter_is_lazy(root: Path) -> bool:
    """bert_layer_specs defines HAVE_TE and builds the TE spec through TE_GETTER (what the launcher patches)."""
    try:
        text = (root / SPEC_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(rf"^def {TE_GETTER}\(", text, re.MULTILINE) is not None and "HAVE_TE" in text


CONDITIONS: dict[str, Callable[[Context], bool]] = {
    "always": lambda c: True,
    "no-te": lambda c: not c.checkout.have_te,
    "no-te-or-apex": lambda c: not (c.checkout.have_te and c.checkout.have_apex),
    "split-sentences-offline": lambda c: c.split_sentences and c.nltk_stand_in,
    "no-te-spec-import": lambda c: (not c.checkout.have_te and _script_imports_te_spec(c)
                                    and te_getter_is_lazy(c.checkout.root)),
}


@dataclass(frozen=True)
class Adapter:
    """A version-dependent change: for [since, until) and a condition, the flags/env/folder a stage needs."""

    id: str
    stages: tuple[str, ...]                  # "preprocess", "train"
    since: tuple[int, int, int]              # inclusive
    until: tuple[int, int, int] | None       # exclusive; None: no known end
    when: str                                # a key of CONDITIONS
    why: str
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    requires: str | None = None              # the checkout must have this file ...
    lacks: str | None = None                 # ... or must not have this one
    hf_tokenizer_dir: bool = False           # build ./bert-large-uncased/ in the stage's working directory
    pythonpath: tuple[str, ...] = ()         # prepended for this stage only
    launcher: bool = False                   # torchrun starts NO_TE_LAUNCHER, which runs the script (train only)

    def applies(self, stage: str, ctx: Context) -> bool:
        """This adapter is needed for `stage` of this checkout."""
        root, version = ctx.checkout.root, ctx.checkout.version.key
        return (stage in self.stages and self.since <= version and (self.until is None or version < self.until)
                and (self.requires is None or (root / self.requires).exists())
                and (self.lacks is None or not (root / self.lacks).exists()) and CONDITIONS[self.when](ctx))


_V016 = (0, 16, 0)
ADAPTERS: tuple[Adapter, ...] = (
    Adapter("local-spec", ("train",), _V016, None, "no-te",
            "no Transformer Engine: build the layers from megatron-core's local spec and use its own attention "
            "(--attention-backend local requires --spec local)",
            flags=("--spec", "local", "--attention-backend", "local")),
    Adapter("no-te-launcher", ("train",), _V016, None, "no-te-spec-import",
            "the BERT script imports bert_layer_with_transformer_engine_spec at module level, and without "
            "Transformer Engine building it raises ImportError even with --spec local, which never uses it; "
            "harness/run/no_te_launch.py starts the unchanged script as __main__ after making "
            f"{TE_GETTER} return bert_layer_local_spec, only when bert_layer_specs finds no Transformer Engine "
            "and the command has --spec local",
            requires=SPEC_FILE, launcher=True),
    Adapter("no-fused-kernels", ("train",), _V016, None, "no-te-or-apex",
            "no Transformer Engine/Apex: persistent layer norm, the fused masked softmax and gradient-accumulation "
            "fusion need their CUDA extensions",
            flags=("--no-persist-layer-norm", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion")),
    Adapter("legacy-tokenizer", ("preprocess", "train"), _V016, (0, 20, 0), "always",
            "0.16.x builds BertWordPieceLowerCase through HF AutoTokenizer('bert-large-uncased'), which needs the "
            "Hugging Face hub; --legacy-tokenizer reads --vocab-file directly (pretrain_bert.py's dataset provider "
            "makes the same choice)",
            flags=("--legacy-tokenizer",), requires=LEGACY_TOKENIZER),
    Adapter("hf-local-tokenizer", ("preprocess", "train"), _V016, None, "always",
            "no legacy tokenizer in this version: BertWordPieceLowerCase is AutoTokenizer('bert-large-uncased'), "
            "which looks the name up on the hub and hangs offline; a local ./bert-large-uncased/ folder built from "
            "--vocab-file is found first, and offline mode makes any other lookup fail fast",
            env=(("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")), lacks=LEGACY_TOKENIZER,
            hf_tokenizer_dir=True),
    Adapter("hf-no-special-tokens", ("preprocess",), _V016, None, "always",
            "the HF tokenizer otherwise stores [CLS]/[SEP] inside every sentence; the BERT dataset adds them itself",
            flags=("--tokenizer-hf-no-include-special-tokens",), lacks=LEGACY_TOKENIZER),
    Adapter("nltk-stand-in", ("preprocess",), (0, 0, 0), None, "split-sentences-offline",
            "--split-sentences needs nltk and its punkt data (absent, or offline: the worker pool "
            "restarts forever); harness/data/nltk_offline is a regex splitter with punkt's interface, on PYTHONPATH for "
            "this stage only",
            pythonpath=(str(NLTK_OFFLINE),)),
)


def select_adapters(checkout: Checkout, stage: str, ctx: Context | None = None) -> tuple[Adapter, ...]:
    """The table's entries this stage of this checkout needs, in table order."""
    ctx = ctx or Context(checkout)
    return tuple(a for a in ADAPTERS if a.applies(stage, ctx))


def flag_defined(root: Path, flag: str) -> bool:
    """The checkout defines `flag`: quoted in an argument file, or as a config dataclass field (HEAD's style)."""
    quoted = re.compile(rf"""['"]{re.escape(flag)}['"]""")
    field_name = re.compile(rf"^\s+{re.escape(flag.lstrip('-').replace('-', '_'))}\s*:", re.MULTILINE)
    for text in _flag_source_texts(root):
        if quoted.search(text) or field_name.search(text):
            return True
    return False


def _flag_source_texts(root: Path) -> Iterable[str]:
    """Texts of the files that define command-line flags."""
    for relative in FLAG_SOURCES:
        path = root / relative
        files = sorted(path.glob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            yield file.read_text(encoding="utf-8", errors="replace")


def _check_flags(checkout: Checkout, adapters: Sequence[Adapter]) -> None:
    """Every flag an adapter adds exists in this checkout, or CheckoutError naming adapter, flag and fix."""
    for adapter in adapters:
        for flag in (f for f in adapter.flags if f.startswith("--")):
            if not flag_defined(checkout.root, flag):
                raise CheckoutError(
                    f"adapter {adapter.id!r} adds {flag}, which Megatron-LM {checkout.version} does not define",
                    path=checkout.root, fix="correct the version range of this adapter in harness/run/megatron_lm.py "
                                            "ADAPTERS (verify with grep -rn -- '" + flag + "' megatron/training)")


def _adaptation(adapter: Adapter, workdir: Path) -> Adaptation:
    """The record of one applied adapter, naming exactly what was added."""
    parts = []
    if adapter.flags:
        parts.append(" ".join(adapter.flags))
    parts += [f"{k}={v}" for k, v in adapter.env]
    parts += [f"PYTHONPATH+={p}" for p in adapter.pythonpath]
    if adapter.hf_tokenizer_dir:
        parts.append(f"local tokenizer folder {workdir / HF_TOKENIZER_NAME} (cwd {workdir})")
    if adapter.launcher:
        parts.append(f"torchrun starts {NO_TE_LAUNCHER} SCRIPT ARGS (the script runs unchanged as __main__)")
    return Adaptation(f"[{adapter.id}] " + "; ".join(parts), adapter.why)


# ---------------------------------------------------------------- local Hugging Face tokenizer folder


def build_hf_tokenizer_dir(vocab_file: str | os.PathLike, dest: str | os.PathLike,
                           lowercase: bool = True) -> Path:
    """A BERT tokenizer folder AutoTokenizer loads offline, built from a WordPiece vocab without network."""
    from tokenizers import BertWordPieceTokenizer

    vocab_file, dest = Path(vocab_file), Path(dest)
    if not vocab_file.is_file():
        raise CheckoutError(f"vocab file not found: {vocab_file}", path=vocab_file,
                            fix="pass --vocab-file fixtures/vocab/bert-base-uncased-vocab.txt")
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = BertWordPieceTokenizer(str(vocab_file), lowercase=lowercase, strip_accents=None if lowercase else False)
    tokenizer.save(str(dest / "tokenizer.json"))
    shutil.copyfile(vocab_file, dest / "vocab.txt")
    _write_json(dest / "special_tokens_map.json", BERT_SPECIAL_TOKENS)
    _write_json(dest / "tokenizer_config.json", {
        "tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "model_max_length": 512,
        "tokenize_chinese_chars": True, "strip_accents": None, "clean_up_tokenization_spaces": True,
        **BERT_SPECIAL_TOKENS})
    _write_json(dest / "config.json", {"model_type": "bert", "vocab_size": tokenizer.get_vocab_size()})
    return dest


def _write_json(path: Path, data: dict) -> None:
    """Pretty JSON, newline-terminated."""
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """Stages to run for one pipeline step, what they must leave behind, and every adaptation made."""

    stages: tuple[StageSpec, ...]
    adaptations: tuple[Adaptation, ...]
    expected: tuple[Path, ...] = ()
    workdir: Path | None = None


def _stage_env(checkout: Checkout, adapters: Sequence[Adapter], extra_pythonpath: Sequence[str] = (),
               base: dict | None = None) -> dict[str, str]:
    """PYTHONPATH = adapters' folders, extra, the checkout (so `megatron` is the checkout's), then the caller's."""
    path = [p for a in adapters for p in a.pythonpath] + [str(p) for p in extra_pythonpath] + [str(checkout.root)]
    env = {"PYTHONPATH": os.pathsep.join(path + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                 else [])), "PYTHONUNBUFFERED": "1"}
    env.update(base or {})
    for adapter in adapters:
        env.update(dict(adapter.env))
    return env


def _pythonpath_adaptation(checkout: Checkout) -> Adaptation:
    """Why the checkout goes first on PYTHONPATH."""
    return Adaptation(f"PYTHONPATH={checkout.root} (first, before site-packages)",
                      "`import megatron` must resolve to the checkout: megatron is a namespace package, and an "
                      "installed megatron-core wheel would otherwise supply megatron.core next to the checkout's "
                      "megatron.training (the tool itself only appends the checkout to sys.path)")


def _prepare_workdir(workdir: Path, adapters: Sequence[Adapter], vocab_file: Path) -> None:
    """Create the stage's working directory and, when an adapter wants it, the local tokenizer folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    if any(a.hf_tokenizer_dir for a in adapters) and not (workdir / HF_TOKENIZER_NAME / "tokenizer.json").is_file():
        build_hf_tokenizer_dir(vocab_file, workdir / HF_TOKENIZER_NAME)


def expected_outputs(output_prefix: str | os.PathLike, json_keys: Sequence[str] = ("text",),
                     split_sentences: bool = True) -> tuple[Path, ...]:
    """`{prefix}_{key}_{sentence|document}.bin/.idx`, as tools/preprocess_data.py names them."""
    level = "sentence" if split_sentences else "document"
    return tuple(Path(f"{output_prefix}_{key}_{level}{ext}") for key in json_keys for ext in (".bin", ".idx"))


def preprocess_argv(checkout: Checkout, corpus_json: Path, output_prefix: Path, vocab_file: Path,
                    python: str = sys.executable, workers: int = 1) -> list[str]:
    """The course's preprocessing command against the checkout's tool (absolute paths: cwd is the workdir)."""
    return [python, str(checkout.root / PREPROCESS_TOOL), "--input", str(corpus_json), "--output-prefix",
            str(output_prefix), "--vocab-file", str(vocab_file), "--tokenizer-type", "BertWordPieceLowerCase",
            "--split-sentences", "--workers", str(workers), "--json-keys", "text"]


def plan_preprocess(checkout: Checkout, corpus_json: str | os.PathLike, output_prefix: str | os.PathLike,
                    vocab_file: str | os.PathLike, workdir: str | os.PathLike, *, python: str = sys.executable,
                    timeout_s: float = PREPROCESS_TIMEOUT_S, stall_s: float = PREPROCESS_STALL_S,
                    nltk_stand_in: bool = True, extra_pythonpath: Sequence[str] = (), workers: int = 1) -> Plan:
    """The checkout's preprocess tool with the course's flags plus adapters; a second identical run (#1052)."""
    if checkout.preprocess_tool is None:
        raise CheckoutError(f"{checkout.root / PREPROCESS_TOOL} is missing", path=checkout.root,
                            fix=NOT_A_CHECKOUT_FIX)
    corpus_json, output_prefix, vocab_file, workdir = (Path(p).resolve() for p in
                                                        (corpus_json, output_prefix, vocab_file, workdir))
    adapters = select_adapters(checkout, "preprocess", Context(checkout, nltk_stand_in=nltk_stand_in))
    _check_flags(checkout, adapters)
    _prepare_workdir(workdir, adapters, vocab_file)
    argv = preprocess_argv(checkout, corpus_json, output_prefix, vocab_file, python, workers) + [
        f for a in adapters for f in a.flags]
    env = _stage_env(checkout, adapters, extra_pythonpath)
    stages = tuple(StageSpec(name, argv, timeout_s, env=env, cwd=str(workdir), stall_timeout_s=stall_s)
                   for name in ("preprocess", "preprocess-rerun"))
    adaptations = (_pythonpath_adaptation(checkout),) + tuple(_adaptation(a, workdir) for a in adapters)
    return Plan(stages, _at("preprocess", adaptations), expected_outputs(output_prefix), workdir)


def _at(stage: str, adaptations: Iterable[Adaptation]) -> tuple[Adaptation, ...]:
    """The adaptations, labelled with the stage they applied to."""
    return tuple(replace(a, stage=stage) for a in adaptations)


def preprocess_stages(checkout: Checkout, corpus_json, output_prefix, vocab_file, workdir, **kw) -> list[StageSpec]:
    """The two preprocess stages (the second runs only when the first left no .bin/.idx): see run_preprocess."""
    return list(plan_preprocess(checkout, corpus_json, output_prefix, vocab_file, workdir, **kw).stages)


@dataclass(frozen=True)
class PreprocessResult:
    """How preprocessing ended: each stage run, the outputs still missing, and the diagnosis when it failed."""

    results: tuple[StageResult, ...]
    expected: tuple[Path, ...]
    missing: tuple[str, ...]
    adaptations: tuple[Adaptation, ...]
    diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> bool:
        """Every stage that ran exited 0 and every expected output exists."""
        return bool(self.results) and self.results[-1].ok and not self.missing

    @property
    def data_prefix(self) -> Path | None:
        """What --data-path takes: the .bin/.idx path without extension."""
        return self.expected[0].with_suffix("") if self.ok else None

    def failure_message(self) -> str:
        """Headline, command, artifacts, last log lines, cause and remedy."""
        last = self.results[-1]
        if not last.ok:
            return last.failure_message()
        lines = [NO_OUTPUT.format(name=last.name, runs=len(self.results), missing=", ".join(self.missing)),
                 last.failure_message().split("\n", 1)[1]]
        if self.diagnosis is not None:
            lines += [f"likely cause [{self.diagnosis.cause_id}]: {self.diagnosis.cause}",
                      f"remedy: {self.diagnosis.remedy}"]
        return "\n".join(lines)


def run_preprocess(plan: Plan, run_dir: str | os.PathLike, on_line=None) -> PreprocessResult:
    """Run the first stage; when it exits 0 without outputs run the identical second; diagnose what is left."""
    results: list[StageResult] = []
    adaptations = list(plan.adaptations)
    for index, spec in enumerate(plan.stages):
        if index:
            ss = _split_file_of(spec.argv)
            adaptations.append(Adaptation(f"ran the identical preprocess command again ({spec.name})",
                                          RERUN_WHY.format(ss=ss), "preprocess"))
        results.append(run_stage(spec, run_dir, on_line=on_line))
        if not results[-1].ok or not missing_files(plan.expected):
            break
    missing = tuple(missing_files(plan.expected))
    diagnosis = _preprocess_diagnosis(results, missing) if results[-1].ok and missing else None
    return PreprocessResult(tuple(results), plan.expected, missing, tuple(adaptations), diagnosis)


def _split_file_of(argv: Sequence[str]) -> str:
    """INPUT_ss.EXT, the sentence-split file tools/preprocess_data.py writes next to --input."""
    stem, ext = os.path.splitext(argv[list(argv).index("--input") + 1])
    return f"{stem}_ss{ext}"


def _preprocess_diagnosis(results: Sequence[StageResult], missing: Sequence[str]) -> Diagnosis | None:
    """The diagnose table's verdict on an exit 0 without outputs; after two runs, #1052 is ruled out."""
    rules = RULES if len(results) < 2 else tuple(r for r in RULES if r.id != "preprocess-split-sentences")
    last = results[-1]
    text = last.log_path.read_text(errors="replace") if last.log_path.is_file() else ""
    return diagnose(last.name, last.returncode, text, missing_outputs=missing, duration_s=last.duration_s,
                    argv=last.argv, rules=rules)


def cannot_run_reason(checkout: Checkout, have_te: bool | None = None,
                      train_script: str | os.PathLike | None = None,
                      python_version: Sequence[int] = tuple(sys.version_info[:2])) -> str | None:
    """Why the BERT script cannot start here (said before launching), with the fix; None when it can."""
    too_old = python_too_old(checkout, python_version)
    if too_old:
        return too_old
    script = Path(train_script) if train_script else checkout.train_script
    have_te = checkout.have_te if have_te is None else have_te
    if script is None or not script.is_file():
        where = script or " or ".join(str(checkout.root / s) for s in TRAIN_SCRIPTS)
        return f"no BERT training script at {where}. Fix: pass --train-script FILE, or a checkout that has one"
    ctx = train_context(replace(checkout, have_te=have_te), train_script)
    if _script_imports_te_spec(ctx) and not have_te and not any(a.launcher for a in select_adapters(
            ctx.checkout, "train", ctx)):
        return CANNOT_RUN_TE.format(script=script, spec=TE_SPEC) + ". Fix: " + CANNOT_RUN_TE_FIX
    return None


def train_context(checkout: Checkout, train_script: str | os.PathLike | None = None) -> Context:
    """What the training adapters' conditions look at: the checkout, and the script that will run."""
    script = Path(train_script) if train_script else None
    return Context(checkout, imports_te_spec=imports_te_spec_at_import_time(script) if script and script.is_file()
                   else None)


def plan_train(checkout: Checkout, data_prefix: str | os.PathLike, vocab_file: str | os.PathLike,
               save_dir: str | os.PathLike, train_script: str | os.PathLike | None = None, nproc: int = 1,
               extra: Sequence[str] = (), *, workdir: str | os.PathLike | None = None, python: str = sys.executable,
               timeout_s: float = TRAIN_TIMEOUT_S, stall_s: float = TRAIN_STALL_S, master_port: int | None = None,
               extra_pythonpath: Sequence[str] = (), name: str = "train-checkout") -> Plan:
    """torchrun [no_te_launch.py] SCRIPT, the course flags, --data-path/--vocab-file/--save and the adapters."""
    script = Path(train_script).resolve() if train_script else checkout.train_script
    if script is None:
        raise CheckoutError(cannot_run_reason(checkout, True) or "no training script", path=checkout.root,
                            fix="pass --train-script FILE")
    save_dir, vocab_file = Path(save_dir).resolve(), Path(vocab_file).resolve()
    workdir = Path(workdir).resolve() if workdir else save_dir.parent
    adapters = select_adapters(checkout, "train", train_context(checkout, train_script))
    _check_flags(checkout, adapters)
    _prepare_workdir(workdir, adapters, vocab_file)
    cache = workdir / "index-cache"
    args = [*COURSE_FLAGS, "--data-path", str(Path(data_prefix)), "--vocab-file", str(vocab_file), "--save",
            str(save_dir), "--data-cache-path", str(cache), *(f for a in adapters for f in a.flags), *extra]
    if not wants_local_spec(args):  # the launcher changes nothing without --spec local: do not record it
        adapters = tuple(a for a in adapters if not a.launcher)
    launcher = [str(NO_TE_LAUNCHER)] if any(a.launcher for a in adapters) else []
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
            str(master_port or free_port()), *launcher, str(script), *args]
    env = _stage_env(checkout, adapters, extra_pythonpath, {"NCCL_NVLS_ENABLE": "0",
                                                             "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    spec = StageSpec(name, argv, timeout_s, env=env, cwd=str(workdir), stall_timeout_s=stall_s,
                     stall_after_marker=DATASET_MARKER)
    adaptations = (_pythonpath_adaptation(checkout),
                   Adaptation(f"--save {save_dir}", "the course's command has no --save; the checkpoint criteria "
                                                    "need iter_0000100/ and iter_0000200/"),
                   Adaptation(f"--data-cache-path {cache}", "a fresh index cache: Megatron reuses a stale sample "
                                                           "index whose cache key ignores the data's contents"),
                   Adaptation("NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=1",
                              "NVLink multicast off on shared machines; one CUDA connection as Megatron expects"),
                   *(_adaptation(a, workdir) for a in adapters))
    if train_script:
        adaptations += (Adaptation(f"training script {script}", "--train-script: the student's own script"),)
    return Plan((spec,), _at("train", adaptations), (save_dir / "latest_checkpointed_iteration.txt",), workdir)


def train_stage(checkout: Checkout, data_prefix, vocab_file, save_dir, train_script=None, nproc: int = 1,
                extra: Sequence[str] = (), **kw) -> StageSpec:
    """The training stage of plan_train (its adaptations: plan_train(...).adaptations)."""
    return plan_train(checkout, data_prefix, vocab_file, save_dir, train_script, nproc, extra, **kw).stages[0]


# ---------------------------------------------------------------- compatibility matrix

OUTCOMES = ("pass", "fail", "cannot-run", "not-run")
ROW_KEYS = ("version", "commit", "checkout", "stage", "outcome", "detail", "adaptations")


def version_matrix_row(checkout: Checkout, stage: str, outcome: str, detail: str = "",
                       adaptations: Iterable[Adaptation] = ()) -> dict:
    """One cell of the version x stage table, JSON-able."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    return {"version": str(checkout.version), "commit": checkout.git_commit, "checkout": str(checkout.root),
            "stage": stage, "outcome": outcome, "detail": detail, "adaptations": [a.what for a in adaptations]}


def row_from_result(checkout: Checkout, result: StageResult | PreprocessResult | None, stage: str,
                    adaptations: Iterable[Adaptation] = (), reason: str | None = None) -> dict:
    """A matrix row from how a stage ended (None with a reason: not launched)."""
    if result is None:
        return version_matrix_row(checkout, stage, "cannot-run" if reason else "not-run", reason or "", adaptations)
    if result.ok:
        return version_matrix_row(checkout, stage, "pass", "", adaptations)
    diagnosis = getattr(result, "diagnosis", None) or _diagnosis_of(result)
    detail = f"[{diagnosis.cause_id}] {diagnosis.cause}" if diagnosis else result.failure_message().splitlines()[0]
    return version_matrix_row(checkout, stage, "fail", detail, adaptations)


def _diagnosis_of(result) -> Diagnosis | None:
    """The diagnose table's verdict for a failed StageResult (None for other kinds of result)."""
    last = result.results[-1] if isinstance(result, PreprocessResult) else result
    text = last.log_path.read_text(errors="replace") if last.log_path.is_file() else ""
    return diagnose(last.name, last.returncode, text, timed_out=last.timed_out, stalled=last.stalled,
                    duration_s=last.duration_s, argv=last.argv)


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Rows from RESULTS.json (a list of rows, or {"rows": [...]}); errors name the file and the row."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read results ({exc})", path=path, fix="pass a JSON file of matrix rows") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise InputError("expected a list of rows or {\"rows\": [...]}", path=path, fix="see version_matrix_row")
    for index, row in enumerate(rows):
        missing = [k for k in ("version", "stage", "outcome") if not isinstance(row, dict) or k not in row]
        if missing:
            raise InputError(f"row {index} lacks {', '.join(missing)}", path=path, fix="see version_matrix_row")
    return rows


def matrix_markdown(rows: Sequence[dict]) -> str:
    """Version x stage table (outcome per cell), then each version's failures and adaptations."""
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    versions = list(dict.fromkeys(_version_label(r) for r in rows))
    cell = {(_version_label(r), r["stage"]): r for r in rows}
    out = ["| Megatron-LM | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for version in versions:
        out.append(f"| {version} | " + " | ".join(cell[(version, s)]["outcome"] if (version, s) in cell else ""
                                                  for s in stages) + " |")
    for version in versions:
        notes = [r for r in rows if _version_label(r) == version and (r.get("detail") or r.get("adaptations"))]
        if notes:
            out += ["", f"### {version}"]
        for r in notes:
            out += [f"- {r['stage']}: {r['outcome']}" + (f": {r['detail']}" if r.get("detail") else "")]
            out += [f"  - {what}" for what in r.get("adaptations") or ()]
    return "\n".join(out) + "\n"


def _version_label(row: dict) -> str:
    """`0.16.1` or `0.20.0 @ abcdef123456`."""
    return row["version"] + (f" @ {row['commit'][:12]}" if row.get("commit") else "")


def write_matrix(rows: Sequence[dict], json_path: str | os.PathLike | None = None,
                 md_path: str | os.PathLike | None = None) -> str:
    """Write the rows as JSON and the table as markdown (each optional); return the markdown."""
    text = matrix_markdown(rows)
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": list(rows)}, indent=2) + "\n", encoding="utf-8")
    if md_path:
        Path(md_path).write_text(text, encoding="utf-8")
    return text


def run_summary(checkout: "Checkout", log_path, memory=None) -> dict:
    """What the report's header and run line show for a checkout's run (the reference trainer writes this itself in
    summary.json): GPU, versions, iterations and the median of Megatron's own ms/iteration (first interval out)."""
    from statistics import median

    import torch

    from harness.judge.logs import parse_log_file

    try:
        log = parse_log_file(log_path)
    except OSError:
        log = None
    intervals = [r.elapsed_ms for r in (log.iterations[1:] if log else []) if r.elapsed_ms is not None]
    return {"gpu": getattr(memory, "gpu_name", None),
            "device": "cuda" if memory is not None and getattr(memory, "saw_process", False) else None,
            "iterations": log.iterations[-1].iteration if log and log.iterations else 0,
            "ms_per_iter_median": round(median(intervals), 2) if intervals else None,
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "megatron_lm": str(checkout.version), "python": sys.version.split()[0]}}


# ---------------------------------------------------------------- speed against the reference trainer

REFERENCE_VARIANT = "bench-cuda-graph"   # python -m harness.bench: the reference trainer as `pytest -m gpu` runs it


def speed_ratio(report: dict, bench: dict, variant: str = REFERENCE_VARIANT) -> dict:
    """The checkout's run (report.json) against the reference trainer (harness.bench JSON): wall and ms/iter ratios."""
    from statistics import median

    from harness.judge.logs import parse_log_file

    run, reference = report["runs"][0], bench["runs"][variant]
    intervals = [r.elapsed_ms for r in parse_log_file(run["log"]).iterations[1:]]  # the first holds the warm-up
    megatron = {"checkout": (report.get("checkout") or {}).get("version"), "iterations": 200,
                "wall_s": run["seconds"], "ms_per_iter_median": round(median(intervals), 2) if intervals else None}
    ours = {"variant": variant, "iterations": 200, "wall_s": reference["wall_s"],
            "ms_per_iter_median": round(reference["ms_per_iter_median"], 2)}
    ratio = lambda a, b: round(a / b, 2) if a and b else None  # noqa: E731
    return {"megatron_lm": megatron, "reference_trainer": ours,
            "wall_ratio": ratio(megatron["wall_s"], ours["wall_s"]),
            "ms_per_iter_ratio": ratio(megatron["ms_per_iter_median"], ours["ms_per_iter_median"])}


# ---------------------------------------------------------------- command line


def describe(checkout: Checkout) -> dict:
    """Detection, each stage's adapters and the pre-check, JSON-able (the `detect` command)."""
    plan = {stage: [asdict(_adaptation(a, Path("WORKDIR"))) for a in select_adapters(checkout, stage)]
            for stage in ("preprocess", "train")}
    info = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(checkout).items()}
    info["version"] = str(checkout.version)
    return {"checkout": info, "adapters": plan, "cannot_run": cannot_run_reason(checkout)}


def _cmd_detect(args) -> int:
    """Print what the suite sees in a checkout and what it would add."""
    probes = probe_modules(("transformer_engine", "apex"), args.python)
    checkout = detect(args.path, have_te=probes["transformer_engine"], have_apex=probes["apex"])
    print(json.dumps(describe(checkout), indent=2))
    return 0


def _cmd_table(args) -> int:
    """Render RESULTS.json as the compatibility table."""
    text = write_matrix(load_rows(args.results), args.json, args.markdown)
    sys.stdout.write(text)
    return 0


def _cmd_speed(args) -> int:
    """Print (and write) Megatron-LM's time per 200 iterations next to the reference trainer's."""
    try:
        report, bench = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (args.report, args.bench))
        result = speed_ratio(report, bench)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise InputError(f"cannot compare speed ({exc!r})", path=args.report,
                         fix="pass a checkout run's report.json and python -m harness.bench's JSON") from None
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: `detect PATH`, `table RESULTS.json [--markdown OUT.md] [--json OUT.json]` or `speed REPORT BENCH`."""
    parser = argparse.ArgumentParser(prog="python -m harness.run.megatron_lm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    det = sub.add_parser("detect", help="what the suite sees in a Megatron-LM checkout and what it would add")
    det.add_argument("path")
    det.add_argument("--python", default=sys.executable, help="the Python that will run the checkout")
    det.set_defaults(func=_cmd_detect)
    table = sub.add_parser("table", help="version x stage x outcome table from matrix rows")
    table.add_argument("results", help="JSON: a list of rows (version_matrix_row) or {\"rows\": [...]}")
    table.add_argument("--markdown", help="also write the table here")
    table.add_argument("--json", help="also write the normalised rows here")
    table.set_defaults(func=_cmd_table)
    speed = sub.add_parser("speed", help="Megatron-LM's wall time per 200 iterations against the reference trainer")
    speed.add_argument("report", help="report.json of a --megatron-lm run")
    speed.add_argument("bench", help="JSON of python -m harness.bench (the reference trainer alone)")
    speed.add_argument("--out", help="also write the result here")
    speed.set_defaults(func=_cmd_speed)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
