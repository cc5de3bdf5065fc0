"""The property tests' verdict is a function of the commit (issue 43): under the `repeatable` profile each property
test draws from a seed of its own node id (conftest.py's pytest_runtest_setup), and no draw depends on which modules
the worker imported before (Hypothesis's pool of literals from local modules is empty). The control shows the pool
did change the draws: the same seed drew other examples once a module of new literals was imported."""

from __future__ import annotations

import importlib
import sys

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from harness.base.paths import REPO

pytestmark = pytest.mark.skipif(not settings.default.derandomize, reason="only the repeatable profile fixes draws")
DRAWN: list = []


@given(st.integers())
def test_a_property_test_runs_under_its_node_ids_seed(x):
    DRAWN.append(x)


def test_the_seed_is_its_node_ids(request):
    root_conftest = next(p for p in request.config.pluginmanager.get_plugins()
                         if getattr(p, "__file__", None) == str(REPO / "conftest.py"))
    nodeid = request.node.nodeid.replace("test_the_seed_is_its_node_ids", "test_a_property_test_runs_under_its_node_ids_seed")
    assert test_a_property_test_runs_under_its_node_ids_seed._hypothesis_internal_use_seed == \
        root_conftest.hypothesis_seed_of(nodeid)
    assert root_conftest.hypothesis_seed_of("a::b") == root_conftest.hypothesis_seed_of("a::b") != \
        root_conftest.hypothesis_seed_of("a::c")


def _draws(n: int = 200) -> list:
    out = []

    @seed(20261203)
    @settings(max_examples=n, database=None, derandomize=True)
    @given(st.integers(min_value=0, max_value=10 ** 9), st.text(max_size=8))
    def prop(i, s):
        out.append((i, s))

    prop()
    return out


def _import_new_literals(tmp_path, name: str, start: int) -> None:
    literals = ", ".join(str(start + 7919 * k) for k in range(300))
    words = ", ".join(repr(f"w{start}-{k}zz") for k in range(100))
    (tmp_path / f"{name}.py").write_text(f"INTS = ({literals})\nWORDS = ({words})\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_draws_do_not_depend_on_what_was_imported_before(tmp_path, monkeypatch):
    assert len(providers._get_local_constants()) == 0
    before = _draws()
    _import_new_literals(tmp_path, "bert_acceptance_literals_a", 123456789)
    assert _draws() == before
    # the control: with Hypothesis's own pool, the same seed draws other examples after such an import
    monkeypatch.setattr(providers, "_get_local_constants", providers._bert_acceptance_original)
    providers.CONSTANTS_CACHE.cache.clear()
    first = _draws()
    n = len(providers._get_local_constants())
    _import_new_literals(tmp_path, "bert_acceptance_literals_b", 987654321)
    assert len(providers._get_local_constants()) >= n + 300
    providers.CONSTANTS_CACHE.cache.clear()
    assert _draws() != first
    providers.CONSTANTS_CACHE.cache.clear()
