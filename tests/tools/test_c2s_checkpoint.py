"""c2s_checkpoint: a trained translation checkpoint with a distilled Char2Subword module in place of its table, as
transformer_c2s's starting point (the paper's second stage), and its errors."""

import argparse
from pathlib import Path

import pytest
import torch
from c2s_teacher import ADAM_CPU, DIM, SMALL_C2S, TINY_TRANSFORMER, write_teacher_checkpoint

from define_fairseq.tools.distill_c2s import load_distilled, main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_teacher_checkpoint(tmp_path_factory.mktemp("c2s-dict"))


def _dictionary(checkpoint):
    from fairseq.data import Dictionary

    return Dictionary.load(str(checkpoint.parent / "dict.en.txt"))


def test_c2s_checkpoint_gives_transformer_c2s_the_model_with_the_module_for_the_table(checkpoint, tmp_path):
    from conftest import USER_DIR
    from fairseq import checkpoint_utils, tasks

    from define_fairseq.tools import c2s_checkpoint
    from define_fairseq.tools.params import setup_from_train_args

    # the fixture's table rows have norm 1 (RMS d^-0.5, the scale transformer_c2s builds with): a table three
    # times larger, so that the module must be rescaled when it is swapped in
    with torch.serialization.safe_globals([argparse.Namespace]):
        saved = torch.load(checkpoint, weights_only=True)
    saved["model"]["encoder.embed_tokens.weight"] *= 3
    data, checkpoint = checkpoint.parent, tmp_path / checkpoint.name
    torch.save(saved, checkpoint)
    module_path, start = tmp_path / "c2s.pt", tmp_path / "start.pt"
    main(
        [
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(module_path),
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--lr",
            "0.01",
            "--cpu",
            *SMALL_C2S,
        ]
    )
    c2s_checkpoint.main(["--checkpoint", str(checkpoint), "--c2s", str(module_path), "--output", str(start)])
    assert not Path(str(start) + ".tmp").exists()

    # the reference: the checkpoint's own Transformer with its encoder table replaced by the distilled module
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    task = tasks.setup_task(state["cfg"].task)
    reference = task.build_model(state["cfg"].model)
    reference.load_state_dict(state["model"])
    reference.encoder.embed_tokens = load_distilled(str(module_path), task.source_dictionary)
    assert reference.encoder.embed_tokens.output_scale == pytest.approx(3 * DIM**-0.5, rel=1e-3)  # E's scale

    # transformer_c2s as fairseq-train builds it, loaded (strictly) from the written start
    _, _, model = setup_from_train_args(
        [
            str(data),
            "--user-dir",
            USER_DIR,
            "--task",
            "translation_c2s",
            "-s",
            "en",
            "-t",
            "de",
            "--arch",
            "transformer_c2s",
            *TINY_TRANSFORMER,
            *SMALL_C2S,
            *ADAM_CPU,
        ]
    )
    model.load_state_dict(checkpoint_utils.load_checkpoint_to_cpu(str(start))["model"], strict=True)
    assert model.encoder.embed_tokens.output_scale == pytest.approx(DIM**-0.5)

    reference.eval()
    model.eval()
    gen = torch.Generator().manual_seed(3)
    dictionary = task.source_dictionary
    src = torch.randint(dictionary.nspecial, len(dictionary), (3, 6), generator=gen)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (3, 4), generator=gen)
    lengths = torch.full((3,), 6)
    with torch.no_grad():
        expected = reference(src, lengths, prev)[0]
        torch.testing.assert_close(model(src, lengths, prev)[0], expected, rtol=1e-4, atol=1e-5)
        # and it is not the table's model
        original = task.build_model(state["cfg"].model)
        original.load_state_dict(state["model"])
        assert not torch.allclose(original.eval()(src, lengths, prev)[0], expected, atol=1e-3)


def test_c2s_checkpoint_refuses_a_decoder_module_and_names_missing_files(checkpoint, tmp_path):
    from define_fairseq.tools import c2s_checkpoint

    decoder_module = tmp_path / "decoder.pt"
    main(
        [
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(decoder_module),
            "--side",
            "decoder",
            "--epochs",
            "0",
            "--cpu",
            *SMALL_C2S,
        ]
    )
    out = tmp_path / "start.pt"
    with pytest.raises(ValueError, match="distilled from a decoder table"):
        c2s_checkpoint.main(["--checkpoint", str(checkpoint), "--c2s", str(decoder_module), "--output", str(out)])
    with pytest.raises(FileNotFoundError, match="no_such.pt: no such file"):
        c2s_checkpoint.main(
            ["--checkpoint", str(checkpoint), "--c2s", str(tmp_path / "no_such.pt"), "--output", str(out)]
        )
    with pytest.raises(FileNotFoundError, match="--output .*the directory .* does not exist"):
        c2s_checkpoint.main(
            [
                "--checkpoint",
                str(checkpoint),
                "--c2s",
                str(decoder_module),
                "--output",
                str(tmp_path / "no_such_dir" / "start.pt"),
            ]
        )
    assert not out.exists()
    # a table whose shape is not the module's: the swap is refused, naming the checkpoint
    module = load_distilled(str(decoder_module), _dictionary(checkpoint))
    state = {"model": {c2s_checkpoint.TABLE_KEY: torch.zeros(module.num_embeddings, module.embedding_dim + 1)}}
    with pytest.raises(
        ValueError,
        match=r"--checkpoint ck\.pt: encoder\.embed_tokens\.weight is \(.*\) but the "
        r"module embeds",
    ):
        c2s_checkpoint.swap_in(state, module, "ck.pt")
