"""Transformer-XL against HuggingFace's: this project's layers, input layers and projected adaptive softmax, and the
``transformer_xl_lm`` model that fairseq-train builds from flags, with their weights copied into ``transformers``'
``TransfoXLLMHeadModel`` (4.35.2, the last release that has it; a test dependency, never one of the plugin).

What is compared: the last hidden states, the new memories (every layer's inputs kept for the next segment) and the
log-probabilities over the vocabulary, over two segments with the memory carried from the first to the second, in
eval mode and float64, to ``TOL = 1e-10`` (measured: at most 1.5e-14, float64 rounding of sums taken in another
order); and ``AdaptiveInput`` against HF's ``AdaptiveEmbedding`` (``div_val > 1``), word by word. Every weight is
random and non-trivial (biases, LayerNorm gains and shifts, the shared ``r_w`` / ``r_r`` biases all away from their
initial values), and the copy is complete both ways: every parameter of ours goes somewhere, and HF's
``load_state_dict(strict=True)`` gets every entry it has.

Options set so that both compute the same function (HF's config defaults are its WikiText-103 large model's):

- ``same_length=False``, ``clamp_len`` as ours (HF's defaults are True and 1000), ``untie_r=False`` (one ``r_w`` /
  ``r_r`` pair shared by the layers, as ours), no dropout;
- HF's first segment is given an empty memory (``[0, B, d]`` per layer): with ``mems=None`` HF starts from
  ``mem_len`` zero states that the first segment attends to, ours from none;
- the projections' tying: this project ties the softmax's *head* projection to the input projection and gives each
  tail cluster its own (the DeFINE paper's Table 2 counts need four matrices: examples/transformer_xl/README.md),
  where Transformer-XL's code ties the tails instead. HF's ``config.tie_projs`` takes either, and is set to ours;
- pre-norm: this project's pre-norm stack ends with a LayerNorm that Transformer-XL's ``pre_lnorm`` does not have
  (docs/models.md, examples/transformer_xl/README.md); the test applies that LayerNorm (ours) to HF's last hidden
  state before HF's softmax. The memories (layer inputs) do not go through it;
- HF keeps the sinusoids' frequencies as a float32 buffer computed at construction; it is given the same
  frequencies in float64, as ours computes them for a float64 model (float32 frequencies alone differ by 1e-8).

HF 4.35.2 cannot run a segment of more than one token in float64: it masks the attention scores through a float32
copy (``.float().masked_fill(finfo(float64).min)``), which raises an overflow error. So in float64 HF reads each
segment one token at a time (a one-token query masks nothing), its memory growing within the segment and cut to the
last ``mem_len`` states at the segment's end: exactly the segment-level recurrence that ours computes a segment at
a time. HF's own multi-token path (its causal and same-length masks, its memory update) is compared in float32,
to float32's tolerance. The DeFINE input layer has no counterpart in HF and is not compared.
"""

import math

import pytest
import torch
import torch.nn as nn
from arch_cases import TXL_TINY
from conftest import setup_model

from define_fairseq.modules.adaptive_input import AdaptiveInput
from define_fairseq.modules.projective_embedding import ProjectiveEmbedding
from define_fairseq.modules.transformer_xl.layers import TransformerXLStack
from define_fairseq.modules.transformer_xl.projected_adaptive_softmax import ProjectedAdaptiveSoftmax

pytest.importorskip("transformers", reason="transformers is not installed: pip install -r requirements-dev.txt")
from transformers import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLModel  # noqa: E402

# float64 against float64, the same operations in another order: a few roundings of 1e-16 at magnitudes up to 30
TOL = 1e-10
# float32 against float32 (HF's multi-token path): roundings of 6e-8 at magnitudes up to 30 (measured: 3e-6)
TOL_FLOAT32 = 3e-5
BATCH, SEGMENT, MEM_LEN = 3, 6, 4  # two segments of 6 tokens, a memory of 4: shorter than a segment, so it is cut
# the modules' sizes: V 60, d 16, 2 heads x 6 (H*dh != d), d_inner 24, 2 layers, V x 8 table, 3 clusters
VOCAB, D, HEADS, HEAD_DIM, D_INNER, LAYERS, N, CUTOFF = 60, 16, 2, 6, 24, 2, 8, [20, 40]


# -- this project's modules, random weights --------------------------------------------------------------------


def randomize_(module: nn.Module, seed: int = 1) -> nn.Module:
    """Give every parameter of ``module`` a random, non-trivial value: LayerNorm gains 1 + N(0, 0.2), every other
    vector (biases, LayerNorm shifts, the softmax's and clusters' biases) and ``r_w`` / ``r_r`` N(0, 0.3), matrices
    N(0, 1/width), so that activations, attention scores and log-probabilities are all of order 1 and more."""
    g = torch.Generator().manual_seed(seed)
    gains = {id(m.weight) for m in module.modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if id(p) in gains:
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1 or name.endswith(("r_w_bias", "r_r_bias")):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))
    return module


def our_modules(n=N, pre_norm=False, clamp_len=-1, same_length=False, dtype=torch.float64):
    """``(embed, stack, softmax)`` as ``transformer_xl_lm`` assembles them (models/transformer_xl_lm.py): the
    sqrt(d)-scaled V x n table and n -> d projection (a V x d table when n = d), the stack, the projected adaptive
    softmax tied to the table, its head cluster's projection tied to the input projection. Random weights, eval."""
    embed = ProjectiveEmbedding(VOCAB, n, D)
    stack = TransformerXLStack(
        LAYERS, D, HEADS, HEAD_DIM, D_INNER, dropout=0.0, pre_norm=pre_norm, mem_len=MEM_LEN, clamp_len=clamp_len,
        same_length=same_length,
    )  # fmt: skip
    projections = [embed.projection] + [None] * len(CUTOFF) if embed.projection is not None else None
    softmax = ProjectedAdaptiveSoftmax(VOCAB, n, D, CUTOFF, table=embed.weight, projections=projections)
    modules = nn.ModuleList([embed, stack, softmax]).to(dtype).eval()
    randomize_(modules)
    return embed, stack, softmax


def our_segments(embed, stack, softmax, segments):
    """``[(hidden [B, T, d], new memory (one [M, B, d] per layer), log-probabilities [B, T, V])]``, one per segment,
    the memory carried from each segment to the next."""
    memory, results = None, []
    with torch.no_grad():
        for segment in segments:
            hidden, memory = stack(embed(segment), memory)
            results.append((hidden, memory, softmax.get_log_prob(hidden)))
    return results


# -- the same weights in HuggingFace's model ---------------------------------------------------------------------


def hf_config(embed, stack, softmax, mem_len, same_length=False) -> TransfoXLConfig:
    """HF's config of the function that ``(embed, stack, softmax)`` compute (the module docstring says why each
    option is set)."""
    config = TransfoXLConfig(
        vocab_size=softmax.vocab_size,
        cutoffs=list(softmax.cutoff[:-1]),
        d_model=stack.d_model,
        d_embed=softmax.embed_dim,
        div_val=1,
        n_head=stack.num_heads,
        d_head=stack.head_dim,
        d_inner=stack.layers[0].feed_forward.fc1.out_features,
        n_layer=stack.num_layers,
        pre_lnorm=stack.pre_norm,
        mem_len=mem_len,
        clamp_len=stack.clamp_len,
        same_length=same_length,
        untie_r=False,
        dropout=0.0,
        dropatt=0.0,
        adaptive=True,
        tie_word_embeddings=True,
    )
    # this project's tying: the head cluster's projection is the input projection, each tail cluster has its own
    config.tie_projs = [True] + [False] * len(config.cutoffs)
    return config


def hf_state_dict(embed, stack, softmax) -> dict:
    """``TransfoXLLMHeadModel``'s state dict, every entry from this project's modules (tied entries twice)."""
    sd = {"transformer.word_emb.emb_layers.0.weight": embed.weight}
    if embed.projection is not None:
        sd["transformer.word_emb.emb_projs.0"] = embed.projection
    sd["transformer.r_w_bias"], sd["transformer.r_r_bias"] = stack.r_w_bias, stack.r_r_bias
    # the frequencies of our sinusoids, in float64 (HF computes its buffer in float32)
    half = torch.arange(0, stack.d_model, 2, dtype=torch.float64) / stack.d_model
    sd["transformer.pos_emb.inv_freq"] = 1.0 / 10000**half
    for i, layer in enumerate(stack.layers):
        attention, ff = layer.attention, layer.feed_forward
        names = {  # HF's name in layer i -> ours
            "dec_attn.r_w_bias": stack.r_w_bias,  # shared by the layers, in HF's state dict once per layer too
            "dec_attn.r_r_bias": stack.r_r_bias,
            "dec_attn.qkv_net.weight": attention.qkv.weight,  # [3*H*dh, d]: queries, keys, values
            "dec_attn.r_net.weight": attention.r_net.weight,
            "dec_attn.o_net.weight": attention.out.weight,
            "dec_attn.layer_norm.weight": attention.layer_norm.weight,
            "dec_attn.layer_norm.bias": attention.layer_norm.bias,
            "pos_ff.CoreNet.0.weight": ff.fc1.weight,
            "pos_ff.CoreNet.0.bias": ff.fc1.bias,
            "pos_ff.CoreNet.3.weight": ff.fc2.weight,
            "pos_ff.CoreNet.3.bias": ff.fc2.bias,
            "pos_ff.layer_norm.weight": ff.layer_norm.weight,
            "pos_ff.layer_norm.bias": ff.layer_norm.bias,
        }
        sd.update({f"transformer.layers.{i}.{name}": ours for name, ours in names.items()})
    sd["crit.out_layers.0.weight"], sd["crit.out_layers.0.bias"] = softmax.table, softmax.bias
    sd["crit.cluster_weight"], sd["crit.cluster_bias"] = softmax.cluster_weight, softmax.cluster_bias
    for c, projection in enumerate(softmax.projections):  # [d, n], applied as h @ P in both
        if projection is not None:
            sd[f"crit.out_projs.{c}"] = projection
    return sd


def hf_model(embed, stack, softmax, mem_len, same_length=False) -> TransfoXLLMHeadModel:
    """``TransfoXLLMHeadModel`` in eval mode and the dtype of ours, with our weights, tied as ours are."""
    dtype = embed.weight.dtype
    hf = TransfoXLLMHeadModel(hf_config(embed, stack, softmax, mem_len, same_length)).to(dtype).eval()
    sd = hf_state_dict(embed, stack, softmax)
    ours = {id(p) for module in (embed, stack, softmax) for p in module.parameters()}
    # pre-norm's final LayerNorm has no place in HF's model: the comparison applies ours to HF's output
    final_norm = set() if stack.final_norm is None else {id(p) for p in stack.final_norm.parameters()}
    assert ours - final_norm <= {id(t) for t in sd.values()}, "a parameter of ours has no place in HF's model"
    hf.load_state_dict({key: value.to(dtype) for key, value in sd.items()}, strict=True)
    crit, word_emb = hf.crit, hf.transformer.word_emb
    assert crit.out_layers[0].weight is word_emb.emb_layers[0].weight  # the softmax is tied to the table
    if embed.projection is not None:
        assert crit.out_projs[0] is word_emb.emb_projs[0]
        assert all(crit.out_projs[c] is not word_emb.emb_projs[0] for c in range(1, len(crit.out_projs)))
    return hf


def empty_memory(hf, batch, dtype):
    """One ``[0, B, d]`` memory per layer: HF's first segment attends to nothing before it, as ours."""
    return [torch.zeros(0, batch, hf.config.d_model, dtype=dtype) for _ in range(hf.config.n_layer)]


def hf_log_probs(hf, hidden, final_norm, scores):
    """HF's log-probabilities of ``hidden``: its own ``prediction_scores``, or with our pre-norm final LayerNorm
    (``final_norm``), HF's softmax ``crit`` over the normalised hidden states."""
    if final_norm is None:
        return hidden, scores
    hidden = final_norm(hidden)
    return hidden, hf.crit(hidden.reshape(-1, hidden.size(-1))).view(*hidden.shape[:2], -1)


def hf_one_token_at_a_time(hf, segments, mem_len, final_norm=None):
    """HF over ``segments``, one token per call (float64: see the module docstring); within a segment the memory
    grows by every token read, at its end it is cut to the last ``mem_len`` states, which the next segment starts
    from. Returns what :func:`our_segments` does."""
    seg_len = segments[0].size(1)
    assert hf.config.mem_len >= mem_len + seg_len, "HF would drop states within a segment"
    carried, results = empty_memory(hf, segments[0].size(0), torch.float64), []
    with torch.no_grad():
        for segment in segments:
            memory, hidden, scores = carried, [], []
            for t in range(segment.size(1)):
                out = hf(input_ids=segment[:, t : t + 1], mems=memory, output_hidden_states=True)
                memory = out.mems
                hidden.append(out.hidden_states[-1])  # the last layer's output
                scores.append(out.prediction_scores)
            carried = [m[-mem_len:] for m in memory]
            hidden, log_probs = hf_log_probs(hf, torch.cat(hidden, 1), final_norm, torch.cat(scores, 1))
            results.append((hidden, carried, log_probs))
    return results


def hf_segments(hf, segments, final_norm=None):
    """HF over ``segments``, a whole segment per call, its memory (``config.mem_len``) carried by HF."""
    memory, results = empty_memory(hf, segments[0].size(0), hf.dtype), []
    with torch.no_grad():
        for segment in segments:
            out = hf(input_ids=segment, mems=memory, output_hidden_states=True)
            memory = out.mems
            hidden, log_probs = hf_log_probs(hf, out.hidden_states[-1], final_norm, out.prediction_scores)
            results.append((hidden, memory, log_probs))
    return results


def max_differences(ours, theirs) -> dict:
    """The largest absolute difference of each output over both segments (memories: over every layer)."""
    worst = {"hidden": 0.0, "memory": 0.0, "log-probabilities": 0.0}
    for (h, m, lp), (h_hf, m_hf, lp_hf) in zip(ours, theirs):
        assert h.shape == h_hf.shape and lp.shape == lp_hf.shape and len(m) == len(m_hf)
        assert all(a.shape == b.shape for a, b in zip(m, m_hf))
        worst["hidden"] = max(worst["hidden"], (h - h_hf).abs().max().item())
        worst["memory"] = max([worst["memory"]] + [(a - b).abs().max().item() for a, b in zip(m, m_hf)])
        worst["log-probabilities"] = max(worst["log-probabilities"], (lp - lp_hf).abs().max().item())
    return worst


def two_segments(seed=2):
    """Two segments of random word ids covering all three clusters of the softmax."""
    tokens = torch.randint(0, VOCAB, (BATCH, 2 * SEGMENT), generator=torch.Generator().manual_seed(seed))
    return [tokens[:, :SEGMENT], tokens[:, SEGMENT:]]


# -- the modules --------------------------------------------------------------------------------------------------

MODULE_CASES = {
    "post-norm, projective input": dict(n=N),
    "pre-norm, projective input": dict(n=N, pre_norm=True),
    "post-norm, V x d table, clamp_len 3": dict(n=D, clamp_len=3),
}


@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_layers_embedding_and_softmax_equal_huggingface(case):
    """Our stack, projective or table input and tied projected adaptive softmax against ``TransfoXLLMHeadModel``
    with the same weights: hidden states, memories and log-probabilities of two segments, float64, to TOL."""
    embed, stack, softmax = our_modules(**MODULE_CASES[case])
    segments = two_segments()
    hf = hf_model(embed, stack, softmax, mem_len=MEM_LEN + SEGMENT)
    worst = max_differences(
        our_segments(embed, stack, softmax, segments),
        hf_one_token_at_a_time(hf, segments, MEM_LEN, final_norm=stack.final_norm),
    )
    assert max(worst.values()) <= TOL, worst


@pytest.mark.parametrize("same_length", [False, True], ids=["causal", "same_length"])
def test_whole_segments_equal_huggingface_in_float32(same_length):
    """HF's own multi-token path (its causal and same-length masks, ``clamp_len``, its memory update cutting to
    ``mem_len``) against ours, in float32, where HF can run it (module docstring), to float32's tolerance."""
    embed, stack, softmax = our_modules(pre_norm=False, clamp_len=3, same_length=same_length, dtype=torch.float32)
    segments = two_segments()
    hf = hf_model(embed, stack, softmax, mem_len=MEM_LEN, same_length=same_length)
    worst = max_differences(our_segments(embed, stack, softmax, segments), hf_segments(hf, segments))
    assert max(worst.values()) <= TOL_FLOAT32, worst


@pytest.mark.parametrize(
    "weight",
    ["r_r_bias", "layer_norm_gain"],
    ids=["one r_r_bias entry", "one LayerNorm gain"],
)
def test_one_perturbed_weight_fails_the_comparison(weight):
    """The comparison sees one weight: changing one entry of HF's shared ``r_r_bias``, or one gain of its first
    layer's feed-forward LayerNorm, by 1e-3 moves the outputs by more than 1e5 times TOL."""
    embed, stack, softmax = our_modules()
    segments = two_segments()
    hf = hf_model(embed, stack, softmax, mem_len=MEM_LEN + SEGMENT)
    with torch.no_grad():
        if weight == "r_r_bias":
            hf.transformer.r_r_bias[1, 2] += 1e-3
        else:
            hf.transformer.layers[0].pos_ff.layer_norm.weight[3] += 1e-3
    worst = max_differences(
        our_segments(embed, stack, softmax, segments), hf_one_token_at_a_time(hf, segments, MEM_LEN)
    )
    assert worst["hidden"] > 1e5 * TOL and worst["log-probabilities"] > 1e5 * TOL, worst


@pytest.mark.parametrize("d_model", [16, 12], ids=["band 0 unprojected", "every band projected"])
def test_adaptive_input_equals_huggingface_adaptive_embedding(d_model):
    """``AdaptiveInput`` (bands of width 16 / 2^i, each projected to d_model) against HF's ``AdaptiveEmbedding``
    with ``div_val = 2`` and the same tables and projections, for every word: HF's output is sqrt(d_model) times
    ours (ours applies no scale; the families that use it scale it or not). Where our band 0 has no projection
    (its width is d_model), HF's is the identity. float64, to TOL."""
    ours = AdaptiveInput(VOCAB, None, 16, CUTOFF, factor=2, output_dim=d_model).double()
    randomize_(ours)
    config = TransfoXLConfig(
        vocab_size=VOCAB, cutoffs=list(CUTOFF), d_model=d_model, d_embed=16, div_val=2, n_head=2, d_head=6,
        d_inner=8, n_layer=1, dropout=0.0, dropatt=0.0,
    )  # fmt: skip
    hf = TransfoXLModel(config).double().eval().get_input_embeddings()
    sd = {}
    for band in range(len(ours.cutoff)):
        table, projection = ours.weights_for_band(band)
        sd[f"emb_layers.{band}.weight"] = table
        sd[f"emb_projs.{band}"] = torch.eye(d_model, dtype=torch.float64) if projection is None else projection
    hf.load_state_dict(sd, strict=True)
    words = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3)).view(3, -1)  # every word, shuffled
    with torch.no_grad():
        difference = (hf(words) - math.sqrt(d_model) * ours(words)).abs().max().item()
    assert difference <= TOL


# -- the model fairseq-train builds -------------------------------------------------------------------------------

BUILT_CASES = {
    "table": [],
    "projective": ["--input-layer", "projective"],
    "projective, pre-norm": ["--input-layer", "projective", "--txl-pre-norm"],
}


@pytest.mark.parametrize("case", list(BUILT_CASES))
def test_the_model_fairseq_train_builds_equals_huggingface(lm_data, case):
    """``transformer_xl_lm`` built from flags (tiny sizes: d 16, 2 heads x 6, 2 layers, cutoffs 20,40, memory 4)
    on the toy corpus' dictionary, its weights random and mapped into HF's: what its decoder returns over two
    segments under the stateful task (the memory carried by the model, its keys and values kept with it in eval
    mode), the kept memory and ``get_normalized_probs``, against HF, float64, to TOL."""
    flags = [*TXL_TINY, "--dropout", "0.0", "--txl-mem-len", str(MEM_LEN), "--batch-size", str(BATCH)]
    _, task, model = setup_model(lm_data, "transformer_xl_lm", *flags, *BUILT_CASES[case], task="stateful_lm")
    model = randomize_(model.double().eval())
    decoder = model.decoder
    embed, stack, softmax = decoder.embed_tokens, decoder.stack, decoder.adaptive_softmax
    assert {id(p) for p in model.parameters()} == {
        id(p) for module in (embed, stack, softmax) for p in module.parameters()
    }  # the three modules are the whole model, so mapping them maps all of it
    vocab = len(task.target_dictionary)
    tokens = torch.randint(4, vocab, (BATCH, 2 * SEGMENT), generator=torch.Generator().manual_seed(4))
    segments = [tokens[:, :SEGMENT], tokens[:, SEGMENT:]]
    ours = []
    with torch.no_grad():
        for k, segment in enumerate(segments):
            net_output = model(segment, reset_state=k == 0)
            log_probs = model.get_normalized_probs(net_output, log_probs=True)
            ours.append((net_output[0], decoder.memory.kept_state(False)["memory"], log_probs))
    hf = hf_model(embed, stack, softmax, mem_len=MEM_LEN + SEGMENT)
    worst = max_differences(ours, hf_one_token_at_a_time(hf, segments, MEM_LEN, final_norm=stack.final_norm))
    assert max(worst.values()) <= TOL, worst
