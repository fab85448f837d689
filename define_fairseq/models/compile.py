"""``--torch-compile``: the parts of a model whose shapes are static, compiled with ``torch.compile``.

Every model of the plugin takes the flags (:class:`CompileConfig`, a base of each family's config). With
``--torch-compile`` the model's DeFINE embeddings take the token path with static shapes and the fewest rows
(``token_path="auto"``: the unit on the whole ``V x n`` map when ``V`` is smaller than the tokens of a call, else on
every position; ``--define-token-path table`` or ``positions`` fixes one; no ``torch.unique`` host synchronisation)
and are compiled, and so is each layer of a Transformer-XL context network, one layer at a time (regional
compilation: the layers share their code, so one compilation serves all of them; the memory bookkeeping between
them runs eagerly). The rest of the model runs as before. Each compiled part has been compiled with
``fullgraph=True`` in the tests (``tests/modules/test_compile.py``); here a graph break is allowed, because in
eval mode without autograd a DeFINE embedding looks its rows up in a cached table, which is Python bookkeeping.
The parameters and the checkpoint are those of the eager model (``nn.Module.compile`` compiles in place), so a
compiled run resumes from an eager checkpoint and the other way round.

With ``--torch-compile-mode reduce-overhead`` (CUDA graphs) a compiled region's outputs live in buffers that its
next replay overwrites, so the Transformer-XL memory carried to the next batch is cloned out of them
(``TransformerXLStack.clone_memory``) and each forward of the Transformer-XL decoder starts a new CUDA-graph step
(``torch.compiler.cudagraph_mark_step_begin``). The recurrent models compile only their DeFINE embeddings, whose
output is used within the step, and carry a state computed eagerly. Two backward calls before an optimizer step
(``--update-freq`` above 1) would accumulate a parameter's gradient into a buffer that the next replay overwrites
(pytorch/pytorch#169545): that combination stops at the second backward with an error naming both flags
(:func:`refuse_accumulation`; the model's flags do not include ``--update-freq``, so it is caught where it happens).

Each compiled part checks itself against its eager forward on the first call of each call signature
(:class:`~define_fairseq.modules.checked_path.CheckedPath`, in evaluation mode: the compiled dropout draws other
random numbers than the eager one), and on a failure or a difference warns and runs eagerly from then on.
"""

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from define_fairseq.modules.checked_path import CheckedPath, flatten
from define_fairseq.modules.define.embedding import DeFINEEmbedding
from define_fairseq.modules.transformer_xl.layers import TransformerXLLayer, TransformerXLStack

STATIC_TOKEN_PATHS = ("auto", "table", "positions")  # the DeFINE token paths whose shapes do not depend on the data
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class CompileConfig(FairseqDataclass):
    torch_compile: bool = field(
        default=False,
        metadata={
            "help": "compile the model's static parts with torch.compile: its DeFINE embeddings (on the whole V x n "
            "map or on every position, whichever has fewer rows) and each Transformer-XL layer; the first steps "
            "take longer while they compile"
        },
    )
    torch_compile_mode: Optional[ChoiceEnum(COMPILE_MODES)] = field(
        default=None,
        metadata={"help": "torch.compile's mode (reduce-overhead: CUDA graphs); default: torch's"},
    )
    torch_compile_backend: str = field(
        default="inductor", metadata={"help": "torch.compile's backend (aot_eager: no code generation)"}
    )


def compiled_parts(model: nn.Module) -> list:
    """The parts of ``model`` that ``--torch-compile`` compiles: its DeFINE embeddings and Transformer-XL layers,
    each once (a shared embedding is one part)."""
    parts, seen = [], set()
    for module in model.modules():
        if isinstance(module, (DeFINEEmbedding, TransformerXLLayer)) and id(module) not in seen:
            seen.add(id(module))
            parts.append(module)
    return parts


@dataclass(frozen=True)
class CompileSpec:
    """What ``--torch-compile`` asks for, checked: the DeFINE token path and ``nn.Module.compile``'s options."""

    token_path: str
    backend: str
    mode: Optional[str]  # None: torch's default

    @property
    def options(self) -> dict:
        return dict(backend=self.backend, **({} if self.mode is None else {"mode": self.mode}))


def resolve_compile(cfg) -> Optional[CompileSpec]:
    """``cfg``'s ``--torch-compile*`` flags as a :class:`CompileSpec` (None without ``--torch-compile``); every
    family calls it before it builds a module.

    Raises ``ValueError`` naming the flag when ``--define-token-path`` asks for the path with data-dependent shapes.
    """
    if not getattr(cfg, "torch_compile", False):
        return None
    token_path = getattr(cfg, "define_token_path", None)
    token_path = "auto" if token_path is None else str(token_path)
    if token_path not in STATIC_TOKEN_PATHS:
        raise ValueError(
            f"--torch-compile needs a DeFINE token path with static shapes (--define-token-path auto, the default "
            f"under --torch-compile, table or positions); drop --define-token-path {token_path} or --torch-compile"
        )
    mode = getattr(cfg, "torch_compile_mode", None)
    mode = None if mode is None or str(mode) == "default" else str(mode)
    return CompileSpec(token_path, getattr(cfg, "torch_compile_backend", None) or "inductor", mode)


def compile_static_parts(model: nn.Module, cfg) -> nn.Module:
    """``model`` with its static parts compiled in place when ``cfg.torch_compile`` (else unchanged); returns it.
    The flags are those :func:`resolve_compile` checks."""
    spec = resolve_compile(cfg)
    if spec is None:
        return model
    token_path, options = spec.token_path, spec.options
    for part in compiled_parts(model):
        if isinstance(part, DeFINEEmbedding):
            part.token_path = token_path
            part.keep_lookup_eager()
        part.compile(**options)
        part._compiled_call_impl = CheckedCompiledCall(part, part._compiled_call_impl)
    graphs = options.get("mode") == "reduce-overhead"
    if graphs:
        refuse_accumulation(model)
    for module in model.modules():
        if isinstance(module, TransformerXLStack):
            module.clone_memory = module.mark_cudagraph_steps = graphs
    return model


class CheckedCompiledCall:
    """A compiled part's call (what ``nn.Module.compile`` installs), checked against the part's eager call on the
    first call of each signature (mode, grad mode, the tensors' shapes and dtypes)."""

    def __init__(self, part: nn.Module, compiled):
        self.part, self.compiled = part, compiled
        self.check = CheckedPath(
            f"the compiled {type(part).__name__}",
            "dropping --torch-compile",
            f"compiling {type(part).__name__} with torch.compile, once per shape (the first steps wait for it)",
            check_mode=self.evaluation,
        )

    @contextlib.contextmanager
    def evaluation(self):
        was_training = self.part.training
        self.part.train(False)
        try:
            yield
        finally:
            self.part.train(was_training)

    def __call__(self, *args, **kwargs):
        shapes = tuple((tuple(t.shape), t.dtype) for t in flatten(list(args)) + flatten(kwargs))
        key = (self.part.training, torch.is_grad_enabled(), shapes)
        compiled, eager = (lambda *a: self.compiled(*a, **kwargs)), (lambda *a: self.part._call_impl(*a, **kwargs))
        return self.check(key, compiled, eager, args, self.part.parameters())


def refuse_accumulation(model: nn.Module) -> None:
    """Make a second backward into a compiled part's parameters before their gradients are reset (fairseq sets
    them to None at every update) raise, naming ``--update-freq`` and ``--torch-compile-mode reduce-overhead``."""
    for part in compiled_parts(model):
        for parameter in part.parameters():
            if parameter.requires_grad:
                parameter.register_hook(_refusal(parameter))


def _refusal(parameter: nn.Parameter):
    def hook(grad):
        if parameter.grad is not None:
            raise RuntimeError(
                "--torch-compile-mode reduce-overhead cannot accumulate gradients over several backward calls "
                "(--update-freq above 1): the CUDA graphs overwrite the first gradient (pytorch/pytorch#169545); "
                "use --update-freq 1, or another --torch-compile-mode (default: no CUDA graphs)"
            )
        return grad

    return hook
