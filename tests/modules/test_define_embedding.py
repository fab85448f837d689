import math
import re

import pytest
import torch

from define_fairseq.modules import DeFINEEmbedding


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


def test_unique_token_path_equals_per_position_path_with_gradients():
    # float64: the two paths sum the gradient in other orders; float32 gradients of about 10 then differ by a few
    # units in the last place, more than a float32 tolerance allows for their entries near zero
    emb = make().double()
    out_unique = emb(tokens())
    grads_unique = torch.autograd.grad(out_unique.square().sum(), list(emb.parameters()))
    emb.unique_tokens = False
    out_all = emb(tokens())
    grads_all = torch.autograd.grad(out_all.square().sum(), list(emb.parameters()))
    torch.testing.assert_close(out_unique, out_all, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_unique, grads_all):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


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
