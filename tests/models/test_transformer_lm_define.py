"""transformer_lm_define through the real fairseq programs and in process."""

import re

import pytest
import torch
from arch_cases import CASES
from conftest import ADAM, USER_DIR, fairseq_train, needs_fairseq_eos_blocks, run_cli, setup_model

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.modules import DeFINEEmbedding

ARCHS = ["transformer_lm_define", "transformer_lm_define_wiki103"]


def parsed_model(data, arch, *flags):
    """``arch`` on its tiny case (the adaptive one with adaptive_loss)."""
    return setup_model(data, arch, *CASES[arch][1], "--ddp-backend", "legacy_ddp", *flags)


def perplexity(output: str) -> float:
    match = re.search(r"Loss \(base 2\): [\d.]+, Perplexity: ([\d.]+)", output)
    assert match, output[-2000:]
    return float(match.group(1))


@needs_fairseq_eos_blocks
@pytest.mark.parametrize(  # make test keeps the base arch; CI runs the WikiText-103 one once (make test-slow)
    "arch", [ARCHS[0], pytest.param(ARCHS[1], marks=pytest.mark.slow)]
)
def test_trains_scores_and_samples(lm_data, tmp_path, arch):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    flags = (*CASES[arch][1], "--ddp-backend", "legacy_ddp", *ADAM, "--max-tokens", "256", "--dropout", "0.0")
    fairseq_train(lm_data, tmp_path, arch, *flags, "--max-update", "30", task="language_modeling")
    out = run_cli(
        "fairseq-eval-lm",
        lm_data,
        "--user-dir",
        USER_DIR,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--cpu",
        "--max-tokens",
        "256",
        "--tokens-per-sample",
        "16",
        "--gen-subset",
        "test",
    )
    ppl = perplexity(out.stdout + out.stderr)
    assert 1.0 < ppl < 64  # better than uniform over the ~64 symbols after 30 updates
    lm = TransformerLanguageModel.from_pretrained(
        str(tmp_path), "checkpoint_last.pt", data_name_or_path=str(lm_data), user_dir=USER_DIR
    )
    sample = lm.sample("w2 w0", beam=2, max_len_b=8)
    assert sample.startswith("w2 w0") and len(sample.split()) > 2


@pytest.mark.parametrize("arch", ARCHS)
def test_input_and_output_work_in_n_dimensions(lm_data, arch):
    _, task, model = parsed_model(lm_data, arch)
    decoder = model.decoder
    assert isinstance(decoder.embed_tokens, DeFINEEmbedding) and decoder.embed_tokens.embedding_dim == 32
    assert decoder.project_out_dim.weight.shape == (16, 32) and decoder.project_out_dim.bias is None
    assert decoder.embed_scale in (None, 1.0)
    if arch == "transformer_lm_define":
        assert decoder.output_projection.weight is decoder.embed_tokens.weight  # tied to the V x n table
        assert decoder.embed_tokens.weight.shape == (len(task.dictionary), 16)
    else:
        head = decoder.adaptive_softmax.head.word_proj
        assert head.weight is decoder.embed_tokens.adaptive.tables[0].weight  # tied band 0, n = 16 wide
        for band, tail in enumerate(decoder.adaptive_softmax.tail, start=1):
            table, projection = decoder.embed_tokens.weights_for_band(band)
            assert tail[0].weight is projection and tail[2].weight is table  # tied band and projection


def closed_form_io(vocab, n, d, cutoff=None, factor=4):
    """Input/output parameters outside DeFINE: the map (table, or adaptive bands with projections of bands > 0,
    plus the adaptive softmax's cluster projection), and the d -> n output projection."""
    if cutoff is None:
        return vocab * n + d * n
    bounds = [0] + cutoff + [vocab]
    io = sum(
        (bounds[i + 1] - bounds[i]) * (n // factor**i) + (n * (n // factor**i) if i else 0)
        for i in range(len(bounds) - 1)
    )
    return io + len(cutoff) * n + d * n


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_count(lm_data, arch):
    from define_fairseq.tools.params import parameter_breakdown

    _, task, model = parsed_model(lm_data, arch)
    counts = parameter_breakdown(model)
    cutoff = [10, 30] if arch.endswith("wiki103") else None
    assert counts["input/output"] == closed_form_io(len(task.dictionary), 16, 32, cutoff)
    define_unit = model.decoder.embed_tokens.define
    assert counts["DeFINE"] == sum(p.numel() for p in define_unit.parameters())
    assert counts["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_equals_full_forward(lm_data, arch):
    _, task, model = parsed_model(lm_data, arch)
    model.eval()
    tokens = torch.randint(4, len(task.dictionary), (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model.get_normalized_probs(model(tokens), log_probs=True)
        state, steps = {}, []
        for t in range(tokens.shape[1]):
            out = model.decoder(tokens[:, : t + 1], incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_round_trip(lm_data, tmp_path, arch):
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    cfg, task, model = parsed_model(lm_data, arch, "--save-dir", str(tmp_path), "--no-save-optimizer-state")
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    path = str(tmp_path / "roundtrip.pt")
    trainer.save_checkpoint(path, {})
    (loaded,), _ = checkpoint_utils.load_model_ensemble([path])
    tokens = torch.randint(4, len(task.dictionary), (2, 7), generator=torch.Generator().manual_seed(1))
    _, _, other = parsed_model(lm_data, arch, "--seed", "7")
    with torch.no_grad():
        before, after, fresh = (
            m.eval().get_normalized_probs(m(tokens), log_probs=True) for m in (model, loaded, other)
        )
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert not torch.allclose(fresh, before)  # the comparison can fail


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--adaptive-softmax-cutoff", "10,30", "--tie-adaptive-weights"], "needs --adaptive-input"),
        (
            [
                "--adaptive-input",
                "--adaptive-input-cutoff",
                "10,30",
                "--adaptive-softmax-cutoff",
                "10,20",
                "--tie-adaptive-weights",
            ],
            "differs from --adaptive-input-cutoff",
        ),
        (["--adaptive-input", "--adaptive-input-cutoff", "10,300"], "below the vocabulary"),
        (["--adaptive-softmax-cutoff", "10,300"], "--adaptive-softmax-cutoff 10,300: the last cutoff"),
        (["--decoder-output-dim", "24"], "--decoder-output-dim=24"),
        (["--define-k", "8"], "--define-k"),
        (["--character-embeddings"], "--character-embeddings"),
    ],
)
def test_bad_configurations_name_the_flag(lm_data, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parsed_model(lm_data, "transformer_lm_define", *flags)


def test_arch_defaults(lm_data):
    from argparse import Namespace

    from define_fairseq.models.transformer_lm_define import transformer_lm_define_wiki103

    args = Namespace()
    transformer_lm_define_wiki103(args)
    assert (args.define_n, args.define_k, args.define_depth) == (256, 4096, 3)
    assert (args.decoder_layers, args.decoder_embed_dim, args.decoder_attention_heads) == (16, 1024, 8)
    assert args.adaptive_input and args.tie_adaptive_weights and args.tie_adaptive_proj
    assert args.adaptive_input_cutoff == args.adaptive_softmax_cutoff == "20000,60000"
