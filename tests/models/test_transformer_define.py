"""transformer_define through the real fairseq programs and in process."""

import re

import pytest
import torch
from arch_cases import TRANSFORMER, TRANSLATION as TINY_MODEL
from conftest import TRAIN_FLAGS, USER_DIR, fairseq_train, run_cli, run_module, setup_model
from lm_helpers import generate, hypotheses

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.modules import DeFINE, DeFINEEmbedding, FoldedDeFINEEmbedding
from define_fairseq.tools.params import parameter_breakdown


def train(data, save_dir, *extra, arch="transformer_define_iwslt_de_en", updates=20):
    model = TINY_MODEL if "define" in arch else TRANSFORMER  # the stock arch has no --define-* flags
    fairseq_train(data, save_dir, arch, *model, *TRAIN_FLAGS, "--max-update", updates, *extra)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def trained(translation_data, tmp_path_factory):
    """One checkpoint with --share-all-embeddings, trained through fairseq-train."""
    return train(translation_data, tmp_path_factory.mktemp("ckpt"), "--share-all-embeddings", updates=60)


@pytest.fixture(scope="module")
def generated(translation_data, trained):
    """fairseq-generate's output for the module's checkpoint."""
    return generate(translation_data, trained, full_output=True)


@pytest.fixture(scope="module")
def folded(trained, tmp_path_factory):
    """The module's checkpoint folded by define_fairseq.tools.fold_define."""
    path = tmp_path_factory.mktemp("folded") / "folded.pt"
    run_module("define_fairseq.tools.fold_define", trained, path)
    return path


def check_generates_every_test_sentence(out):
    assert re.search(r"^Generate test with beam=3: BLEU4 = [\d.]+", out, re.M)
    assert len([h for h in hypotheses(out) if h.startswith("H-")]) == 20


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("transformer_define", []),
        pytest.param(
            "transformer_define_wmt_en_de_big",
            ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"],
            marks=pytest.mark.slow,  # the base arch's run with other defaults: make test-slow
        ),
    ],
)
def test_each_arch_trains_and_generates(translation_data, tmp_path, arch, extra):
    checkpoint = train(translation_data, tmp_path, *extra, arch=arch, updates=5)
    check_generates_every_test_sentence(generate(translation_data, checkpoint, full_output=True))


def test_the_iwslt_arch_with_shared_embeddings_trains_and_generates(generated):
    """transformer_define_iwslt_de_en, the module's checkpoint."""
    check_generates_every_test_sentence(generated)


def parsed_model(data, arch, *flags):
    return setup_model(data, arch, *flags, task="translation")


BASE = dict(encoder_embed_dim=512, encoder_layers=6, define_n=128, define_k=1024, define_depth=3, define_max_groups=4)
BIG = dict(encoder_embed_dim=1024, encoder_attention_heads=16, define_n=128, define_k=1024)
IWSLT = dict(encoder_embed_dim=512, encoder_ffn_embed_dim=1024, encoder_attention_heads=4, define_n=64, define_k=512)


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("transformer_define", BASE),
        ("transformer_define_wmt_en_de_big", BIG),
        ("transformer_define_iwslt_de_en", IWSLT),
    ],
)
def test_arch_defaults(translation_data, arch, expected):
    with torch.device("meta"):  # sizes only: no memory, no initialisation
        cfg, _, model = parsed_model(translation_data, arch)
    for key, value in expected.items():
        assert getattr(cfg.model, key) == value, key
    embed = model.encoder.embed_tokens
    assert isinstance(embed, DeFINEEmbedding)
    assert embed.weight.shape[1] == expected["define_n"]
    assert embed.embedding_dim == expected["encoder_embed_dim"]


def test_output_tied_to_n_dimensional_table(translation_data):
    _, _, model = parsed_model(translation_data, "transformer_define", "--share-all-embeddings")
    embed = model.decoder.embed_tokens
    assert model.encoder.embed_tokens is embed
    assert model.decoder.output_projection.weight is embed.weight  # V x n
    assert embed.weight.shape[1] == 128
    assert tuple(model.decoder.project_out_dim.weight.shape) == (128, 512)  # d_model -> n


@pytest.mark.parametrize("arch", ["transformer_define", "transformer_define_iwslt_de_en"])
@pytest.mark.parametrize("flags", [[], ["--share-decoder-input-output-embed"], ["--no-scale-embedding"]])
def test_decoder_output_tied_and_unscaled_by_default(translation_data, arch, flags):
    _, _, model = parsed_model(translation_data, arch, "--define-n", "32", *flags)
    assert model.encoder.embed_tokens is not model.decoder.embed_tokens
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert model.decoder.output_projection.weight.shape[1] == 32
    assert model.decoder.embed_scale == 1.0 and model.encoder.embed_scale == 1.0


def test_untied_output(translation_data):
    _, task, model = parsed_model(translation_data, "transformer_define", "--define-untie-output")
    assert model.decoder.project_out_dim is None
    assert tuple(model.decoder.output_projection.weight.shape) == (len(task.target_dictionary), 512)


def test_shared_input_with_untied_output(translation_data):
    # --share-all-embeddings shares the DeFINE embedding; --define-untie-output gives the decoder its own V x d layer
    _, task, model = parsed_model(
        translation_data, "transformer_define", "--share-all-embeddings", "--define-untie-output"
    )
    embed = model.encoder.embed_tokens
    assert model.decoder.embed_tokens is embed and isinstance(embed, DeFINEEmbedding)
    assert model.decoder.project_out_dim is None
    output = model.decoder.output_projection.weight
    assert tuple(output.shape) == (len(task.target_dictionary), 512)
    assert all(output is not p for p in embed.parameters())


def test_shared_input_with_untied_output_trains_and_generates(translation_data, tmp_path):
    checkpoint = train(translation_data, tmp_path, "--share-all-embeddings", "--define-untie-output", updates=5)
    assert len([h for h in generate(translation_data, checkpoint) if h.startswith("H-")]) == 20


@pytest.mark.parametrize("variant", ["define", "delight"])
def test_separate_units_share_only_the_table(translation_data, variant):
    # --define-separate-units: one V x n table (input of both sides and the tied output), a DeFINE unit per side
    common = ("transformer_define", "--define-variant", variant, "--share-all-embeddings")
    _, _, shared = parsed_model(translation_data, *common)
    _, _, model = parsed_model(translation_data, *common, "--define-separate-units")
    encoder, decoder = model.encoder.embed_tokens, model.decoder.embed_tokens
    assert encoder is not decoder and encoder.table is decoder.table
    assert model.decoder.output_projection.weight is encoder.weight
    encoder_unit = {id(p) for p in encoder.define.parameters()}
    assert encoder_unit.isdisjoint(id(p) for p in decoder.define.parameters())
    unit = sum(p.numel() for p in decoder.define.parameters())
    assert parameter_breakdown(model)["total"] == parameter_breakdown(shared)["total"] + unit
    tokens = torch.tensor([[4, 5, 6]])
    assert not torch.allclose(encoder(tokens), decoder(tokens))  # two units, drawn apart at initialisation


def test_separate_units_need_shared_embeddings(translation_data):
    with pytest.raises(ValueError, match="--define-separate-units.*--share-all-embeddings"):
        parsed_model(translation_data, "transformer_define", "--define-separate-units")


def test_separate_units_train_generate_and_fold(translation_data, tmp_path):
    checkpoint = train(translation_data, tmp_path, "--share-all-embeddings", "--define-separate-units", updates=5)
    original = generate(translation_data, checkpoint)
    assert len([h for h in original if h.startswith("H-")]) == 20
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    assert torch.equal(state["encoder.embed_tokens.table.weight"], state["decoder.embed_tokens.table.weight"])
    assert not torch.equal(
        state["encoder.embed_tokens.define.layers.0.weight"], state["decoder.embed_tokens.define.layers.0.weight"]
    )
    folded = tmp_path / "folded.pt"
    run_module("define_fairseq.tools.fold_define", checkpoint, folded)
    assert generate(translation_data, folded) == original


@pytest.mark.parametrize("variant,activation", [("define", "gelu"), ("projective", "gelu"), ("delight", "swish")])
def test_each_variant_builds_with_its_default_activation(translation_data, variant, activation):
    _, _, model = parsed_model(
        translation_data, "transformer_define", "--define-variant", variant, "--share-all-embeddings"
    )
    unit = model.encoder.embed_tokens.define
    assert unit.variant == variant and unit.activation == activation
    assert unit(torch.randn(2, 128)).shape == (2, 512)


def sample_batch(vocab, batch=3, src_len=7, tgt_len=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    prev = torch.randint(4, vocab, (batch, tgt_len), generator=g)
    prev[:, 0] = 2  # eos starts the decoder input
    return src, torch.full((batch,), src_len), prev


ARCHS = ["transformer_define", "transformer_define_wmt_en_de_big", "transformer_define_iwslt_de_en"]


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_equals_full_forward(translation_data, arch):
    _, task, model = parsed_model(translation_data, arch, *TINY_MODEL)
    model.eval()
    src, lengths, prev = sample_batch(len(task.target_dictionary))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        full = model.decoder(prev, encoder_out=encoder_out)[0]
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0]
            for t in range(prev.shape[1])
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_round_trip(translation_data, tmp_path, arch):
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    shared = (*TINY_MODEL, "--share-all-embeddings")
    cfg, task, model = parsed_model(
        translation_data, arch, *shared, "--save-dir", tmp_path, "--no-save-optimizer-state"
    )
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    path = str(tmp_path / "roundtrip.pt")
    trainer.save_checkpoint(path, {})
    (loaded,), _ = checkpoint_utils.load_model_ensemble([path])
    src, lengths, prev = sample_batch(len(task.target_dictionary))
    model.eval()
    loaded.eval()
    with torch.no_grad():
        before = model(src, lengths, prev)[0]
        after = loaded(src, lengths, prev)[0]
        _, _, fresh = parsed_model(translation_data, arch, *shared, "--seed", "7")
        other = fresh.eval()(src, lengths, prev)[0]
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert not torch.allclose(other, before)  # the comparison can fail
    assert loaded.encoder.embed_tokens is loaded.decoder.embed_tokens


def test_folded_checkpoint_generates_identically(translation_data, generated, folded):
    original = hypotheses(generated)
    assert len(original) == 40  # an H and a P line for each of the 20 test sentences
    assert generate(translation_data, folded) == original
    state = torch.load(folded, map_location="cpu", weights_only=False)
    assert not any(".define." in key for key in state["model"])
    assert any(key.endswith("embed_tokens.folded") for key in state["model"])
    assert state["cfg"]["model"]["define_folded"] is True


def test_folded_model_matches_in_eval_mode(translation_data):
    from define_fairseq.tools.fold_define import fold_model

    _, task, model = parsed_model(
        translation_data, "transformer_define_iwslt_de_en", *TINY_MODEL, "--share-all-embeddings"
    )
    model.eval()
    src, lengths, prev = sample_batch(len(task.target_dictionary))
    with torch.enable_grad():  # the DeFINE path proper, not the eval-mode table
        reference = model(src, lengths, prev)[0].detach()
    fold_model(model)
    assert isinstance(model.encoder.embed_tokens, FoldedDeFINEEmbedding)
    assert model.encoder.embed_tokens is model.decoder.embed_tokens
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert not any(isinstance(m, DeFINE) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(src, lengths, prev)[0], reference, rtol=1e-5, atol=1e-5)


def test_fold_refuses_a_checkpoint_without_define(translation_data, tmp_path):
    # (a stock `transformer` checkpoint pickles an argparse.Namespace; the fold tool accepts that)
    checkpoint = train(translation_data, tmp_path, arch="transformer", updates=1)
    proc = run_module("define_fairseq.tools.fold_define", checkpoint, tmp_path / "out.pt", check=False)
    assert proc.returncode != 0
    assert "no DeFINE embeddings" in proc.stderr and "'transformer'" in proc.stderr
    assert not (tmp_path / "out.pt").exists()


def test_params_report(translation_data):
    proc = run_module(
        "define_fairseq.tools.params",
        translation_data,
        "--user-dir",
        USER_DIR,
        "--arch",
        "transformer_define",
        "--share-all-embeddings",
    )
    lines = dict(re.findall(r"^(DeFINE|context|input/output|total)\s+([\d.]+)M$", proc.stdout, re.M))
    assert set(lines) == {"DeFINE", "context", "input/output", "total"}
    _, task, model = parsed_model(translation_data, "transformer_define", "--share-all-embeddings")
    counts = parameter_breakdown(model)
    vocab = len(task.source_dictionary)
    define_params = sum(p.numel() for p in model.encoder.embed_tokens.define.parameters())
    assert counts["DeFINE"] == define_params  # shared by encoder and decoder: counted once
    assert counts["input/output"] == vocab * 128 + 512 * 128  # the V x n table + the d -> n projection
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert float(lines["total"]) == pytest.approx(counts["total"] / 1e6, abs=0.006)


@pytest.mark.parametrize("variant", ["delight", "projective"])
def test_params_counts_the_authors_unit_as_define_and_a_projection_as_input_output(translation_data, variant):
    _, task, model = parsed_model(
        translation_data, "transformer_define", "--share-all-embeddings", "--define-variant", variant
    )
    counts = parameter_breakdown(model)
    unit = sum(p.numel() for p in model.encoder.embed_tokens.define.parameters())
    table_and_output = len(task.source_dictionary) * 128 + 512 * 128
    if variant == "projective":  # the n -> d projection, as Transformer-XL's projective embedding counts it
        assert (counts["DeFINE"], counts["input/output"]) == (0, table_and_output + unit)
    else:
        assert (counts["DeFINE"], counts["input/output"]) == (unit, table_and_output)


def test_missing_data_directory_gives_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-data"
    proc = fairseq_train(missing, tmp_path, "transformer_define", *TRAIN_FLAGS, check=False)
    assert proc.returncode != 0 and str(missing) in proc.stderr
    with pytest.raises(FileNotFoundError, match="no-such-data"):
        parsed_model(missing, "transformer_define")


def test_malformed_dictionary_gives_a_clear_error(translation_data, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in translation_data.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "dict.en.txt").write_text("this line has too many fields for a dictionary\n")
    proc = fairseq_train(broken, tmp_path, "transformer_define", *TRAIN_FLAGS, check=False)
    assert proc.returncode != 0 and "dictionary" in proc.stderr.lower()


def test_bad_define_dimensions_name_the_flag(translation_data):
    with pytest.raises(ValueError, match="--define-k"):
        parsed_model(translation_data, "transformer_define", "--define-k", "1021")
    with pytest.raises(ValueError, match="--decoder-output-dim"):
        parsed_model(translation_data, "transformer_define", "--decoder-output-dim", "256")


@pytest.mark.slow  # a fresh interpreter: CI runs it once (make test-slow); test_hydra_configs.py checks the configs
def test_hydra_yaml_config(translation_data, tmp_path):
    (tmp_path / "tiny.yaml").write_text(f"""# @package _global_
common: {{cpu: true, user_dir: {USER_DIR}, log_format: simple, seed: 1}}
task: {{_name: translation, data: {translation_data}}}
model:
  _name: transformer_define
  encoder_layers: 1
  decoder_layers: 1
  encoder_embed_dim: 32
  decoder_embed_dim: 32
  encoder_ffn_embed_dim: 64
  decoder_ffn_embed_dim: 64
  encoder_attention_heads: 2
  decoder_attention_heads: 2
  define_n: 16
  define_k: 64
  define_depth: 4
  share_all_embeddings: true
criterion: {{_name: cross_entropy}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: fixed}}
optimization: {{max_update: 2, lr: [0.001]}}
dataset: {{max_tokens: 400}}
checkpoint: {{save_dir: {tmp_path / "ckpt"}}}
""")
    run_cli("fairseq-hydra-train", "--config-dir", tmp_path, "--config-name", "tiny", cwd=tmp_path)
    state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["define_depth"] == 4
    assert state["model"]["encoder.embed_tokens.table.weight"].shape[1] == 16
    assert "encoder.embed_tokens.define.layers.3.weight" in state["model"]


def test_build_from_a_plain_namespace(translation_data):
    # e.g. a script that builds the model without fairseq-train's parser and config resolution
    from argparse import Namespace

    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    task = TranslationTask.setup_task(TranslationConfig(data=str(translation_data), source_lang="en", target_lang="de"))
    model = task.build_model(Namespace(arch="transformer_define", _name="transformer_define", define_n=32))
    assert model.decoder.embed_tokens.weight.shape[1] == 32
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert tuple(model.decoder.project_out_dim.weight.shape) == (32, 512)


def test_pretrained_embedding_path_is_refused(translation_data, tmp_path):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("w1 0.1 0.2\n")
    with pytest.raises(ValueError, match="--encoder-embed-path"):
        parsed_model(translation_data, "transformer_define", "--encoder-embed-path", str(vectors))


def test_fold_refuses_an_already_folded_checkpoint(folded, tmp_path):
    proc = run_module("define_fairseq.tools.fold_define", folded, tmp_path / "again.pt", check=False)
    assert proc.returncode != 0 and "already folded" in proc.stderr
    assert not (tmp_path / "again.pt").exists()
