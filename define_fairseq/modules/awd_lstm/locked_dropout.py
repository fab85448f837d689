"""Locked (variational) dropout: one mask per sequence, shared by all its time steps (Gal & Ghahramani, 2016;
AWD-LSTM's ``LockedDropout``)."""

import torch
import torch.nn as nn

from define_fairseq.modules.checks import check_probability


def locked_dropout(x: torch.Tensor, p: float, training: bool = True, batch_first: bool = True) -> torch.Tensor:
    """Zero the same features at every time step of a sequence, scaling the kept ones by ``1 / (1 - p)``.

    Shapes: ``x [B, T, C]`` (``batch_first``) or ``[T, B, C]`` -> same shape; the mask is ``[B, 1, C]``
    (``[1, B, C]``), drawn afresh on each call.
    """
    check_probability(p, "p", "locked dropout")
    if not training or p == 0.0:
        return x
    mask_shape = (x.shape[0], 1, x.shape[2]) if batch_first else (1, x.shape[1], x.shape[2])
    mask = x.new_empty(mask_shape).bernoulli_(1.0 - p).div_(1.0 - p)
    return x * mask


class LockedDropout(nn.Module):
    """Module form of :func:`locked_dropout` (active in training mode only).

    Shapes: ``x [B, T, C]`` (``batch_first``, the default) or ``[T, B, C]`` -> same shape.
    """

    def __init__(self, p: float, batch_first: bool = True):
        super().__init__()
        check_probability(p, "p", "locked dropout")
        self.p = p
        self.batch_first = batch_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return locked_dropout(x, self.p, self.training, self.batch_first)

    def extra_repr(self) -> str:
        return f"p={self.p}, batch_first={self.batch_first}"
