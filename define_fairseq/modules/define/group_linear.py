"""Group linear transform (GLT): ``groups`` independent linear maps over contiguous slices."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# devices where the custom function measured faster than the plain formulation (benchmarks/results/group_linear.md)
FUSED_DEVICES = ("cpu",)


class GroupLinear(nn.Module):
    """Split the last dimension into ``groups`` contiguous chunks and map each with its own matrix.

    Group ``j`` maps input features ``[j*i, (j+1)*i)`` to output features ``[j*o, (j+1)*o)`` where
    ``i = in_features / groups`` and ``o = out_features / groups``; the groups are computed together
    with one batched matrix multiply. With ``groups=1`` this is ``nn.Linear`` (same numbers, same init).

    Two formulations compute the same numbers, and the layer takes the one that measured faster on the input's
    device: on a CPU, a custom autograd function whose ``bmm`` writes each group straight into its strided block of
    the output (no transposing copy, forward or backward); on a GPU (and any other device), the plain batched
    multiply ``[g, N, i] @ [g, i, o]`` followed by a transposing copy, which measured faster than the function at
    the grouped shapes on an H100 and an H200 (``benchmarks/results/gpu-*.md``). ``torch.compile`` traces the plain
    one. Either way the parameters, and so the state dict, are the same.

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
                raise ValueError(f"GroupLinear: {name}={value} is not a positive multiple of groups={groups}")
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
        if x.device.type in FUSED_DEVICES:
            return _group_linear_fused(x, self.weight, self.bias)
        return _group_linear_reference(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"groups={self.groups}, bias={self.bias is not None}"
        )


def _autocast_dtype(x: torch.Tensor):
    """The dtype autocast runs matrix products in on ``x``'s device, or ``None`` when autocast is off there."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def _group_linear_fused(x, weight, bias):
    """The custom-function formulation with autocast's casts, or the plain one where the function cannot run."""
    cast = _autocast_dtype(x)
    if cast is not None:
        # autocast runs bmm and baddbmm in its dtype: the same casts here keep the result autocast's (and float32
        # parameters get float32 gradients through the casts' backward)
        x, weight = x.to(cast), weight.to(cast)
        bias = None if bias is None else bias.to(cast)
    if x.dtype != weight.dtype or torch.compiler.is_compiling():
        # torch.compile cannot trace the Function's out= writes (a graph break), and fuses the copies they save
        return _group_linear_reference(x, weight, bias)
    if cast is None:
        return _GroupLinearFunction.apply(x, weight, bias)
    with torch.autocast(x.device.type, enabled=False):
        return _GroupLinearFunction.apply(x, weight, bias)


def _group_linear_reference(x, weight, bias):
    """Plain autograd formulation: ``[N, g, i] -> [g, N, i] @ [g, i, o] -> [g, N, o] -> [N, g, o]``."""
    g, i, o = weight.shape
    xt = x.reshape(x.numel() // (g * i), g, i).transpose(0, 1)
    y = torch.bmm(xt, weight) if bias is None else torch.baddbmm(bias.view(g, 1, o), xt, weight)
    return y.transpose(0, 1).reshape(*x.shape[:-1], g * o)


class _GroupLinearFunction(torch.autograd.Function):
    """The batched multiply of every group, written straight into the ``[N, g * o]`` output.

    The plain formulation computes ``[g, N, o]`` and then copies it to ``[N, g, o]`` (and likewise for the input
    gradient in backward). Here ``bmm``'s ``out=`` receives the ``[g, N, o]`` *view* of the ``[N, g * o]`` result:
    each group's matrix is a strided block the GEMM writes in place, so no transposing copy is made (about 20%
    faster forward + backward at 8192 tokens on a CPU). Double backward goes through the plain formulation.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        g, i, o = weight.shape
        n = x.numel() // (g * i)
        xt = x.reshape(n, g, i).transpose(0, 1)  # [g, N, i]
        if bias is None:
            y = x.new_empty(n, g * o)
            torch.bmm(xt, weight, out=y.view(n, g, o).transpose(0, 1))
        else:
            # a copy even for one row, where contiguous() would return the bias itself for baddbmm_ to write into
            y = bias.expand(n, g * o).clone(memory_format=torch.contiguous_format)
            y.view(n, g, o).transpose(0, 1).baddbmm_(xt, weight)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], g * o)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g, i, o = weight.shape
        n = x.numel() // (g * i)
        grad2 = grad.reshape(n, g * o)
        grad_t = grad2.view(n, g, o).transpose(0, 1)  # [g, N, o]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            if torch.is_grad_enabled():  # create_graph: stay differentiable
                grad_x = torch.bmm(grad_t, weight.transpose(1, 2)).transpose(0, 1).reshape(x.shape)
            else:
                grad_x = grad2.new_empty(n, g * i)
                torch.bmm(grad_t, weight.transpose(1, 2), out=grad_x.view(n, g, i).transpose(0, 1))
                grad_x = grad_x.view(x.shape)
        if ctx.needs_input_grad[1]:
            grad_w = torch.bmm(x.reshape(n, g, i).permute(1, 2, 0), grad_t)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad2.sum(0)
        return grad_x, grad_w, grad_b
