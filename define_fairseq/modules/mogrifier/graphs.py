"""A :class:`~define_fairseq.modules.mogrifier.lstm.MogrifierLSTM`'s BPTT window as CUDA graphs
(:class:`WindowGraphs`, used when ``MogrifierLSTM.cuda_graphs`` is on), because a window of the fast path is
thousands of small kernels whose launches take longer on the host than they run on the GPU.

* With autograd (training): the whole stack's forward and backward over the window, its dropout masks drawn inside
  (a new draw at every replay: CUDA graphs advance the generator's offset), captured by
  ``torch.cuda.make_graphed_callables``; the generator's state is put back after the capture's warm-up runs, so
  that the masks of a step depend on the seed and the steps before it only, not on when a graph was captured.
* Without autograd (validation, ``fairseq-eval-lm``): the forward, captured by hand.

The input and the carried state are copied into the graph's static inputs at each call, and the outputs copied
out of its static outputs, so the state carried to the next window is never a buffer that the next replay
overwrites. One graph per call signature (shape, dtype, mode, grad mode, which inputs require grad), at most
:data:`MAX_GRAPHS`; a later signature (a last, shorter batch beyond them), explicit dropout masks, autocast, or a
CPU input run the eager path, the same function (the first such signature warns). While capturing, the layers keep
no buffers from call to call (the graph's own memory pool holds them).

The backward of a graphed callable hands out its static gradient buffers (detached views of them): a parameter
whose ``.grad`` is None would keep such a view as its gradient, which the next backward replay overwrites before
adding to it (two backward calls before an optimizer step, as with ``--update-freq 2``, would give ``2 g_2`` instead
of ``g_1 + g_2``; pytorch/pytorch#181723). So every gradient leaving a replay is cloned out of the buffers
(:func:`own_gradients`). The captures are the class's ``capture_training`` and ``capture_inference``, which a test
replaces by a stand-in that hands out static buffers in the same way.
"""

import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

MAX_GRAPHS = 4  # call signatures captured per stack; each holds its own memory pool


class _Window(nn.Module):
    """The stack over one window with flat tensor arguments, as ``make_graphed_callables`` takes them (its
    parameters are the stack's). Shapes: ``x [B, T, C]``, ``h_1, c_1, h_2, c_2, ...`` each ``[B, H]`` ->
    ``(output [B, T, H], h_1', c_1', ...)``."""

    def __init__(self, lstm: nn.Module):
        super().__init__()
        self.lstm = lstm

    def forward(self, x, *flat_state):
        state = [(flat_state[i], flat_state[i + 1]) for i in range(0, len(flat_state), 2)]
        out, new_state = self.lstm._run(x, state, None, reference=False)
        return (out,) + tuple(t for pair in new_state for t in pair)


def _capture_training(window: _Window, sample: Sequence[torch.Tensor]) -> Callable:
    """Forward and backward as graphs (an autograd node replaying them); the CUDA generator left as before."""
    rng = torch.cuda.get_rng_state(sample[0].device)
    try:
        return torch.cuda.make_graphed_callables(window, tuple(sample))
    finally:
        torch.cuda.set_rng_state(rng, sample[0].device)


def _capture_inference(window: _Window, sample: Sequence[torch.Tensor]) -> Callable:
    """The forward as one graph, replayed on copies of the inputs."""
    static_inputs = [t.clone() for t in sample]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # lazy initialisation (cuBLAS handles, Triton compilation) outside the capture
        for _ in range(2):
            window(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = window(*static_inputs)

    def replay(*inputs):
        for static, given in zip(static_inputs, inputs):
            static.copy_(given)
        graph.replay()
        return static_outputs

    replay.graph = graph  # kept alive with the replaying function
    return replay


def own_gradients(node) -> None:
    """Make the gradients that autograd ``node`` (a graph replay's) passes on copies, not its static buffers."""
    if node is not None:
        node.register_hook(
            lambda grad_inputs, grad_outputs: tuple(None if g is None else g.clone() for g in grad_inputs)
        )


class WindowGraphs:
    """The CUDA graphs of one stack, by call signature (see the module docstring). Not copied, not pickled."""

    capture_training = staticmethod(_capture_training)
    capture_inference = staticmethod(_capture_inference)

    def __init__(self):
        self.graphs: Dict[tuple, Callable] = {}
        self.parameters: Optional[Tuple[int, ...]] = None
        self.warned = False

    def usable(self, x: torch.Tensor, masks) -> bool:
        """Whether a call can be graphed: a CUDA input, masks drawn inside, no autocast, not inside a capture."""
        return (
            x.is_cuda
            and masks is None
            and not torch.is_autocast_enabled("cuda")
            and not torch.cuda.is_current_stream_capturing()
        )

    def run(self, lstm: nn.Module, x: torch.Tensor, state: List) -> Optional[tuple]:
        """``lstm``'s ``(output, new_state)`` through the graph of this call's signature, or None where none may
        be captured (the caller runs the eager path)."""
        parameters = tuple(p.data_ptr() for p in lstm.parameters())
        if parameters != self.parameters:  # moved or cast since: every graph reads stale storage
            self.graphs, self.parameters = {}, parameters
        flat = [t for pair in state for t in pair]
        grad = torch.is_grad_enabled()
        key = self.signature(lstm, x, flat)
        replay = self.graphs.get(key)
        if replay is None:
            if len(self.graphs) >= MAX_GRAPHS:
                if not self.warned:
                    self.warned = True
                    warnings.warn(
                        f"MogrifierLSTM: {MAX_GRAPHS} window shapes are captured as CUDA graphs already; input "
                        f"{list(x.shape)} ({'training' if lstm.training else 'eval'}) and later new shapes run "
                        f"eagerly (the same function, slower)"
                    )
                return None
            replay = self.graphs[key] = self._capture(lstm, x, flat, grad)
        outputs = replay(x, *flat)
        own_gradients(outputs[0].grad_fn)
        out = outputs[0].clone()
        rest = [t.clone() for t in outputs[1:]]
        return out, [(rest[i], rest[i + 1]) for i in range(0, len(rest), 2)]

    @staticmethod
    def signature(lstm: nn.Module, x: torch.Tensor, flat: List[torch.Tensor]) -> tuple:
        """What one graph serves: shape, dtype, device, mode, grad mode, which inputs require grad."""
        requires = tuple(t.requires_grad for t in [x] + flat)
        return (tuple(x.shape), x.dtype, x.device, lstm.training, torch.is_grad_enabled(), requires)

    def _capture(self, lstm: nn.Module, x: torch.Tensor, flat: List[torch.Tensor], grad: bool) -> Callable:
        window = _Window(lstm).train(lstm.training)
        sample = [t.detach().clone().requires_grad_(t.requires_grad) for t in [x] + flat]
        workspaces = [layer.workspace for layer in lstm.layers]
        for layer in lstm.layers:  # buffers kept between calls would lie outside the graph's memory pool
            layer.workspace = None
        try:
            if grad:
                return self.capture_training(window, sample)
            with torch.no_grad():
                return self.capture_inference(window, sample)
        finally:
            for layer, workspace in zip(lstm.layers, workspaces):
                layer.workspace = workspace

    def clear(self) -> None:
        self.graphs, self.parameters = {}, None

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __deepcopy__(self, memo):
        return WindowGraphs()
