"""Checkpoints written by an earlier revision load and score as they did there.

``tests/data/checkpoints/`` holds one tiny checkpoint of each family (the representative arch of
``arch_cases.FAMILIES`` on its case's flags, dropout off, two updates of fairseq-train) written at revision 2819101,
the validation data they score and ``expected.json``: the loss of the first validation batch as that revision
computed it with :func:`validation_loss` (``make.py`` in that folder writes all of it; run it from a checkout of the
revision to write them anew). A change to a family's configuration, state-dict keys or computation that breaks
such a checkpoint fails here.
"""

import importlib.util
import json
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
_spec = importlib.util.spec_from_file_location("checkpoints_make", FIXTURE / "make.py")
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_a_checkpoint_of_an_earlier_revision_loads_and_scores_as_it_did(family):
    expected = EXPECTED[family]
    loss, sample_size = make.validation_loss(FIXTURE, family, expected["task"])
    assert sample_size == expected["sample_size"]
    # float32 sums over a few hundred tokens; the DeFINE unit's operations were reordered since (float rounding)
    assert loss == pytest.approx(expected["loss"], rel=1e-5), family
