"""Helpers shared by the models' ``build_model``: reading a config, parsing cutoff lists, naming flags in errors."""

import ast
from argparse import Namespace
from contextlib import contextmanager
from dataclasses import fields
from typing import Callable, Iterator, List, Optional

from define_fairseq.modules.checks import ParameterError, check_cutoff

MAX_POSITIONS = 1_000_000  # the recurrent, convolutional and relative-position models have no length limit


def _unresolved(value) -> bool:
    """A ``"${...}"`` placeholder that nothing resolved (a namespace built without fairseq-train's parser)."""
    return isinstance(value, str) and value.startswith("${")


def config_namespace(cfg, config_cls, defaults: bool = True, arch: Optional[Callable] = None) -> Namespace:
    """The fields of ``config_cls`` read from ``cfg`` (a DictConfig or Namespace) as a namespace.

    A field that is unset (None, unresolved or absent) is left out, for ``arch`` (the arch function of a model whose
    parser has no defaults, fairseq's Transformers') to fill in; then, with ``defaults``, each field still unset
    takes the dataclass default. Without ``defaults`` a None or unresolved field that has a default other than None
    is kept as it is, for fairseq's arch functions to read.
    """
    values = {}
    for f in fields(config_cls):
        if (defaults and f.name.startswith("_")) or not hasattr(cfg, f.name):
            continue
        value = getattr(cfg, f.name)
        if value is None and (defaults or f.default is None):
            continue
        if _unresolved(value if defaults else str(value)):
            continue
        values[f.name] = value
    args = Namespace(**values)
    if arch is not None:
        arch(args)
    if defaults:
        for f in fields(config_cls):
            if not f.name.startswith("_") and getattr(args, f.name, None) is None:
                setattr(args, f.name, f.default)
    return args


# the fields the plugin adds
PLUGIN_PREFIXES = ("define_", "c2s_", "input_layer", "decoder_input_layer", "torch_compile")


def plugin_defaults(args, config_cls) -> None:
    """A Transformer arch function's defaults for the fields the plugin adds (``define_*``, ``c2s_*``,
    ``input_layer``, ``decoder_input_layer``, ``torch_compile*``): each that ``args`` leaves unset (absent or None)
    takes the dataclass default. (fairseq's Transformer parser has no defaults, so that its arch functions can set
    them; an arch sets what it changes before calling this.)"""
    for f in fields(config_cls):
        if f.name.startswith(PLUGIN_PREFIXES) and getattr(args, f.name, None) is None:
            setattr(args, f.name, f.default)


@contextmanager
def flag_names(**flags: str) -> Iterator[None]:
    """Inside, a module's :class:`ParameterError` for a parameter named in ``flags`` (parameter=flag) is raised
    again naming the flag instead: modules check their arguments once, in their own names, and the model says
    which flag set them."""
    try:
        yield
    except ParameterError as error:
        if error.name not in flags:
            raise
        raise error.renamed(flags) from error


def parse_cutoff(value, flag: str) -> Optional[List[int]]:
    """``"20000,40000"`` (or a list) -> ``[20000, 40000]``; None (unset) -> None; a clear error naming ``flag``
    otherwise. The one parser of the cutoff flags; :func:`define_fairseq.modules.checks.check_cutoff` validates."""
    if value is None:
        return None
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


def resolve_cutoff(value, vocab: int, flag: str) -> Optional[List[int]]:
    """The bands that the cutoff flag ``flag`` gives ``value`` over ``vocab`` words: its boundaries, ending with
    ``vocab``, parsed (:func:`parse_cutoff`) and checked (:func:`~define_fairseq.modules.checks.check_cutoff`);
    None when unset."""
    cutoff = parse_cutoff(value, flag)
    return None if cutoff is None else check_cutoff(cutoff, vocab, flag)


def check_tail_widths(cutoff: List[int], dim: int, factor: float, flag_value) -> None:
    """An adaptive softmax over ``dim`` features with bands ``cutoff`` (ending with V) gives tail cluster ``i``
    ``dim // factor**i`` dimensions; raise a ValueError naming ``--adaptive-softmax-cutoff`` if one has none."""
    for band in range(1, len(cutoff)):
        if int(dim // factor**band) < 1:
            raise ValueError(
                f"--adaptive-softmax-cutoff {flag_value}: tail cluster {band} would have {dim} // "
                f"{factor}**{band} = 0 dimensions; use fewer cutoffs or a smaller "
                f"--adaptive-softmax-factor"
            )


def check_tied_bands(cfg, input_cutoff: Optional[List[int]], softmax_cutoff: Optional[List[int]]) -> None:
    """``--tie-adaptive-weights`` ties each band of the adaptive softmax to the adaptive input's: both must be
    there, with the same cutoffs and the same factor."""
    if input_cutoff is None or not softmax_cutoff:
        raise ValueError(
            "--tie-adaptive-weights needs --adaptive-input (the softmax ties to its bands) and "
            "--adaptive-softmax-cutoff"
        )
    if list(softmax_cutoff) != list(input_cutoff):
        raise ValueError(
            f"--tie-adaptive-weights needs the same bands on both sides, but --adaptive-softmax-cutoff "
            f"{cfg.adaptive_softmax_cutoff} differs from --adaptive-input-cutoff {cfg.adaptive_input_cutoff}"
        )
    if cfg.adaptive_softmax_factor != cfg.adaptive_input_factor:
        raise ValueError(
            f"--tie-adaptive-weights needs --adaptive-softmax-factor ({cfg.adaptive_softmax_factor}) "
            f"equal to --adaptive-input-factor ({cfg.adaptive_input_factor})"
        )
