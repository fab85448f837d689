"""A tensor computed from parameters and reused until one of them changes."""

from typing import Callable, Iterable, Optional

import torch


class ParameterCache:
    """Holds ``compute()``'s result for a set of tensors and computes it again when any of them has changed.

    A change is an in-place write (the tensor's version counter: optimizer steps, edits under ``no_grad`` in any
    mode, ``load_state_dict``) or a replacement (``.to()``, ``.half()``, a new ``Parameter``). The owner clears it
    where holding the value costs memory for nothing (e.g. when it switches to training).

    Shapes: whatever ``compute`` returns.
    """

    def __init__(self):
        self.key: Optional[tuple] = None
        self.value = None

    def get(self, tensors: Iterable[torch.Tensor], compute: Callable[[], torch.Tensor]):
        key = tuple((id(t), t._version, t.data_ptr(), t.dtype, t.device) for t in tensors)
        if key != self.key:
            value = compute()
            self.key, self.value = key, value
        return self.value

    def clear(self) -> None:
        self.key = self.value = None
