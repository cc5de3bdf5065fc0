"""Start a Megatron-LM BERT script without Transformer Engine: its TE layer-spec getter returns the local spec.

    python harness/run/no_te_launch.py SCRIPT [ARGS...]     (torchrun runs this file in place of SCRIPT)

Megatron-LM's BERT scripts (root pretrain_bert.py up to 0.16.x, examples/bert/pretrain_bert.py later) import
`bert_layer_with_transformer_engine_spec` at module level. bert_layer_specs builds that name lazily through
get_bert_layer_with_transformer_engine_spec(), which raises ImportError without Transformer Engine, even with
`--spec local`, where the script never uses it. Only when ARGS hold `--spec local` AND bert_layer_specs itself
finds no Transformer Engine (its HAVE_TE is false), this launcher makes that getter return bert_layer_local_spec
as the module finishes loading, and prints PATCHED once. Otherwise nothing changes. The script then runs as
__main__ (runpy) with sys.argv and sys.path[0] as `python SCRIPT ARGS` sets them; no file is edited.
Standard library only: it runs in the checkout's Python, which need not have the suite installed.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

SPEC_MODULE = "megatron.core.models.bert.bert_layer_specs"
TE_GETTER = "get_bert_layer_with_transformer_engine_spec"
LOCAL_SPEC = "bert_layer_local_spec"
PATCHED = (f"[bert-acceptance] no Transformer Engine and --spec local: {SPEC_MODULE}.{TE_GETTER} returns "
           f"{LOCAL_SPEC} (the script's module-level import of the TE spec no longer raises)")
USAGE = "usage: python no_te_launch.py SCRIPT [ARGS...]"


def wants_local_spec(args: list[str]) -> bool:
    """`--spec local` (or `--spec=local`) among the script's arguments."""
    return "--spec=local" in args or any(a == "--spec" and b == "local" for a, b in zip(args, args[1:]))


def use_local_spec(module) -> bool:
    """Point the module's TE getter at its local spec when it found no TE; True when it did so."""
    local = getattr(module, LOCAL_SPEC, None)
    if getattr(module, "HAVE_TE", True) or local is None or not callable(getattr(module, TE_GETTER, None)):
        return False

    def get_bert_layer_with_transformer_engine_spec():
        """No Transformer Engine here: the local spec (the script asked for it with --spec local)."""
        return local

    setattr(module, TE_GETTER, get_bert_layer_with_transformer_engine_spec)
    print(PATCHED, flush=True)
    return True


class _PatchingLoader(importlib.abc.Loader):
    """Loads the module with its own loader, then applies use_local_spec."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        use_local_spec(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self.inner, name)


class _SpecModuleFinder(importlib.abc.MetaPathFinder):
    """Finds bert_layer_specs with the other finders and wraps its loader; once, then steps aside."""

    def find_spec(self, name, path, target=None):
        if name != SPEC_MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_te_site")
ENV_FLAG = "BERT_ACCEPTANCE_NO_TE_SPEC"


def install_finder() -> None:
    """Patch bert_layer_specs as it loads (once per interpreter)."""
    if not any(isinstance(f, _SpecModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SpecModuleFinder())


def main(argv: list[str] | None = None) -> None:
    """Run SCRIPT as __main__ with ARGS, the TE getter patched only when --spec local is asked for."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not os.path.isfile(argv[0]):
        raise SystemExit(f"{USAGE}\nno such script: {argv[0] if argv else '(none given)'}")
    script, args = os.path.abspath(argv[0]), list(argv[1:])
    if wants_local_spec(args):
        install_finder()
        # processes the script starts with multiprocessing's spawn (torch_dist's checkpoint writer) re-import
        # it in a fresh interpreter: no_te_site/sitecustomize.py installs the same patch there
        os.environ[ENV_FLAG] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE_DIR, os.environ.get("PYTHONPATH")]))
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)  # not this file's folder, whose modules would shadow the script's
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
