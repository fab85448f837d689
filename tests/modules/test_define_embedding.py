import math
import re

import pytest
import torch

from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.modules.define.embedding import TOKEN_PATHS


def make(**kwargs):
    torch.manual_seed(0)
    return DeFINEEmbedding(50, n=16, k=64, m=24, padding_idx=1, **kwargs)


def tokens():
    return torch.tensor([[5, 7, 5, 1], [9, 5, 7, 1]])


def test_shapes_and_fairseq_attributes():
    emb = make()
    assert emb(tokens()).shape == (2, 4, 24)
    assert emb.embedding_dim == 24 and emb.padding_idx == 1
    assert emb.weight is emb.table.weight and emb.weight.shape == (50, 16)
    assert torch.count_nonzero(emb.weight[1]) == 0


def test_equals_plain_recomputation():
    emb = make()
    expected = emb.define(emb.table.weight[tokens()] * math.sqrt(16))
    torch.testing.assert_close(emb(tokens()), expected)


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_every_token_path_equals_the_literal_per_position_computation_with_gradients(path):
    """Outputs and every parameter's gradient against ``define(sqrt(n) * table(tokens))`` position by position.

    float64: the paths sum a parameter's gradient in other orders (over distinct tokens, over all V table rows,
    over positions); float32 gradients of about 10 then differ by a few units in the last place, more than a float32
    tolerance allows for their entries near zero. In float64 those sums of a few dozen terms agree to about 1e-14."""
    emb = make(token_path=path).double()
    params = list(emb.parameters())
    out = emb(tokens())
    grads = torch.autograd.grad(out.square().sum(), params)
    literal = torch.stack([emb.define(emb.table(t) * math.sqrt(16)) for t in tokens().reshape(-1)])
    expected = torch.autograd.grad(literal.square().sum(), params)
    torch.testing.assert_close(out, literal.view(2, 4, 24), rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert torch.count_nonzero(grads[params.index(emb.table.weight)][1]) == 0  # the padding row stays at zero


def test_token_path_setting_and_the_unique_tokens_switch():
    emb = make()
    assert emb.token_path is None and emb.chosen_token_path == "unique"  # no choice made: a CPU's path
    assert emb.unique_tokens and emb.runs_per_distinct_token
    emb.unique_tokens = False
    assert emb.token_path == "positions" and not emb.unique_tokens
    emb.unique_tokens = True
    assert emb.token_path == "unique"
    assert not make(token_path="table").unique_tokens
    message = "token_path='rows': unknown; choose one of unique, table, positions"
    with pytest.raises(ValueError, match=re.escape(message)):
        make(token_path="rows")


def test_without_a_choice_the_path_is_the_devices_auto_on_cuda_unique_elsewhere():
    emb = make()
    emb.define_device = lambda: torch.device("cuda")  # where the parameters would lie on a GPU
    assert emb.chosen_token_path == "auto" and not emb.runs_per_distinct_token
    assert emb.path_for(torch.zeros(2 * emb.num_embeddings, dtype=torch.long)) == "table"
    assert emb.path_for(torch.zeros(3, dtype=torch.long)) == "positions"
    emb.token_path = "unique"  # a choice holds on every device
    assert emb.chosen_token_path == "unique"


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_dropout_while_training_runs_on_every_position_whatever_the_path(path):
    emb = make(token_path=path, dropout=0.5)
    assert emb.train().active_token_path == "positions"
    assert emb.eval().active_token_path == path


def test_eval_table_equals_per_token_computation_and_follows_weight_changes():
    emb = make().eval()
    with torch.no_grad():
        looked_up = emb(tokens())
    expected = emb.define(emb.table.weight * math.sqrt(16))[tokens()]
    torch.testing.assert_close(looked_up, expected.detach(), rtol=0, atol=0)
    # a training step in between must not leave a stale table behind. (A perturbation the unit can see: a
    # constant added to a group's weights only shifts its outputs equally, which the per-group LayerNorm removes.)
    emb.train()
    with torch.no_grad():
        emb.define.layers[0].weight.add_(
            0.5 * torch.randn(emb.define.layers[0].weight.shape, generator=torch.Generator().manual_seed(1))
        )
    emb.eval()
    with torch.no_grad():
        after = emb(tokens())
    assert not torch.allclose(after, looked_up)
    torch.testing.assert_close(after, emb.define(emb.table.weight * 4.0)[tokens()].detach(), rtol=0, atol=0)
    # and neither must loading other weights
    other = make()
    with torch.no_grad():
        other.table.weight.mul_(2)
    emb.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(emb(tokens()), other.eval()(tokens()), rtol=0, atol=0)


def test_dropout_in_the_unit_draws_a_mask_per_position():
    emb = make(dropout=0.5).train()
    out = emb(torch.tensor([[5, 5, 5, 5, 5, 5]]))
    assert not torch.allclose(out[0, 0], out[0, 1])  # same token, different positions, different masks


def test_map_dropout_draws_one_mask_per_sentence_and_feature():
    """``map_dropout`` (the authors' ``delight_emb_dropout``) multiplies the scaled map output by a ``[B, 1, n]``
    mask, shared by a sentence's positions, before the unit; in eval mode it is off."""
    emb = make(map_dropout=0.5).train()
    assert not emb.runs_per_distinct_token
    torch.manual_seed(3)
    out = emb(tokens())
    torch.manual_seed(3)
    mask = torch.empty(2, 1, 16).bernoulli_(0.5).div_(0.5)
    torch.testing.assert_close(out, emb.define(emb.table.weight[tokens()] * math.sqrt(16) * mask))
    torch.testing.assert_close(out[0, 0], out[0, 2])  # token 5 twice in one sentence: one mask
    with torch.no_grad():
        torch.testing.assert_close(emb.eval()(tokens()), make().eval()(tokens()), rtol=0, atol=0)


def test_map_dropout_must_be_a_probability():
    with pytest.raises(ValueError, match=re.escape("map_dropout=1.0: a dropout probability must be in [0, 1)")):
        make(map_dropout=1.0)


def test_fold_gives_the_eval_outputs_and_keeps_the_table():
    emb = make().eval()
    folded = emb.fold()
    assert folded.table is emb.table and folded.weight is emb.weight
    with torch.no_grad():
        torch.testing.assert_close(folded(tokens()), emb(tokens()), rtol=0, atol=0)


def test_fold_keeps_the_modules_dtype_and_device():
    """The folded table is made where the module is and in its dtype (a model folded on a GPU, in half precision,
    looks its rows up there); float64 stands for both on a CPU."""
    emb = make().double().eval()
    folded = emb.fold()
    assert (folded.folded.dtype, folded.folded.device) == (torch.float64, emb.weight.device)
    with torch.no_grad():
        torch.testing.assert_close(folded(tokens()), emb(tokens()), rtol=0, atol=0)


def test_an_in_place_change_in_eval_mode_reaches_the_next_output():
    emb = make().eval()
    with torch.no_grad():
        before = emb(tokens())
        emb.table.weight[5].mul_(-1.0)  # token 5 only, no train() in between
        after = emb(tokens())
    torch.testing.assert_close(after, emb.define(emb.table.weight * 4.0)[tokens()].detach(), rtol=0, atol=0)
    changed = (after - before).abs().amax(dim=-1) > 1e-3
    assert changed.tolist() == (tokens() == 5).tolist()


def test_table_path_through_an_adaptive_map_equals_the_unique_path():
    """With ``adaptive_cutoff`` the table path maps every id through the adaptive input (float64, as above; a band
    without tokens in the batch has no gradient on the unique path and zeros on the table path)."""
    torch.manual_seed(0)
    emb = DeFINEEmbedding(50, n=16, k=64, m=24, padding_idx=1, adaptive_cutoff=[10, 30], adaptive_factor=2).double()
    results = []
    for path in ("unique", "table"):
        emb.token_path = path
        out = emb(tokens())
        grads = torch.autograd.grad(out.square().sum(), list(emb.parameters()), allow_unused=True)
        results.append((out, [torch.zeros_like(p) if g is None else g for p, g in zip(emb.parameters(), grads)]))
    (out_u, grads_u), (out_t, grads_t) = results
    torch.testing.assert_close(out_t, out_u, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_t, grads_u):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_an_output_norm_is_part_of_what_every_path_and_the_folded_table_compute():
    emb = make(output_norm="layer").double()
    with torch.no_grad():
        emb.define.output_norm.bias.fill_(0.5)
    literal = emb.define(emb.table.weight[tokens()] * math.sqrt(16))
    # every position normalised to mean 0, then shifted by the norm's bias
    torch.testing.assert_close(literal.mean(-1), torch.full((2, 4), 0.5, dtype=torch.float64), rtol=0, atol=1e-12)
    for path in TOKEN_PATHS:
        emb.token_path = path
        torch.testing.assert_close(emb(tokens()), literal, rtol=1e-12, atol=1e-12)
    emb.eval()
    with torch.no_grad():
        torch.testing.assert_close(emb.fold()(tokens()), literal, rtol=1e-12, atol=1e-12)


def test_the_authors_unit_takes_no_output_norm():
    with pytest.raises(
        ValueError, match=re.escape("output_norm='layer': the authors' unit (variant='delight') normalises its output")
    ):
        make(variant="delight", output_norm="layer")
