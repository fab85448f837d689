"""The projected adaptive softmax (log-probabilities, loss and gradients against the definition, ties, cutoffs,
half precision) and the projective embedding of Transformer-XL, with their parameter counts."""

import math

import pytest
import torch
import torch.nn.functional as F

from define_fairseq.modules import ProjectedAdaptiveSoftmax, ProjectiveEmbedding
from define_fairseq.modules.transformer_xl import projected_adaptive_softmax

WT103_VOCAB = 267735
WT103_CUTOFF = [20000, 40000, 200000]


def count(*modules):
    """Parameters of the modules together, a shared Parameter counted once."""
    seen = {}
    for module in modules:
        for p in module.parameters():
            seen[id(p)] = p
    return sum(p.numel() for p in seen.values())


# --------------------------------------------------------------------------------------------------------------
# projected adaptive softmax


def small_softmax(n=6, d=5, **kwargs):
    torch.manual_seed(0)
    sm = ProjectedAdaptiveSoftmax(20, n, d, [4, 9, 15], **kwargs).double()
    with torch.no_grad():
        for p in sm.parameters():
            p.normal_(0.0, 0.5)
    return sm.eval()


@pytest.mark.parametrize("n,d", [(6, 5), (5, 5)])
def test_log_prob_normalises_and_matches_the_definition(n, d):
    sm = small_softmax(n, d)
    h = torch.randn(2, 3, d, dtype=torch.float64)
    lp = sm.get_log_prob(h)
    assert lp.shape == (2, 3, 20)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2, 3, dtype=torch.float64))
    flat = h.view(-1, d)
    proj = [torch.eye(d, dtype=torch.float64) if p is None else p for p in sm.projections]
    head = torch.cat(
        [flat @ proj[0] @ sm.table[:4].T + sm.bias[:4], flat @ proj[0] @ sm.cluster_weight.T + sm.cluster_bias], -1
    ).log_softmax(-1)
    bounds = [0, 4, 9, 15, 20]
    for w in [0, 3, 4, 8, 9, 14, 15, 19]:
        c = next(i for i in range(4) if bounds[i] <= w < bounds[i + 1])
        if c == 0:
            expected = head[:, w]
        else:
            lo, hi = bounds[c], bounds[c + 1]
            within = (flat @ proj[c] @ sm.table[lo:hi].T + sm.bias[lo:hi]).log_softmax(-1)
            expected = head[:, 4 + c - 1] + within[:, w - lo]
        torch.testing.assert_close(lp.view(-1, 20)[:, w], expected)


def test_forward_targets_give_the_same_loss_as_get_log_prob():
    sm = small_softmax()
    h = torch.randn(3, 7, 5, dtype=torch.float64)
    target = torch.tensor([[0, 1, 3, 4, 8, 9, 19], [2, 2, 3, 1, 0, 5, 6], [15, 16, 1, 0, 3, 2, 9]])
    logits, targets = sm(h, target)
    assert len(logits) == len(targets) == 4
    assert logits[0].shape == (21, 4 + 3)
    assert targets[0].view(3, 7)[0].tolist() == [0, 1, 3, 4, 4, 5, 6]
    assert targets[1].tolist() == [0, 4, 1, 2] and logits[1].shape == (4, 5)
    assert targets[2].tolist() == [0, 0] and logits[2].shape == (2, 6)
    assert targets[3].tolist() == [4, 0, 1] and logits[3].shape == (3, 5)
    loss = sum(F.cross_entropy(lg, tg, reduction="sum") for lg, tg in zip(logits, targets))
    expected = -sm.get_log_prob(h).gather(-1, target.unsqueeze(-1)).sum()
    torch.testing.assert_close(loss, expected)
    logits, targets = sm(h[0, :3], target[0, :3])  # only head words: no tail rows
    assert logits[1:] == [None, None, None] and targets[1:] == [None, None, None]


def rows_per_cluster(sm, h, target):
    """The forward with each tail cluster's rows selected by ``nonzero()`` (the host waits once per cluster)."""
    h, target = h.reshape(-1, h.size(-1)), target.reshape(-1)
    c0 = sm.cutoff[0]
    tables, biases = sm._cluster_words()
    logits, head_target = [sm._head_logits(h, tables[0], biases[0])], target.clone()
    targets = [head_target]
    for c in range(1, sm.num_clusters):
        lo, hi = sm.cutoff[c - 1], sm.cutoff[c]
        rows = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
        if rows.numel() == 0:
            logits.append(None)
            targets.append(None)
            continue
        head_target[rows] = c0 + c - 1
        logits.append(sm._cluster_logits(h[rows], c, tables[c], biases[c]))
        targets.append(target[rows] - lo)
    return logits, targets


@pytest.mark.parametrize("rows", [21, 3])  # every cluster, or head words alone
def test_clusters_sorted_once_equal_rows_selected_per_cluster_bit_for_bit(rows):
    """One stable sort of the rows by cluster (one host wait for all clusters' sizes) selects the same rows in the
    same order as ``nonzero()`` per cluster: logits, targets and gradients equal to the last bit."""
    sm = small_softmax()
    h = torch.randn(21, 5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 1, 3, 4, 8, 9, 19, 2, 2, 3, 1, 0, 5, 6, 15, 16, 1, 0, 3, 2, 9])
    h, target = h[:rows], target[:rows]
    params = [h, *sm.parameters()]
    results = []
    for logits, targets in (sm(h, target), rows_per_cluster(sm, h, target)):
        assert [t is None for t in targets] == [lg is None for lg in logits]
        kept = [(lg, tg) for lg, tg in zip(logits, targets) if lg is not None]
        loss = sum(F.cross_entropy(lg, tg, reduction="sum") for lg, tg in kept)
        results.append((kept, torch.autograd.grad(loss, params, allow_unused=True)))
    (kept, grads), (kept_ref, grads_ref) = results
    assert len(kept) == len(kept_ref) == (4 if rows == 21 else 1)
    for (lg, tg), (lg_ref, tg_ref) in zip(kept, kept_ref):
        assert torch.equal(lg, lg_ref) and torch.equal(tg, tg_ref)
    for a, b in zip(grads, grads_ref):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_static_shapes_score_every_row_and_ignore_the_rows_of_other_clusters():
    sm = small_softmax(static_shapes=True, ignore_index=-7)
    h = torch.randn(3, 7, 5, dtype=torch.float64)
    target = torch.tensor([[0, 1, 3, 4, 8, 9, 19], [2, 2, 3, 1, 0, 5, 6], [15, 16, 1, 0, 3, 2, 9]])
    logits, targets = sm(h, target)
    assert [lg.shape for lg in logits] == [(21, 7), (21, 5), (21, 6), (21, 5)]
    assert targets[0].view(3, 7)[0].tolist() == [0, 1, 3, 4, 4, 5, 6]
    assert targets[2].view(3, 7).tolist() == [[-7, -7, -7, -7, -7, 0, -7], [-7] * 7, [-7, -7, -7, -7, -7, -7, 0]]
    loss = sum(F.cross_entropy(lg, tg, ignore_index=-7, reduction="sum") for lg, tg in zip(logits, targets))
    torch.testing.assert_close(loss, -sm.get_log_prob(h).gather(-1, target.unsqueeze(-1)).sum())


def reference_log_prob(sm, flat):
    """``[N, 20]`` log-probabilities of ``small_softmax`` written out from the definition, slice by slice."""
    proj = [torch.eye(flat.size(1), dtype=flat.dtype) if p is None else p for p in sm.projections]
    head = torch.cat(
        [flat @ proj[0] @ sm.table[:4].T + sm.bias[:4], flat @ proj[0] @ sm.cluster_weight.T + sm.cluster_bias], -1
    ).log_softmax(-1)
    bounds = [0, 4, 9, 15, 20]
    columns = [head[:, :4]]
    for c in range(1, 4):
        lo, hi = bounds[c], bounds[c + 1]
        columns.append(
            head[:, 4 + c - 1 : 4 + c] + (flat @ proj[c] @ sm.table[lo:hi].T + sm.bias[lo:hi]).log_softmax(-1)
        )
    return torch.cat(columns, -1)


@pytest.mark.parametrize(
    "target",
    [
        [[0, 1, 3, 4, 8, 9, 19], [2, 2, 3, 1, 0, 5, 6], [15, 16, 1, 0, 3, 2, 9]],
        [[0, 1, 3, 4, 8, 19, 19], [2, 2, 3, 1, 0, 5, 6], [15, 16, 1, 0, 3, 2, 4]],
    ],
)
@pytest.mark.parametrize("static_shapes", [False, True])
def test_training_loss_gradients_match_the_definition(target, static_shapes):
    """Every parameter's gradient through the training path (the table as well, used as the input embedding
    too, as when tied), also when a cluster has no target (the second case has none in cluster 2), with the rows
    of each cluster selected and with ``static_shapes`` (every row scored against every cluster)."""
    sm = small_softmax(static_shapes=static_shapes).train()
    h = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor(target)
    tokens = torch.tensor([1, 7, 7, 12, 18])
    params = [h, *sm.parameters()]

    def with_embedding(loss):
        return loss + (sm.table[tokens] ** 2).sum()

    logits, targets = sm(h, target)
    loss = sum(F.cross_entropy(lg, tg, reduction="sum") for lg, tg in zip(logits, targets) if lg is not None)
    expected = -reference_log_prob(sm, h.view(-1, 5)).gather(-1, target.view(-1, 1)).sum()
    torch.testing.assert_close(loss, expected)
    for p, got, want in zip(
        params,
        torch.autograd.grad(with_embedding(loss), params, allow_unused=True),
        torch.autograd.grad(with_embedding(expected), params),
    ):
        torch.testing.assert_close(torch.zeros_like(p) if got is None else got, want)  # None: a cluster unused
    lprobs = sm.get_log_prob(h)  # the autograd path of the full log-probabilities
    weights = torch.randn_like(lprobs)
    for got, want in zip(
        torch.autograd.grad((lprobs * weights).sum(), params),
        torch.autograd.grad((reference_log_prob(sm, h.view(-1, 5)).view_as(lprobs) * weights).sum(), params),
    ):
        torch.testing.assert_close(got, want)


def test_ties_and_parameter_sharing():
    emb = ProjectiveEmbedding(20, 6, 5, padding_idx=1)
    shared = torch.nn.Parameter(torch.randn(5, 6))
    sm = ProjectedAdaptiveSoftmax(
        20, 6, 5, [4, 9, 15], table=emb.weight, projections=[emb.projection, None, shared, shared]
    )
    assert sm.table is emb.weight and sm.projections[0] is emb.projection
    assert sm.projections[2] is sm.projections[3] is shared
    assert sm.projections[1] is not None and sm.projections[1] is not emb.projection
    own = [p for p in sm.parameters()]
    assert sum(p is shared for p in own) == 1 and len(own) == len({id(p) for p in own})
    assert count(emb, sm) == 20 * 6 + 5 * 6 + 20 + 3 * 6 + 3 + 5 * 6 + 5 * 6
    assert "table" in sm.state_dict() and "projection_0" in sm.state_dict()
    # the tie holds through training steps
    out = sm.get_log_prob(emb(torch.tensor([[2, 3]])))
    out.sum().backward()
    assert emb.weight.grad is not None and emb.projection.grad is not None


def test_no_projection_when_widths_match():
    sm = ProjectedAdaptiveSoftmax(20, 5, 5, [4, 9, 15])
    assert sm.projections == [None] * 4
    assert count(sm) == 20 * 5 + 20 + 3 * 5 + 3
    assert not any("projection" in name for name, _ in sm.named_parameters())
    sm = ProjectedAdaptiveSoftmax(20, 6, 5, [4, 9, 15])
    assert all(p.shape == (5, 6) for p in sm.projections)
    assert len({id(p) for p in sm.projections}) == 4


def test_cutoff_handling_and_errors():
    sm = ProjectedAdaptiveSoftmax(1000, 4, 4, [100, 500])
    assert sm.cutoff == [100, 500, 1000] and sm.vocab_size == 1000 and sm.embed_dim == 4 and sm.input_dim == 4
    assert ProjectedAdaptiveSoftmax(1000, 4, 4, [100, 500, 1000]).cutoff == [100, 500, 1000]
    with pytest.raises(ValueError, match="cutoff 200000 is beyond the vocabulary of 1000 words"):
        ProjectedAdaptiveSoftmax(1000, 4, 4, [100, 200000])
    with pytest.raises(ValueError, match="cutoff.*increasing.*1000"):
        ProjectedAdaptiveSoftmax(1000, 4, 4, [500, 100])
    with pytest.raises(ValueError, match="cutoff"):
        ProjectedAdaptiveSoftmax(1000, 4, 4, [0, 100])
    with pytest.raises(ValueError, match="projections"):
        ProjectedAdaptiveSoftmax(1000, 4, 4, [100], projections=[None])
    with pytest.raises(ValueError, match=r"projections\[1\]"):
        ProjectedAdaptiveSoftmax(1000, 4, 5, [100], projections=[None, torch.nn.Parameter(torch.zeros(4, 5))])
    with pytest.raises(ValueError, match="table"):
        ProjectedAdaptiveSoftmax(1000, 4, 4, [100], table=torch.nn.Parameter(torch.zeros(999, 4)))


def test_softmax_dropout_only_in_training():
    sm = small_softmax(dropout=0.5)
    h = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(sm.get_log_prob(h), sm.get_log_prob(h))
    sm.train()
    assert not torch.equal(sm.get_log_prob(h), sm.get_log_prob(h))


@pytest.mark.parametrize("n,expected", [(384, 103_079_130), (410, 110_040_318)])
def test_standard_softmax_parameter_counts(n, expected):
    with torch.device("meta"):
        sm = ProjectedAdaptiveSoftmax(WT103_VOCAB, n, n, WT103_CUTOFF)
    assert count(sm) == WT103_VOCAB * n + WT103_VOCAB + 3 * n + 3 == expected


# --------------------------------------------------------------------------------------------------------------
# projective embedding


def test_projective_embedding_output():
    torch.manual_seed(0)
    emb = ProjectiveEmbedding(30, 6, 10, padding_idx=1)
    tokens = torch.tensor([[1, 5, 29], [0, 5, 7]])
    assert emb.weight.shape == (30, 6) and emb.projection.shape == (10, 6)
    assert emb.embedding_dim == 10 and emb.table_dim == 6 and emb.num_embeddings == 30 and emb.padding_idx == 1
    assert emb.scale == math.sqrt(10)
    torch.testing.assert_close(emb(tokens), emb.scale * emb.weight[tokens] @ emb.projection.T)
    assert torch.count_nonzero(emb.weight[1]) > 0  # no zeroed padding row
    assert abs(emb.weight.std().item() - 0.02) < 0.005
    square = ProjectiveEmbedding(30, 10, 10)
    assert square.projection is None and count(square) == 300
    torch.testing.assert_close(square(tokens), math.sqrt(10) * square.weight[tokens])
    with pytest.raises(ValueError, match="padding_idx"):
        ProjectiveEmbedding(30, 6, 10, padding_idx=30)


@pytest.mark.parametrize("n,millions", [(64, 17.50), (128, 34.73), (256, 69.20)])
def test_projective_io_parameter_count(n, millions):
    with torch.device("meta"):
        emb = ProjectiveEmbedding(WT103_VOCAB, n, 384)
        sm = ProjectedAdaptiveSoftmax(
            WT103_VOCAB, n, 384, WT103_CUTOFF, table=emb.weight, projections=[emb.projection, None, None, None]
        )
    total = count(emb, sm)
    assert total == WT103_VOCAB * n + WT103_VOCAB + 4 * n * 384 + 3 * n + 3
    assert round(total / 1e6, 2) == millions


def test_half_precision_log_probs_are_float32_and_close_to_float32_ones():
    """get_log_prob normalises half-precision input in float32 and returns float32 (rounding log-probabilities
    of about -10 to bfloat16 would move them by up to 0.03)."""
    torch.manual_seed(0)
    sm = ProjectedAdaptiveSoftmax(300, 8, 12, [50, 120]).eval()
    h = torch.randn(2, 5, 12)
    with torch.no_grad():
        reference = sm.get_log_prob(h)
        half = sm.to(torch.bfloat16).get_log_prob(h.bfloat16())
    assert reference.dtype == half.dtype == torch.float32
    torch.testing.assert_close(half.exp().sum(-1), torch.ones(2, 5), rtol=0, atol=1e-5)
    assert (half - reference).abs().max() < 0.1  # bf16 weights and input, float32 normalisation


@pytest.mark.parametrize("cache_bytes", [1 << 20, 1])
def test_log_prob_without_autograd_equals_the_autograd_path(monkeypatch, cache_bytes):
    """Without autograd each cluster is computed inside its block of the result (addmm, then x - (logsumexp(x) -
    prior) a few rows at a time); with autograd through temporaries. Both give the same numbers, also when
    every chunk is one row per thread (``cache_bytes=1``)."""
    monkeypatch.setattr(projected_adaptive_softmax, "_CACHE_BYTES_PER_THREAD", cache_bytes)
    torch.manual_seed(0)
    sm = ProjectedAdaptiveSoftmax(3000, 16, 24, [200, 700, 2000]).eval()
    h = torch.randn(2, 7, 24)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one row per chunk with cache_bytes=1, whatever the machine's core count
    try:
        with torch.no_grad():
            fast = sm.get_log_prob(h)
    finally:
        torch.set_num_threads(threads)
    reference = sm.get_log_prob(h)
    assert reference.requires_grad and not fast.requires_grad
    # Values near -10 in float32: one or two units in the last place apart at most.
    torch.testing.assert_close(fast, reference.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast.exp().sum(-1), torch.ones(2, 7))
