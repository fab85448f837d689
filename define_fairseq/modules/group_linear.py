"""Group linear transform (GLT): ``groups`` independent linear maps over contiguous slices."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupLinear(nn.Module):
    """Split the last dimension into ``groups`` contiguous chunks and map each with its own matrix.

    Group ``j`` maps input features ``[j*i, (j+1)*i)`` to output features ``[j*o, (j+1)*o)`` where
    ``i = in_features / groups`` and ``o = out_features / groups``; the groups are computed together
    with one batched matrix multiply. With ``groups=1`` this is ``nn.Linear`` (same numbers, same init).

    Args:
        in_features: size of the last input dimension, divisible by ``groups``.
        out_features: size of the last output dimension, divisible by ``groups``.
        groups: number of groups.
        bias: add a learned bias of shape ``[out_features]``.

    Shapes:
        input ``[..., in_features]`` -> output ``[..., out_features]``.
        ``weight`` is ``[groups, in_features / groups, out_features / groups]``.
    """

    def __init__(self, in_features: int, out_features: int, groups: int, bias: bool = True):
        super().__init__()
        if groups < 1:
            raise ValueError(f"GroupLinear: groups must be >= 1, got {groups}")
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if value < 1 or value % groups != 0:
                raise ValueError(
                    f"GroupLinear: {name}={value} is not a positive multiple of groups={groups}"
                )
        self.in_features = in_features
        self.out_features = out_features
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(groups, in_features // groups, out_features // groups))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # nn.Linear's default init with the per-group fan-in.
        bound = 1.0 / math.sqrt(self.in_features // self.groups)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.groups == 1:
            return F.linear(x, self.weight[0].t(), self.bias)
        lead = x.shape[:-1]
        g = self.groups
        # [N, g, i] -> [g, N, i] @ [g, i, o] -> [g, N, o] -> [N, g, o]
        x = x.reshape(-1, g, self.in_features // g).transpose(0, 1)
        if self.bias is None:
            y = torch.bmm(x, self.weight)
        else:
            y = torch.baddbmm(self.bias.view(g, 1, -1), x, self.weight)
        return y.transpose(0, 1).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"groups={self.groups}, bias={self.bias is not None}"
        )
