"""Half-precision weights for the benchmarks' training steps, as fairseq's ``--fp16`` trains (its ``FP16Optimizer``).

The model's parameters are float16; the optimizer steps float32 master copies. Each step the loss is multiplied by a
fixed scale before backward, the float16 gradients are copied to the masters divided by it, the optimizer steps the
masters and they are copied back. fairseq's dynamic scaling also checks the gradients for overflow every step (a
host synchronisation) and changes the scale; a speed benchmark keeps the scale fixed and leaves the check out.
"""

from typing import List

import torch

LOSS_SCALE = 128.0  # fairseq's --fp16-init-scale


class MasterWeights:
    """float32 masters of ``optimizer``'s (float16) parameters; the optimizer is pointed at them.

    Shapes: each master has its parameter's shape.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scale: float = LOSS_SCALE):
        self.scale = scale
        self.half: List[torch.nn.Parameter] = []
        self.master: List[torch.nn.Parameter] = []
        for group in optimizer.param_groups:
            masters = [torch.nn.Parameter(p.detach().float()) for p in group["params"]]
            self.half += group["params"]
            self.master += masters
            group["params"] = masters

    def unscale_gradients(self) -> None:
        """Each master's gradient: its parameter's, in float32, divided by the loss scale."""
        for half, master in zip(self.half, self.master):
            master.grad = None if half.grad is None else half.grad.float().mul_(1.0 / self.scale)
            half.grad = None

    @torch.no_grad()
    def copy_back(self) -> None:
        torch._foreach_copy_(self.half, self.master)
