"""Helpers shared by the models' ``build_model``: reading a config, parsing cutoff lists, checking rates."""

import ast
from argparse import Namespace
from dataclasses import fields
from typing import List

from fairseq.utils import safe_getattr


def config_namespace(cfg, config_cls) -> Namespace:
    """The fields of ``config_cls`` read from ``cfg`` (a DictConfig or Namespace); unset or None -> default."""
    values = {}
    for f in fields(config_cls):
        if f.name.startswith("_"):
            continue
        value = safe_getattr(cfg, f.name, None)
        if value is None or (isinstance(value, str) and value.startswith("${")):
            value = f.default
        values[f.name] = value
    return Namespace(**values)


def parse_cutoff(value, flag: str) -> List[int]:
    """``"20000,40000"`` (or a list) -> ``[20000, 40000]``; a clear error naming ``flag`` otherwise."""
    error = ValueError(f"{flag} {value!r}: give comma separated integers, e.g. 20000,40000,200000")
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise error from None
    if not isinstance(value, (list, tuple)):
        value = [value]
    if not value or not all(isinstance(c, int) and not isinstance(c, bool) for c in value):
        raise error
    return [int(c) for c in value]


def check_rate(value: float, flag: str):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{flag}={value}: a dropout probability must be in [0, 1)")


def check_tail_widths(cutoff: List[int], dim: int, factor: float, flag_value) -> None:
    """An adaptive softmax over ``dim`` features with bands ``cutoff`` (ending with V) gives tail cluster ``i``
    ``dim // factor**i`` dimensions; raise a ValueError naming ``--adaptive-softmax-cutoff`` if one has none."""
    for band in range(1, len(cutoff)):
        if int(dim // factor ** band) < 1:
            raise ValueError(f"--adaptive-softmax-cutoff {flag_value}: tail cluster {band} would have {dim} // "
                             f"{factor}**{band} = 0 dimensions; use fewer cutoffs or a smaller "
                             f"--adaptive-softmax-factor")
