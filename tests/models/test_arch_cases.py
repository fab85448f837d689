"""The tables of tests/helpers/arch_cases.py cover every registered arch and family of the plugin."""

from arch_cases import CASES, FAMILIES, NO_DROPOUT, ONE_MORE_LAYER, STATEFUL, family, registered_archs

import define_fairseq  # noqa: F401  (registers the models)


def test_every_registered_arch_has_a_case():
    assert set(CASES) == registered_archs()


def test_every_family_has_a_representative_and_its_flags():
    families = {family(arch) for arch in registered_archs()}
    assert set(FAMILIES) == families
    assert all(family(arch) == name for name, arch in FAMILIES.items())
    assert set(NO_DROPOUT) == families and set(ONE_MORE_LAYER) == families
    assert STATEFUL < families
