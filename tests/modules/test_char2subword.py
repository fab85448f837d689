"""Char2SubwordEmbedding: character tables, markers, shapes and padding, the eval-mode table against the
per-token computation, embedding strings the dictionary lacks."""

import pytest
import torch

from define_fairseq.modules.char2subword import (
    BYTE_OFFSET,
    CONTINUES_CHAR,
    PAD_CHAR,
    WORD_START_CHAR,
    Char2SubwordEmbedding,
    character_table,
    encode_characters,
    token_characters,
)

SYMBOLS = ["<s>", "<pad>", "</s>", "<unk>", "the", "new@@", "\u2581new", "new", "wor@@", "ld", "Straße", "@@", "a" * 40]


def make(dim=16, **kwargs):
    torch.manual_seed(0)
    options = dict(char_dim=16, layers=2, heads=2, ffn_dim=32, max_chars=10)
    options.update(kwargs)
    return Char2SubwordEmbedding(SYMBOLS, 1, dim, special_indices=range(4), **options)


def test_markers_become_special_characters():
    assert token_characters("new@@") == ("new", False, True)
    assert token_characters("\u2581new") == ("new", True, False)
    assert token_characters("@@") == ("@@", False, False)
    assert encode_characters("new@@") == [BYTE_OFFSET + c for c in b"new"] + [CONTINUES_CHAR]
    assert encode_characters("\u2581new") == [WORD_START_CHAR] + [BYTE_OFFSET + c for c in b"new"]
    assert encode_characters("Straße") == [BYTE_OFFSET + c for c in "Straße".encode("utf-8")]
    cut = encode_characters("abcdefgh@@", max_chars=4)
    assert cut == [BYTE_OFFSET + c for c in b"abc"] + [CONTINUES_CHAR]  # cut, the marker kept
    table = character_table(SYMBOLS, 10, skip=range(4))
    assert table.shape == (len(SYMBOLS), 10)
    assert table[:4].eq(PAD_CHAR).all() and table[4, :3].tolist() == [BYTE_OFFSET + c for c in b"the"]


def test_shapes_padding_and_specials():
    module = make()
    tokens = torch.tensor([[4, 5, 6, 1], [2, 3, 12, 1]])
    out = module(tokens)
    assert out.shape == (2, 4, 16)
    assert out[:, 3].eq(0).all()  # padding
    torch.testing.assert_close(out[1, 0], module.special[module.special_slot[2]])  # a learned vector
    assert module.embedding_dim == 16 and module.padding_idx == 1 and module.num_embeddings == len(SYMBOLS)
    # markers and characters make different tokens different
    assert not torch.allclose(out[0, 1], out[0, 2]) and not torch.allclose(module(torch.tensor([7]))[0], out[0, 1])


def test_each_token_is_composed_alone_and_the_eval_table_equals_it():
    module = make()
    tokens = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 12, 4]])
    per_token = torch.stack([module.compose(module.chars[t][None])[0] for t in tokens.flatten()]).view(2, 5, -1)
    torch.testing.assert_close(module(tokens), per_token, rtol=1e-5, atol=1e-5)  # training: distinct tokens once
    torch.testing.assert_close(module(tokens)[1, 4], module(tokens)[0, 0])  # no context
    module.eval()
    with torch.no_grad():
        table_out = module(tokens)
        assert module._table.value is not None
        torch.testing.assert_close(table_out, per_token, rtol=1e-5, atol=1e-5)
        # a parameter changes in eval mode: the table is recomputed (a bias different per feature: a constant one
        # would pass the max-pooling and be removed by the final LayerNorm)
        module.out_proj.bias.add_(torch.randn(module.out_proj.bias.shape, generator=torch.Generator().manual_seed(1)))
        changed = module(tokens)
    expected = torch.stack([module.compose(module.chars[t][None])[0] for t in tokens.flatten()]).view(2, 5, -1)
    torch.testing.assert_close(changed, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(changed, table_out)


def test_given_characters_replace_the_token_where_a_row_is_not_empty():
    module = make()
    tokens = torch.tensor([[4, 3, 2]])  # "the", <unk>, </s>
    chars = torch.zeros(1, 3, 10, dtype=torch.long)
    chars[0, 0, :3] = torch.tensor(encode_characters("the"))  # the dictionary's own characters
    chars[0, 1, :5] = torch.tensor(encode_characters("thhe@@"))  # a misspelling the dictionary lacks
    out = module(tokens, chars)
    plain = module(tokens)
    torch.testing.assert_close(out[0, 0], plain[0, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0, 2], plain[0, 2])  # empty row: the token id (a special)
    torch.testing.assert_close(out[0, 1], module.compose(chars[0, 1][None])[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0, 1], plain[0, 1])  # not the <unk> vector


def test_gradients_reach_the_character_encoder_and_the_specials():
    module = make()
    module(torch.tensor([[4, 2, 5]])).pow(2).sum().backward()
    assert module.char_embed.weight.grad.abs().sum() > 0
    assert module.char_transformer.layers[0].self_attn.in_proj_weight.grad.abs().sum() > 0
    assert module.special.grad[module.special_slot[2]].abs().sum() > 0


def test_output_scale_multiplies_the_layer_norm_output():
    module = make(output_scale=0.25)
    reference = make()
    tokens = torch.tensor([[4, 5]])
    torch.testing.assert_close(module(tokens), 0.25 * reference(tokens))


def test_set_output_scale_keeps_every_output():
    module = make(output_scale=0.1)
    with torch.no_grad():  # a trained LayerNorm: gain and bias away from their initial 1 and 0
        module.layer_norm.weight.uniform_(0.5, 1.5)
        module.layer_norm.bias.uniform_(-0.2, 0.2)
    tokens = torch.tensor([[4, 2, 5, 1], [6, 3, 0, 7]])
    chars = torch.zeros(2, 4, 12, dtype=torch.long)
    chars[1, 2, :3] = torch.tensor(encode_characters("wrd"))  # an unknown string at one position
    before = module(tokens, chars).detach()
    module.eval()
    with torch.no_grad():
        table_before = module(tokens)
    module.set_output_scale(0.5)
    assert module.output_scale == 0.5
    with torch.no_grad():
        torch.testing.assert_close(module(tokens), table_before)  # the cached table was rebuilt
    module.train()
    torch.testing.assert_close(module(tokens, chars), before)
    with pytest.raises(ValueError, match="output_scale=0"):
        module.set_output_scale(0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(char_dim=15, heads=2), "divisible by heads"),
        (dict(max_chars=0), "max_chars=0"),
        (dict(dropout=1.0), "dropout=1.0"),
    ],
)
def test_impossible_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(**kwargs)
