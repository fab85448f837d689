"""transformer_define from Python (fairseq's hub interface, ``from_pretrained`` with the BPE codes) and from
``fairseq-interactive`` with the same codes: both translate raw sentences, and give the same translations."""

import pytest
from arch_cases import TRANSLATION as TINY_MODEL
from conftest import TRAIN_FLAGS, USER_DIR, binarize, fairseq_train, run_cli, write_tiny_corpus

SENTENCES = ["w1 w22 w3", "w17 w5 w38 w0", "w9"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(data-bin, BPE codes, save dir)``: a joint subword-nmt BPE learned on the toy corpus, the corpus
    binarized with it, and transformer_define trained on it for a few updates."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    raw = tmp_path_factory.mktemp("hub-raw")
    write_tiny_corpus(raw)
    joined = raw / "train.joined"
    joined.write_text((raw / "train.en").read_text() + (raw / "train.de").read_text())
    codes = raw / "codes"
    with open(joined) as infile, open(codes, "w") as outfile:
        learn_bpe(infile, outfile, 12)  # few merges: most words stay split into pieces
    with open(codes) as handle:
        bpe = BPE(handle)
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            lines = (raw / f"{split}.{lang}").read_text().splitlines()
            (raw / f"{split}.bpe.{lang}").write_text("".join(bpe.process_line(line) + "\n" for line in lines))
    assert "@@" in (raw / "train.bpe.en").read_text()
    flags = ("--source-lang", "en", "--target-lang", "de", "--joined-dictionary")
    data = binarize(raw, ".bpe", tmp_path_factory.mktemp("hub-bin"), *flags, splits=("train", "valid"))
    save_dir = tmp_path_factory.mktemp("hub-model")
    flags = (*TINY_MODEL, *TRAIN_FLAGS, "--max-update", "40", "--no-save-optimizer-state")
    fairseq_train(data, save_dir, "transformer_define", *flags)
    return data, codes, save_dir


def test_hub_interface_and_fairseq_interactive_translate_alike(trained, tmp_path):
    from define_fairseq.models.transformer_define import TransformerDefineModel

    data, codes, save_dir = trained
    hub = TransformerDefineModel.from_pretrained(
        str(save_dir),
        "checkpoint_last.pt",
        data_name_or_path=str(data),
        bpe="subword_nmt",
        bpe_codes=str(codes),
        user_dir=USER_DIR,
    )
    hub.eval()
    assert type(hub.models[0]) is TransformerDefineModel
    assert "@@" in hub.apply_bpe(SENTENCES[1])  # the sentence is segmented on the way in
    from_python = hub.translate(SENTENCES, beam=2)
    assert len(from_python) == len(SENTENCES)
    for text in from_python:
        assert text and "@@" not in text
        assert all(word.startswith("w") for word in text.split())  # the toy target language's words

    # One batch of the three sentences, as the hub batches them: a sentence alone is a differently shaped
    # computation, whose scores differ in the last bits, and a near tie in the beam could then pick another word.
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(s + "\n" for s in SENTENCES))
    bpe = ("--bpe", "subword_nmt", "--bpe-codes", codes, "--beam", "2", "--cpu", "--input", sentences)
    batch = ("--buffer-size", len(SENTENCES), "--batch-size", len(SENTENCES))
    model = ("--path", save_dir / "checkpoint_last.pt", "--source-lang", "en", "--target-lang", "de")
    proc = run_cli("fairseq-interactive", data, "--user-dir", USER_DIR, *model, *bpe, *batch)
    detokenized = {}
    for line in proc.stdout.splitlines():
        if line.startswith("D-"):
            key, _, text = line.split("\t")
            detokenized[int(key[2:])] = text
    assert [detokenized[i] for i in range(len(SENTENCES))] == from_python
