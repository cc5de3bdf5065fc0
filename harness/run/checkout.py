"""What a student's Megatron-LM checkout is and what it needs: detection, and the adapters as data.

    checkout = detect(path, have_te=False, have_apex=False)     # version, scripts, legacy tokenizer, TE import
    adapters = select_adapters(checkout, "train")               # what the suite adds to the course's commands

Everything the suite adds to the course's commands is data (``ADAPTERS``, keyed by version ranges) and comes
back as ``Adaptation(what, why)`` records. harness.run.megatron_lm plans and runs the stages with them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.base.errors import InputError
from harness.run.no_te_launch import TE_GETTER

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


HUB_TOKENIZER_SOURCES = ("megatron/core/tokenizers", "megatron/training/tokenizer/tokenizer.py")
_HUB_NAME = re.compile(r"""["']tokenizer_name["']\s*:\s*["'](?P<name>bert-[\w-]+)["']""")
_HUB_CALL = re.compile(r"\bAutoTokenizer\.from_pretrained\(")
OFFLINE_ENV = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"))


def hub_tokenizer_name(root: Path) -> str | None:
    """The Hugging Face hub name the checkout's default BERT tokenizer is built from, read from its source.

    A release whose tokenizer code maps BertWordPieceLowerCase to a hub name (``"tokenizer_name":
    "bert-large-uncased"``) and builds it with ``AutoTokenizer.from_pretrained`` goes to the hub unless told
    otherwise (0.15.x and later, preprocessing and training alike); None when no such code is found (0.14 and
    older read --vocab-file only). Static: nothing of the checkout is imported or run."""
    name, calls = None, False
    for relative in HUB_TOKENIZER_SOURCES:
        path = Path(root) / relative
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            try:
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            calls = calls or _HUB_CALL.search(text) is not None
            found = None if name else _HUB_NAME.search(text)
            name = name or (found["name"] if found else None)
    return name if name and calls else None


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
    "tokenizer-goes-to-hub": lambda c: hub_tokenizer_name(c.checkout.root) is not None,
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
# 0.15.x has the same flags, the same lazy TE getter and the same tokenizer code as 0.16.x (read from the sources of
# core_v0.15.0 ... core_v0.15.3; acceptance/selftest/cli/test_checkouts_offline.py checks them where a mirror is present)
_V015 = (0, 15, 0)
ADAPTERS: tuple[Adapter, ...] = (
    Adapter("hf-offline", ("preprocess", "train"), (0, 0, 0), None, "always",
            "the grading machine has no network: a Hugging Face hub lookup a release makes on its own (a tokenizer "
            "by name) fails at once and is named [hf-hub-offline], instead of retrying until the stage's timeout",
            env=OFFLINE_ENV),
    Adapter("local-spec", ("train",), _V015, None, "no-te",
            "no Transformer Engine: build the layers from megatron-core's local spec and use its own attention "
            "(--attention-backend local requires --spec local)",
            flags=("--spec", "local", "--attention-backend", "local")),
    Adapter("no-te-launcher", ("train",), _V015, None, "no-te-spec-import",
            "the BERT script imports bert_layer_with_transformer_engine_spec at module level, and without "
            "Transformer Engine building it raises ImportError even with --spec local, which never uses it; "
            "harness/run/no_te_launch.py starts the unchanged script as __main__ after making "
            f"{TE_GETTER} return bert_layer_local_spec, only when bert_layer_specs finds no Transformer Engine "
            "and the command has --spec local",
            requires=SPEC_FILE, launcher=True),
    Adapter("no-fused-kernels", ("train",), _V015, None, "no-te-or-apex",
            "no Transformer Engine/Apex: persistent layer norm, the fused masked softmax and gradient-accumulation "
            "fusion need their CUDA extensions",
            flags=("--no-persist-layer-norm", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion")),
    Adapter("legacy-tokenizer", ("preprocess", "train"), (0, 0, 0), (0, 20, 0), "tokenizer-goes-to-hub",
            "this release's default tokenizer code (megatron/core/tokenizers, 0.15.x and later) builds "
            "BertWordPieceLowerCase through HF AutoTokenizer('bert-large-uncased'), which needs the "
            "Hugging Face hub; --legacy-tokenizer reads --vocab-file directly (pretrain_bert.py's dataset provider "
            "makes the same choice)",
            flags=("--legacy-tokenizer",), requires=LEGACY_TOKENIZER),
    Adapter("hf-local-tokenizer", ("preprocess", "train"), (0, 0, 0), None, "tokenizer-goes-to-hub",
            "no legacy tokenizer in this version: BertWordPieceLowerCase is AutoTokenizer('bert-large-uncased'), "
            "which looks the name up on the hub and hangs offline; a local ./bert-large-uncased/ folder built from "
            "--vocab-file is found first, and offline mode makes any other lookup fail fast",
            env=(("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")), lacks=LEGACY_TOKENIZER,
            hf_tokenizer_dir=True),
    Adapter("hf-no-special-tokens", ("preprocess",), (0, 0, 0), None, "tokenizer-goes-to-hub",
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
