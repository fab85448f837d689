"""AdaptiveInput: per-band lookup and projection, the paper's parameter counts, tying with fairseq's
AdaptiveSoftmax, and the DeFINE embedding over an adaptive map."""

import re

import pytest
import torch

from define_fairseq.modules import AdaptiveInput, DeFINEEmbedding

WT103_VOCAB = 267735
WT103_CUTOFF = [20000, 40000, 200000]


def adaptive_io_params(d, vocab=WT103_VOCAB, cutoff=WT103_CUTOFF, factor=4):
    """Closed form: band tables, projections of bands > 0, and the softmax head's 3-cluster projection."""
    bounds = [0] + cutoff + [vocab]
    total = 0
    for i in range(len(bounds) - 1):
        dim = d // factor**i
        total += (bounds[i + 1] - bounds[i]) * dim + (dim * d if i > 0 else 0)
    return total + len(cutoff) * d


def test_forward_equals_per_token_recomputation():
    torch.manual_seed(0)
    emb = AdaptiveInput(50, 1, 16, [10, 30], factor=2, output_dim=16)
    tokens = torch.randint(0, 50, (3, 7))
    out = emb(tokens)
    for b in range(3):
        for t in range(7):
            tok = int(tokens[b, t])
            band = 0 if tok < 10 else 1 if tok < 30 else 2
            start = [0, 10, 30][band]
            row = emb.tables[band].weight[tok - start]
            table, proj = emb.weights_for_band(band)
            expected = row if proj is None else proj @ row
            torch.testing.assert_close(out[b, t], expected)
    assert emb.weights_for_band(0)[1] is None  # band 0 unprojected when dim == output_dim
    assert emb.tables[1].weight.shape == (20, 8) and emb.tables[2].weight.shape == (20, 4)
    assert torch.all(emb(torch.tensor([1])) == 0)  # padding row


@pytest.mark.parametrize("d, expected", [(256, 9.25), (384, 13.90), (512, 18.55)])
def test_paper_adaptive_io_counts(d, expected):
    """The DeFINE paper's Table 1a: adaptive input + tied adaptive softmax = 9.25M / 13.90M / 18.55M at V=267,735."""
    from fairseq.modules import AdaptiveSoftmax

    emb = AdaptiveInput(WT103_VOCAB, 1, d, WT103_CUTOFF, factor=4)
    softmax = AdaptiveSoftmax(WT103_VOCAB, d, WT103_CUTOFF, dropout=0.0, factor=4, adaptive_inputs=emb, tie_proj=True)
    params = {id(p): p for p in list(emb.parameters()) + list(softmax.parameters())}
    count = sum(p.numel() for p in params.values())
    assert count == adaptive_io_params(d)
    assert round(count / 1e6, 2) == expected


def test_tied_adaptive_softmax_is_a_distribution():
    from fairseq.modules import AdaptiveSoftmax

    torch.manual_seed(0)
    emb = AdaptiveInput(40, 1, 16, [8, 20], factor=2)
    softmax = AdaptiveSoftmax(40, 16, [8, 20], dropout=0.0, factor=2, adaptive_inputs=emb, tie_proj=True)
    assert softmax.head.word_proj.weight is emb.tables[0].weight
    logp = softmax.get_log_prob(torch.randn(2, 5, 16), target=None)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 5))


@pytest.mark.parametrize(
    "cutoff, message", [([10, 5], "increasing"), ([10, 60], "below the vocabulary"), ([0, 10], "positive")]
)
def test_bad_cutoffs_name_the_argument(cutoff, message):
    with pytest.raises(ValueError, match=message) as err:
        AdaptiveInput(50, 1, 16, cutoff)
    assert str(err.value).startswith("cutoff ")


def test_a_band_without_dimensions_names_the_factor():
    with pytest.raises(ValueError, match=re.escape("factor=4: band 2 would have 8 // 4**2 = 0 dimensions")):
        AdaptiveInput(50, 1, 8, [10, 20], factor=4)


def test_define_embedding_over_adaptive_map():
    torch.manual_seed(0)
    emb = DeFINEEmbedding(50, n=16, k=32, m=24, padding_idx=1, adaptive_cutoff=[10, 30], adaptive_factor=2)
    tokens = torch.randint(0, 50, (2, 6))
    out = emb(tokens)
    assert out.shape == (2, 6, 24)
    expected = emb.define(emb.adaptive(tokens) * emb.embed_scale)
    torch.testing.assert_close(out, expected)
    assert emb.weights_for_band(1)[0] is emb.adaptive.tables[1].weight
    assert not hasattr(emb, "weight")
    emb.eval()
    with torch.no_grad():
        torch.testing.assert_close(emb(tokens), expected.detach(), rtol=1e-5, atol=1e-5)
    folded = emb.fold()  # the unit replaced by its table; the adaptive map (what an output layer ties to) kept
    assert folded.adaptive is emb.adaptive and not hasattr(folded, "weight")
    torch.testing.assert_close(folded(tokens), expected.detach(), rtol=1e-5, atol=1e-5)


def masked_bands(emb, tokens):
    """The band-by-band formulation with a boolean mask per band (the host waits for each band's mask)."""
    out = tokens.new_zeros(tokens.shape + (emb.embedding_dim,), dtype=emb.tables[0].weight.dtype)
    start = 0
    for band, end in enumerate(emb.cutoff):
        mask = (tokens >= start) & (tokens < end)
        if mask.any():
            out[mask] = emb.projections[band](emb.tables[band](tokens[mask] - start))
        start = end
    return out


@pytest.mark.parametrize("high", [50, 10])  # every band, or band 0 alone (its table looked up directly)
@pytest.mark.parametrize("output_dim", [16, 12])  # band 0 unprojected, or projected
def test_sorted_bands_equal_the_masked_formulation_bit_for_bit(high, output_dim):
    """The bands' positions found by one stable sort (one host wait) give the same rows, in the same order, as a
    boolean mask per band: outputs and gradients equal to the last bit."""
    torch.manual_seed(0)
    emb = AdaptiveInput(50, 1, 16, [10, 30], factor=2, output_dim=output_dim)
    tokens = torch.randint(0, high, (4, 9), generator=torch.Generator().manual_seed(1))
    params = list(emb.parameters())
    out, expected = emb(tokens), masked_bands(emb, tokens)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad((out * weights).sum(), params, allow_unused=True)
    for a, b in zip(grads, torch.autograd.grad((expected * weights).sum(), params, allow_unused=True)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
