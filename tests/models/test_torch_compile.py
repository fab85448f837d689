"""``--torch-compile``: a model's static parts (DeFINE embeddings, each Transformer-XL layer) compiled in place; their
gradients are the eager ones, nothing compiles again after the first steps, and training with them resumes exactly.

The runs use torch.compile's ``aot_eager`` backend, which traces forward and backward as the compiler does and runs
them with eager kernels (seconds on a CPU); ``inductor`` generates code (tens of seconds per graph on two cores)."""

import pytest
import torch
from arch_cases import build_case, case_argv
from conftest import RUN_FLAGS, run_cli

from define_fairseq.modules.transformer_xl.layers import TransformerXLLayer, TransformerXLStack

COMPILE = ["--torch-compile", "--torch-compile-backend", "aot_eager"]
# Transformer-XL with a DeFINE input and a memory carried between batches (--task stateful_lm), dropout on
TXL_DEFINE = ["--input-layer", "define", "--txl-mem-len", "8", "--criterion", "lm_regularized_loss"]


def test_the_flag_compiles_the_static_parts_in_place(lm_data):
    _, _, eager = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE)
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE)
    layers = [m for m in model.modules() if isinstance(m, TransformerXLLayer)]
    parts = [model.decoder.embed_tokens, *layers]
    assert len(layers) == 2 and all(part._compiled_call_impl is not None for part in parts)
    assert model.decoder.stack._compiled_call_impl is None  # regional: each layer, not the stack as one graph
    assert not model.decoder.stack.clone_memory  # no CUDA graphs: the memory stays a view, as in eager mode
    assert model.decoder.embed_tokens.token_path == "auto"  # static shapes, the fewer rows
    assert eager.decoder.embed_tokens.chosen_token_path == "unique"  # a CPU's path without the flag
    assert model.state_dict().keys() == eager.state_dict().keys()  # checkpoints are the eager model's
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model.train()
    model(torch.randint(4, 40, (2, 16)))[0].sum().backward()  # a training forward goes through the compiled parts
    assert counters["stats"]["unique_graphs"] >= 2 and not counters["graph_break"], dict(counters)


def test_cuda_graphs_carry_the_memory_out_of_their_buffers(lm_data):
    """``reduce-overhead`` (CUDA graphs): the stack clones the memory it carries and marks each step's start (what
    that does: ``tests/modules/test_compile.py``; on a GPU: ``tests/modules/test_cuda_static_paths.py``)."""
    mode = ["--torch-compile-mode", "reduce-overhead", "--torch-compile-backend", "inductor"]
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, "--torch-compile", *mode)
    stacks = [m for m in model.modules() if isinstance(m, TransformerXLStack)]
    assert len(stacks) == 1 and stacks[0].clone_memory and stacks[0].mark_cudagraph_steps


def test_cuda_graphs_refuse_a_second_backward_before_the_update(lm_data):
    """``reduce-overhead`` with ``--update-freq`` above 1 (pytorch/pytorch#169545): the second backward into the
    compiled parts' parameters stops with an error naming both flags; one backward per update (fairseq resets the
    gradients to None) trains on. Built with the inductor backend, which on a CPU runs without CUDA graphs."""
    mode = ["--torch-compile-mode", "reduce-overhead", "--torch-compile-backend", "inductor"]
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, "--torch-compile", *mode)
    model.train()
    for part in (model.decoder.embed_tokens, *model.decoder.stack.layers):
        part._compiled_call_impl = None  # the refusal is the parameters' own: the eager forward shows it quickly
    tokens = torch.randint(4, 40, (2, 16))
    for _ in range(2):
        model(tokens, reset_state=True)[0].sum().backward()
        model.zero_grad(set_to_none=True)
    model(tokens, reset_state=True)[0].sum().backward()
    with pytest.raises(RuntimeError, match=r"--torch-compile-mode reduce-overhead .*--update-freq above 1"):
        model(tokens, reset_state=True)[0].sum().backward()


def test_each_forward_marks_a_cuda_graph_step_before_its_input_layer(lm_data, monkeypatch):
    """Under CUDA graphs the decoder's every forward starts a step before the embedding runs (the stack reads its
    output); without them nothing is marked."""
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE)
    events = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    model.decoder.embed_tokens.register_forward_hook(lambda *args: events.append("embed"))
    tokens = torch.randint(4, 40, (2, 16))
    model(tokens)
    assert events == ["embed"]
    model.decoder.stack.mark_cudagraph_steps = True
    model(tokens, reset_state=True)
    model(tokens, reset_state=False)
    assert events == ["embed", "mark", "embed", "mark", "embed"]


def test_a_token_path_with_data_dependent_shapes_is_refused(lm_data):
    with pytest.raises(ValueError, match="drop --define-token-path unique or --torch-compile"):
        build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE, "--define-token-path", "unique")
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE, "--define-token-path", "positions")
    assert model.decoder.embed_tokens.token_path == "positions"


@pytest.mark.parametrize("batch", [3, 5])  # 48 and 80 tokens against the case's 64 words: positions, then table
def test_compiled_gradients_equal_eager_ones(lm_data, batch):
    _, _, eager = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE)
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE)
    model.load_state_dict(eager.state_dict())
    tokens = torch.randint(4, 40, (batch, 16), generator=torch.Generator().manual_seed(0))
    embedding = model.decoder.embed_tokens
    assert embedding.path_for(tokens) == ("table" if tokens.numel() > embedding.num_embeddings else "positions")
    grads = []
    for m in (eager.double(), model.double()):
        m.eval()  # no dropout; autograd on, so DeFINE runs a token path rather than the eval-mode lookup
        m(tokens)[0].pow(2).mean().backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, grad in grads[0].items():
        # the compiled token path and the eager unique path sum a gradient over other rows (positions or every
        # word against distinct tokens) and the traced graph may sum in another order: float64 rounding of sums
        # over at most a few thousand terms
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-9, atol=1e-12, msg=name)


def compiled_frames() -> int:
    return torch._dynamo.utils.counters["frames"]["total"]


@pytest.mark.parametrize("mem_len", ["8", "0"])
def test_nothing_compiles_again_after_the_first_steps(lm_data, mem_len):
    """Training and evaluation steps with the memory carried (or none, ``--txl-mem-len 0``): the first steps of each
    mode compile (no memory yet, then with one); the same steps again compile nothing. One compilation serves every
    layer (they share their code): at most four frames for the layers (training and evaluation, each without and
    with a memory) and two for the embedding (training; evaluation, whose cached table is looked up eagerly), where
    compiling each of the three layers on its own would take twelve; the first-use check of each call signature
    (``CheckedCompiledCall``: in evaluation mode, with autograd where the call has it) at most doubles that."""
    flags = [*TXL_DEFINE[:2], "--txl-mem-len", mem_len, *TXL_DEFINE[4:], "--decoder-layers", "3", *COMPILE]
    _, _, model = build_case(lm_data, "transformer_xl_lm", *flags)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    tokens = torch.randint(4, 40, (2, 16), generator=torch.Generator().manual_seed(0))

    def steps():
        model.train()
        for reset in (True, False, False):
            model(tokens, reset_state=reset)[0].sum().backward()
        model.eval()
        with torch.no_grad():
            for reset in (True, False, False):
                model(tokens, reset_state=reset)

    steps()
    first = compiled_frames()
    assert 0 < first <= 2 * (4 + 2)
    steps()
    assert compiled_frames() == first


def train(data, save_dir, max_update, *flags):
    run_cli(
        "fairseq-train",
        *case_argv(data, "transformer_xl_lm", *TXL_DEFINE, stateful=True),
        "--dropout",
        "0.1",
        "--ddp-backend",
        "legacy_ddp",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        *RUN_FLAGS,
        "--max-update",
        str(max_update),
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--disable-validation",
        *flags,
    )
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]


@pytest.mark.slow  # a minute and a half: CI runs it once (make test-slow)
def test_compiled_training_resumes_exactly(lm_data, tmp_path):
    compiled = train(lm_data, tmp_path / "compiled", 6, *COMPILE)
    halfway = train(lm_data, tmp_path / "resumed", 3, *COMPILE)
    resumed = train(lm_data, tmp_path / "resumed", 6, *COMPILE)
    for name, value in compiled.items():
        if torch.is_tensor(value):
            # the same compiled arithmetic on the same inputs in the same order: equal to the last bit
            torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)
    # it trained on after the interruption
    assert any(not torch.equal(halfway[n], v) for n, v in compiled.items() if torch.is_tensor(v))
