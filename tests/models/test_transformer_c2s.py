"""transformer_c2s with the translation_c2s task: source characters in every batch, noise while training,
unknown strings embedded from their letters, the fairseq programs, round trip and clear errors."""

import re
import shutil

import pytest
import torch
from arch_cases import C2S_TINY as C2S, TRANSFORMER, TRANSLATION as TINY_MODEL
from conftest import TRAIN_FLAGS, USER_DIR, fairseq_train, run_cli, run_module, setup_model
from lm_helpers import generate

import define_fairseq  # noqa: F401
from define_fairseq.data.char_noise import CharNoise, sample_rng
from define_fairseq.modules.char2subword import Char2SubwordEmbedding, encode_characters


def setup(data, *flags, arch="transformer_c2s"):
    return setup_model(data, arch, *TINY_MODEL, *C2S, *flags, task="translation_c2s")


def train(data, save_dir, *flags, arch="transformer_c2s"):
    """fairseq-train of ``arch`` on its tiny sizes with the translation_c2s task."""
    flags = (*TINY_MODEL, *C2S, *TRAIN_FLAGS, *flags, "--no-save-optimizer-state")
    return fairseq_train(data, save_dir, arch, *flags, task="translation_c2s")


@pytest.fixture(scope="module")
def checkpoint(translation_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("c2s")
    flags = ("--c2s-noise-rate", "0.1", "--max-update", "6", "--share-decoder-input-output-embed")
    proc = train(translation_data, save_dir, *flags)
    assert "source characters noised with rate 0.1" in proc.stdout + proc.stderr
    return save_dir / "checkpoint_last.pt"


def test_the_encoder_embeds_with_char2subword_and_the_decoder_choices(translation_data):
    _, _, model = setup(translation_data, "--share-decoder-input-output-embed")
    assert isinstance(model.encoder.embed_tokens, Char2SubwordEmbedding)
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    # fairseq multiplies by sqrt(d); the module divides it out of its unit-scale LayerNorm output
    assert model.encoder.embed_tokens.output_scale == pytest.approx(32**-0.5)
    _, _, model = setup(translation_data, "--decoder-input-layer", "char2subword")
    assert isinstance(model.decoder.embed_tokens, Char2SubwordEmbedding)
    assert model.decoder.output_projection.weight is not None and model.decoder.share_input_output_embed is False
    _, _, model = setup(translation_data, "--decoder-input-layer", "define")
    from define_fairseq.modules import DeFINEEmbedding

    assert isinstance(model.decoder.embed_tokens, DeFINEEmbedding)
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight  # tied in n dimensions
    assert model.encoder.embed_tokens.output_scale == 1.0  # --no-scale-embedding with DeFINE


# fairseq-generate with the translation_c2s task, beam 2
C2S_GENERATE = ("--task", "translation_c2s", "--beam", "2")


def batch_of(task, split, indices):
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in indices])


def test_batches_carry_each_source_tokens_characters(translation_data):
    _, task, _ = setup(translation_data)
    task.load_dataset("valid")
    batch = batch_of(task, "valid", [0, 1, 2, 3])
    tokens, chars = batch["net_input"]["src_tokens"], batch["net_input"]["src_chars"]
    assert chars.shape[:2] == tokens.shape
    dictionary = task.source_dictionary
    for row in range(tokens.size(0)):
        for t in range(tokens.size(1)):
            token = int(tokens[row, t])
            ids = [c for c in chars[row, t].tolist() if c]
            if token < dictionary.nspecial:  # padding (left) and EOS
                assert ids == []
            else:
                assert ids == encode_characters(dictionary[token])


def test_training_noise_is_deterministic_per_epoch_and_keeps_the_characters(translation_data):
    _, task, _ = setup(translation_data, "--c2s-noise-rate", "0.3", "--seed", "7")
    task.load_dataset("train")
    dataset = task.dataset("train")
    dataset.set_epoch(1)
    first = [dataset[i] for i in range(40)]
    again = [dataset[i] for i in range(40)]
    assert all(torch.equal(a["source"], b["source"]) for a, b in zip(first, again))
    dataset.set_epoch(2)
    second = [dataset[i] for i in range(40)]
    assert any(not torch.equal(a["source"], b["source"]) for a, b in zip(first, second))
    dictionary = task.source_dictionary
    clean = task.dataset("train").dataset[0]["source"]
    expected = CharNoise(0.3).noise_tokens([dictionary[int(t)] for t in clean[:-1]], sample_rng(7, 1, 0))
    assert [dictionary.index(p) for p in expected] == first[0]["source"][:-1].tolist()
    assert first[0]["source_chars"][:-1] == [encode_characters(p) for p in expected]
    unknown = [
        (item, t) for item in first for t, token in enumerate(item["source"].tolist()) if token == dictionary.unk()
    ]
    assert unknown, "a 30% rate should produce pieces the dictionary lacks"
    for item, t in unknown:
        assert item["source_chars"][t]  # an unknown piece keeps its characters


def test_raw_text_splits_keep_unknown_strings(translation_data, checkpoint, tmp_path):
    """--dataset-impl raw: the characters come from the text, so a string the dictionary lacks is embedded
    from its letters, not as <unk>."""
    data = tmp_path / "raw"
    data.mkdir()
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(translation_data / name, data / name)
    (data / "test.en-de.en").write_text("w1 w2x w3\nw4 w5\n")  # "w2x" is not in the dictionary
    (data / "test.en-de.de").write_text("w3 w2 w1\nw5 w4\n")
    cfg, task, model = setup(data, "--dataset-impl", "raw")
    model.eval()
    task.load_dataset("test")
    batch = batch_of(task, "test", [0, 1])
    row = batch["id"].tolist().index(0)
    tokens, chars = batch["net_input"]["src_tokens"][row], batch["net_input"]["src_chars"][row]
    position = tokens.tolist().index(task.source_dictionary.unk())
    assert [c for c in chars[position].tolist() if c] == encode_characters("w2x")
    with torch.no_grad():
        with_chars = model.encoder.embed_tokens(tokens[None], chars[None])[0, position]
        as_unk = model.encoder.embed_tokens(tokens[None])[0, position]
        torch.testing.assert_close(
            with_chars,
            model.encoder.embed_tokens.compose(chars[position][None])[0] * model.encoder.embed_tokens.output_scale,
            rtol=1e-5,
            atol=1e-5,
        )
    assert not torch.allclose(with_chars, as_unk)
    out = generate(data, checkpoint, *C2S_GENERATE, "--dataset-impl", "raw", "--batch-size", "2", full_output=True)
    assert len(re.findall(r"^H-\d+\t", out, re.M)) == 2


def test_fairseq_generate_and_interactive(translation_data, checkpoint, tmp_path):
    out = generate(translation_data, checkpoint, *C2S_GENERATE, "--batch-size", "8", full_output=True)
    hypotheses = re.findall(r"^H-\d+\t(\S+)\t", out, re.M)
    assert len(hypotheses) == 20 and all(float(h) <= 0 for h in hypotheses)
    assert "BLEU4" in out
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("w1 w2 w3\nw4 w5\n")
    interactive = ("--task", "translation_c2s", "--path", checkpoint, "--cpu", "--beam", "2", "--input", sentences)
    proc = run_cli("fairseq-interactive", translation_data, "--user-dir", USER_DIR, *interactive)
    assert len(re.findall(r"^H-\d+\t", proc.stdout, re.M)) == 2


def test_checkpoint_round_trip(translation_data, checkpoint):
    from fairseq import checkpoint_utils

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model.eval()
    task.load_dataset("valid")
    sample = batch_of(task, "valid", [0, 1, 2])
    with torch.no_grad():
        before = model(**sample["net_input"])[0]
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == "transformer_c2s"
    _, _, fresh = setup(translation_data, "--share-decoder-input-output-embed")
    fresh.eval()
    with torch.no_grad():
        assert not torch.allclose(fresh(**sample["net_input"])[0], before)
        fresh.load_state_dict(state["model"])
        torch.testing.assert_close(fresh(**sample["net_input"])[0], before, rtol=0, atol=0)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--share-all-embeddings"], "cannot --share-all-embeddings"),
        (["--decoder-input-layer", "char2subword", "--share-decoder-input-output-embed"], "needs a decoder table"),
        (["--c2s-noise-rate", "1.5"], "--c2s-noise-rate"),
        (["--c2s-noise-types", "insert,typo"], "--c2s-noise-types"),
    ],
)
def test_impossible_settings_fail_clearly(translation_data, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        setup(translation_data, *flags)


def test_noise_never_edits_special_symbols(translation_data):
    _, task, _ = setup(translation_data, "--c2s-noise-rate", "1.0", "--c2s-noise-types", "substitute")
    task.load_dataset("train")
    dataset = task.dataset("train")
    noised = dataset._noised(["w1", "w2", "<unk>", "w3"], sample_rng(1, 1, 0))
    assert noised[2] == "<unk>" and noised[:2] != ["w1", "w2"] and noised[3] != "w3"


@pytest.mark.parametrize("arch", ["transformer_c2s_iwslt_de_en", "transformer_c2s_small"])
def test_every_arch_trains_through_fairseq_train(translation_data, tmp_path, arch):
    proc = train(translation_data, tmp_path, "--max-update", "2", arch=arch)
    assert re.search(r"valid on 'valid' subset \| loss [\d.]+", proc.stdout + proc.stderr)
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == arch  # fairseq records the arch name there


def test_the_papers_route_table_distil_swap_then_train_the_module_only(translation_data, tmp_path):
    """transformer -> distill_c2s -> c2s_checkpoint -> fairseq-train transformer_c2s --finetune-from-model with
    --c2s-train-embedding-only: only the module's weights move; then fairseq-generate reads the result."""
    base = tmp_path / "transformer"
    flags = (*TRANSFORMER, *TRAIN_FLAGS, "--max-update", "4", "--no-save-optimizer-state", "--share-all-embeddings")
    fairseq_train(translation_data, base, "transformer", *flags, task="translation")
    run_module(
        "define_fairseq.tools.distill_c2s",
        "--checkpoint",
        base / "checkpoint_last.pt",
        "--output",
        tmp_path / "c2s.pt",
        "--epochs",
        "1",
        "--cpu",
        *C2S,
    )
    run_module(
        "define_fairseq.tools.c2s_checkpoint",
        "--checkpoint",
        base / "checkpoint_last.pt",
        "--c2s",
        tmp_path / "c2s.pt",
        "--output",
        tmp_path / "start.pt",
    )
    tuned = tmp_path / "c2s"
    flags = ("--max-update", "3", "--share-decoder-input-output-embed", "--c2s-noise-rate", "0.1")
    train(translation_data, tuned, *flags, "--c2s-train-embedding-only", "--finetune-from-model", tmp_path / "start.pt")
    start = torch.load(tmp_path / "start.pt", map_location="cpu", weights_only=True)["model"]
    final = torch.load(tuned / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert set(start) == set(final)
    moved = {name for name in start if not torch.equal(start[name], final[name])}
    assert moved and all(name.startswith("encoder.embed_tokens.") for name in moved)
    out = generate(
        translation_data, tuned / "checkpoint_last.pt", *C2S_GENERATE, "--gen-subset", "valid", full_output=True
    )
    assert re.search(r"BLEU4? = [\d.]+", out)
