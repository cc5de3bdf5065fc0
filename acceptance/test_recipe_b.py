"""Recipe (b), the second way through the chapter: the course's literal one-line documents with
--bert-no-binary-head. It trains in the same session as recipe (a) and is judged with (b)'s own golden values
and bands (fixtures/criteria/*.toml [recipes.b], fixtures/golden/*recipe_b.json)."""

import pytest

from harness.judge import criteria
from harness.run.runs import REFERENCE_B
from harness.judge.profiles import PASS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def recipe_b(judgements) -> criteria.Judgement:
    if REFERENCE_B.name not in judgements:
        pytest.fail(f"the session has no {REFERENCE_B.name} run (a run directory from an older suite?): "
                    "train again with `pytest -m gpu`", pytrace=False)
    return judgements[REFERENCE_B.name]


def test_recipe_b_is_recognised_from_its_log(recipe_b):
    assert recipe_b.recipe == "b", recipe_b.recipe_how


def test_recipe_b_passes_every_criterion(recipe_b):
    failed = [v for v in recipe_b.verdicts if v.status != PASS]
    assert not failed, "\n\n".join(v.message for v in failed)
