"""Started processes of a launched BERT script get the same no-TE patch (see ../no_te_launch.py).

Megatron's torch_dist checkpoint writer and data workers start with multiprocessing's `spawn`, which runs the
script again in a fresh interpreter, without the launcher. The launcher puts this folder first on PYTHONPATH and
sets BERT_ACCEPTANCE_NO_TE_SPEC=1, so every such interpreter installs the patch at start-up. Then the
sitecustomize this file shadows (if any) runs as before.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("BERT_ACCEPTANCE_NO_TE_SPEC") == "1":
    sys.path.insert(0, os.path.dirname(_HERE))
    try:
        import no_te_launch

        no_te_launch.install_finder()
    finally:
        sys.path.remove(os.path.dirname(_HERE))
        sys.modules.pop("no_te_launch", None)

for _entry in sys.path:
    if os.path.abspath(_entry or os.curdir) == _HERE:
        continue
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        break
