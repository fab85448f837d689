"""The variance-scaling initialisation of the Mogrifier paper's official code (DeepMind's lamb,
``utils.variance_scaling_initializer`` with a truncated normal in fan-in mode, scale 1)."""

import math

import torch
import torch.nn as nn

# lamb's correction for cutting the normal at two standard deviations (whose std is then 0.8796 of the normal's):
# it draws with std sqrt(1.3 / fan_in), so that the variance comes out at 1.0058 / fan_in.
LAMB_TRUNCATION_FACTOR = 1.3


def variance_scaling_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Fill ``tensor`` in place from a normal with mean 0 and std ``sqrt(1.3 / fan_in)`` truncated at two of
    those standard deviations (TensorFlow's ``truncated_normal``), and return it.

    Shapes: ``tensor`` any shape; lamb's fan_in of a ``[in, out]`` matrix is ``in``, of a 1-D ``[n]`` bias ``n``.
    """
    std = math.sqrt(LAMB_TRUNCATION_FACTOR / fan_in)
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)
