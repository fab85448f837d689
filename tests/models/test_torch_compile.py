"""``--torch-compile``: a model's static parts (DeFINE embeddings, a Transformer-XL context network) compiled in
place; their gradients are the eager ones, and training with them resumes exactly.

The runs use torch.compile's ``aot_eager`` backend, which traces forward and backward as the compiler does and runs
them with eager kernels (seconds on a CPU); ``inductor`` generates code (tens of seconds per graph on two cores)."""

import pytest
import torch
from arch_cases import build_case, case_argv
from conftest import run_cli

from define_fairseq.modules import DeFINEEmbedding, TransformerXLStack

COMPILE = ["--torch-compile", "--torch-compile-backend", "aot_eager"]
# Transformer-XL with a DeFINE input and a memory carried between batches (--task stateful_lm), dropout on
TXL_DEFINE = ["--input-layer", "define", "--txl-mem-len", "8", "--criterion", "lm_regularized_loss"]


def test_the_flag_compiles_the_static_parts_in_place(lm_data):
    _, _, eager = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE)
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE)
    parts = [m for m in model.modules() if isinstance(m, (DeFINEEmbedding, TransformerXLStack))]
    assert len(parts) == 2 and all(part._compiled_call_impl is not None for part in parts)
    assert model.decoder.embed_tokens.token_path == "table"  # static shapes: the unit runs on the whole map
    assert eager.decoder.embed_tokens.token_path == "unique"
    assert model.state_dict().keys() == eager.state_dict().keys()  # checkpoints are the eager model's
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model.train()
    model(torch.randint(4, 40, (2, 16)))[0].sum().backward()  # a training forward goes through the compiled parts
    assert counters["stats"]["unique_graphs"] >= 2 and not counters["graph_break"], dict(counters)


def test_a_token_path_with_data_dependent_shapes_is_refused(lm_data):
    with pytest.raises(ValueError, match="drop --define-token-path unique or --torch-compile"):
        build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE, "--define-token-path", "unique")
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE, "--define-token-path", "positions")
    assert model.decoder.embed_tokens.token_path == "positions"


def test_compiled_gradients_equal_eager_ones(lm_data):
    _, _, eager = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, "--define-token-path", "table")
    _, _, model = build_case(lm_data, "transformer_xl_lm", *TXL_DEFINE, *COMPILE)
    model.load_state_dict(eager.state_dict())
    tokens = torch.randint(4, 40, (3, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for m in (eager, model):
        m.eval()  # no dropout; autograd on, so DeFINE runs its table path rather than the eval-mode lookup
        m(tokens)[0].float().pow(2).mean().backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, grad in grads[0].items():
        # the traced graph may sum in another order: float32 rounding of sums over at most a few thousand terms
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-7, msg=name)


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
        "--cpu",
        "--num-workers",
        "0",
        "--seed",
        "1",
        "--max-update",
        str(max_update),
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--disable-validation",
        *flags,
    )
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]


def test_compiled_training_resumes_exactly(lm_data, tmp_path):
    compiled = train(lm_data, tmp_path / "compiled", 6, *COMPILE)
    train(lm_data, tmp_path / "resumed", 3, *COMPILE)
    resumed = train(lm_data, tmp_path / "resumed", 6, *COMPILE)
    start = train(lm_data, tmp_path / "start", 1, *COMPILE)
    for name, value in compiled.items():
        if torch.is_tensor(value):
            # the same compiled arithmetic on the same inputs in the same order: equal to the last bit
            torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(start[n], v) for n, v in compiled.items() if torch.is_tensor(v))  # it trained
