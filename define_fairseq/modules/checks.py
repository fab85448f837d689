"""Checks of a value, raising a :class:`ParameterError` that names it.

A module checks its arguments in its own parameter names. A model's resolver checks each flag's value under the
flag's name before it builds anything (``check_probability(cfg.dropout, "--dropout")``), so that a bad flag stops
the build before any module exists; where a module is the only one that checks an argument (the DeFINE unit's),
the model maps the module's name to the flag with :func:`define_fairseq.models.config_helpers.flag_names`.
"""

import math
from typing import Dict, List, Optional, Sequence


class ParameterError(ValueError):
    """A bad value for the parameter ``name``; ``requirement`` says what a good one is.

    The message is ``"{name}{sep}{value}: {requirement}"`` followed by ``(note)`` when a note is given; with
    ``predicate`` (a requirement that reads as a predicate of the value, ``must be at least 1``) the requirement
    follows the value without the colon. ``requirement`` may name other parameters as ``{other}``, given in
    ``related`` (name -> value): each shows as ``other=value``, so that :meth:`renamed` can name their flags too.
    """

    def __init__(
        self,
        name: str,
        value,
        requirement: str,
        note: Optional[str] = None,
        sep: str = "=",
        related: Optional[Dict[str, object]] = None,
        labels: Optional[Dict[str, str]] = None,
        predicate: bool = False,
    ):
        self.name, self.value, self.requirement, self.note, self.sep = name, value, requirement, note, sep
        self.related, self.predicate = dict(related or {}), predicate
        labels = labels or {}
        shown = (
            requirement.format_map(
                {other: f"{labels.get(other, other)}={value}" for other, value in self.related.items()}
            )
            if related
            else requirement
        )
        joint = " " if predicate else ": "
        super().__init__(f"{labels.get(name, name)}{sep}{value}{joint}{shown}" + (f" ({note})" if note else ""))

    def renamed(self, labels: Dict[str, str]) -> "ParameterError":
        """The same error with the parameters of ``labels`` (name -> label, e.g. a command-line flag) shown
        under their labels."""
        return ParameterError(
            self.name, self.value, self.requirement, self.note, self.sep, self.related, labels, self.predicate
        )


def check_positive(value: int, name: str, note: Optional[str] = None) -> int:
    """``value`` as an int if it is at least 1 (a size or a count); a :class:`ParameterError` naming ``name``
    otherwise."""
    if int(value) < 1:
        raise ParameterError(name, value, "must be at least 1", note, predicate=True)
    return int(value)


def check_nonnegative(value: float, name: str, note: Optional[str] = None) -> float:
    """``value`` if it is a finite number of at least 0 (a coefficient, or a count that may be 0); a
    :class:`ParameterError` naming ``name`` otherwise."""
    if not (value >= 0 and math.isfinite(value)):
        raise ParameterError(name, value, "must be >= 0", note, predicate=True)
    return value


def check_probability(value: float, name: str, note: Optional[str] = None) -> float:
    """``value`` as a float if it is a dropout probability in ``[0, 1)``; a :class:`ParameterError` naming
    ``name`` otherwise."""
    if not 0.0 <= float(value) < 1.0:
        raise ParameterError(name, value, "a dropout probability must be in [0, 1)", note)
    return float(value)


def check_choice(value: str, choices: Sequence[str], name: str) -> str:
    """``value`` if it is one of ``choices``; a :class:`ParameterError` naming ``name`` and the choices otherwise."""
    if value not in choices:
        raise ParameterError(name, repr(value), f"unknown; choose one of {', '.join(choices)}")
    return value


def check_cutoff(cutoff: Sequence[int], vocab_size: int, name: str = "cutoff", note: Optional[str] = None) -> List[int]:
    """The band boundaries ``cutoff`` of an adaptive input or softmax as a list ending with ``vocab_size``
    (which ``cutoff`` may already end with).

    Raises a :class:`ParameterError` naming ``name`` unless the cutoffs are positive, increase strictly and stay
    below the vocabulary.
    """
    cutoff = [int(c) for c in cutoff]
    if cutoff and cutoff[-1] == vocab_size:
        cutoff = cutoff[:-1]
    shown = ",".join(map(str, cutoff))
    if any(c <= 0 for c in cutoff) or any(b <= a for a, b in zip(cutoff, cutoff[1:])):
        raise ParameterError(
            name,
            shown,
            f"the cutoffs must be positive and increasing, within the vocabulary of {vocab_size} words",
            note,
            sep=" ",
        )
    if cutoff and cutoff[-1] >= vocab_size:
        raise ParameterError(
            name,
            shown,
            f"the last cutoff must be below the vocabulary size {vocab_size} (cutoff "
            f"{cutoff[-1]} is beyond the vocabulary of {vocab_size} words); lower the "
            f"cutoffs or drop the ones at or beyond it",
            note,
            sep=" ",
        )
    return cutoff + [vocab_size]
