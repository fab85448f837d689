"""fairseq's adaptive softmax as the language models that use it (``lstm_lm_define``, ``gcnn_lm``) configure it:
``--adaptive-softmax-cutoff``, ``--adaptive-softmax-factor`` and ``--adaptive-softmax-dropout`` resolved and checked
into an :class:`AdaptiveSoftmaxSpec` (:func:`resolve_adaptive_softmax`) before anything is built, then built from
the spec alone (:func:`build_adaptive_softmax`)."""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch.nn as nn
from fairseq.modules import AdaptiveSoftmax

from define_fairseq.models.config_helpers import check_tail_widths, check_tied_bands, resolve_cutoff
from define_fairseq.models.input_layer import InputLayerSpec
from define_fairseq.modules.checks import check_probability

CUTOFF_FLAG = "--adaptive-softmax-cutoff"


@dataclass(frozen=True)
class AdaptiveSoftmaxSpec:
    """An adaptive softmax over the bands ``cutoff`` (their boundaries, ending with the vocabulary size V) reading
    ``width`` features: tail cluster ``i`` is ``width // factor**i`` wide, with ``dropout`` inside it. ``tied``: its
    bands are the adaptive input's (the same cutoffs and factor), and with ``tie_proj`` their projections too."""

    cutoff: Tuple[int, ...]
    width: int
    factor: float
    dropout: float
    tied: bool = False
    tie_proj: bool = False


def resolve_adaptive_softmax(
    cfg, vocab: int, width: int, tied_to: Optional[InputLayerSpec] = None
) -> Optional[AdaptiveSoftmaxSpec]:
    """The adaptive softmax that ``cfg``'s ``adaptive_softmax_*`` fields describe over ``vocab`` words and ``width``
    features, checked (a ``ValueError`` naming the flag); None without ``--adaptive-softmax-cutoff``.

    ``tied_to``: the input layer whose adaptive input the softmax ties to (``--tie-adaptive-weights``; its tail
    projections too under ``--tie-adaptive-proj``); the softmax then reads that layer's width n instead.
    """
    # fairseq's AdaptiveSoftmax does not check its dropout; checked even when unused, as a flag given in vain
    dropout = check_probability(cfg.adaptive_softmax_dropout, "--adaptive-softmax-dropout")
    cutoff = resolve_cutoff(cfg.adaptive_softmax_cutoff or None, vocab, CUTOFF_FLAG)
    if cutoff is None:
        return None
    if tied_to is not None:
        check_tied_bands(cfg, tied_to.adaptive_cutoff, cutoff)
        width = tied_to.n
    else:
        check_tail_widths(cutoff, width, cfg.adaptive_softmax_factor, cfg.adaptive_softmax_cutoff)
    tied = tied_to is not None
    return AdaptiveSoftmaxSpec(
        tuple(cutoff), width, cfg.adaptive_softmax_factor, dropout, tied, tie_proj=tied and bool(cfg.tie_adaptive_proj)
    )


def build_adaptive_softmax(spec: AdaptiveSoftmaxSpec, adaptive_inputs: Optional[nn.Module] = None) -> AdaptiveSoftmax:
    """fairseq's ``AdaptiveSoftmax`` that ``spec`` describes; ``adaptive_inputs``: the adaptive input (or the DeFINE
    embedding over one) whose bands a tied softmax shares.

    Shapes: the features ``[B, T, spec.width]`` it scores, as fairseq's ``AdaptiveSoftmax``.
    """
    if spec.tied and adaptive_inputs is None:
        raise ValueError("a tied adaptive softmax needs the adaptive input it shares its bands with")
    return AdaptiveSoftmax(
        spec.cutoff[-1],  # the bands end with the vocabulary size
        spec.width,
        list(spec.cutoff),
        spec.dropout,
        factor=spec.factor,
        adaptive_inputs=adaptive_inputs if spec.tied else None,
        tie_proj=spec.tie_proj,
    )
