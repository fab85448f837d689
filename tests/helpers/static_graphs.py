"""A stand-in for ``torch.cuda.make_graphed_callables`` on the CPU that hands out its static buffers as CUDA graphs
do: every replay writes its outputs and, in the backward, its input and parameter gradients into the same tensors,
and returns detached views of them (what torch's graphed callable returns). Code that keeps such a view past the
next replay (a parameter's ``.grad`` set from it, a list of gradients) sees it overwritten, as on a GPU."""

import torch


def static_buffer_capture(window, sample):
    """``window`` (a module over flat tensor arguments) replayed through static buffers, like its CUDA graphs."""
    params = tuple(window.parameters())
    n = len(sample)
    static = {}

    def into(name, tensors):
        if name not in static:
            static[name] = [None if t is None else torch.empty_like(t) for t in tensors]
        for buffer, t in zip(static[name], tensors):
            if buffer is not None:
                buffer.copy_(t)
        return static[name]

    class Replay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            inputs = [a.detach().requires_grad_(s.requires_grad) for a, s in zip(args[:n], sample)]
            with torch.enable_grad():
                outputs = window(*inputs)
            ctx.graph = inputs, outputs
            return tuple(t.detach() for t in into("outputs", [o.detach() for o in outputs]))

        @staticmethod
        def backward(ctx, *grads):
            inputs, outputs = ctx.graph
            leaves = [t for t in inputs if t.requires_grad] + list(params)
            got = iter(torch.autograd.grad(outputs, leaves, grads, allow_unused=True))
            full = [next(got) if t.requires_grad else None for t in inputs] + [next(got) for _ in params]
            full = [g if g is not None or k < n and not inputs[k].requires_grad else torch.zeros_like(leaf)
                    for k, (g, leaf) in enumerate(zip(full, list(inputs) + list(params)))]  # fmt: skip
            return tuple(None if b is None else b.detach() for b in into("grads", full))

    def replay(*args):
        return Replay.apply(*args, *params)

    return replay
