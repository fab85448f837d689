"""The state a recurrent language model carries from batch to batch, in checkpoints
(:mod:`define_fairseq.models.carried_state`): the training state is saved with the weights (per data-parallel
rank, with its batch size and dtypes) and loads back; the evaluation state is never saved; a state of
another rank or world size is not taken; averages leave it out; checkpoints without it, averaged or folded ones
load for evaluation and generation. (That a resumed run ends with the weights of an uninterrupted one:
test_resume.py.)"""

import logging

import pytest
import torch
from arch_cases import CASES
from conftest import ADAM, fairseq_train, needs_fairseq_eos_blocks, setup_model
from lm_helpers import check_generate_continues_a_prefix, eval_lm, load, log_probs, tokens_batch

from define_fairseq.models.carried_state import CarriedState

LSTM = CASES["lstm_lm_define"][1]
KEY = "decoder.carried_state._extra_state"


def build(data):
    return setup_model(data, "lstm_lm_define", *LSTM, "--batch-size", "3", task="stateful_lm")[2]


def saved_and_read(state, path):
    """``state`` as fairseq-train writes it (float32 on the CPU) and fairseq reads it (weights_only)."""
    from fairseq import utils

    torch.save(utils.move_to_cpu(state), path)
    return torch.load(path, map_location="cpu", weights_only=True)


def test_the_training_state_is_saved_with_the_weights_and_continues_after_loading(lm_data, tmp_path):
    model, other = build(lm_data), build(lm_data)
    tokens = tokens_batch(len(model.decoder.dictionary), length=12)
    model.train()
    model(tokens[:, :5], reset_state=True)
    model.eval()
    with torch.no_grad():
        model(tokens[:2, :4], reset_state=True)  # an evaluation state (of 2 streams): never saved
    saved = model.state_dict()[KEY]
    assert saved["world_size"] == 1 and len(saved["ranks"]) == 1
    rows = saved["ranks"][0]
    assert rows["batch_size"] == 3
    assert rows["dtypes"] == ["float32"] * 4  # (h, c) of 2 layers
    for (h, c), (h_saved, c_saved) in zip(model.decoder.carried_state.kept_state(True), rows["state"]):
        assert torch.equal(h, h_saved) and torch.equal(c, c_saved)

    other.load_state_dict(saved_and_read(model.state_dict(), tmp_path / "state.pt"))
    assert other.decoder.carried_state.has_state(True) and not other.decoder.carried_state.has_state(False)
    outputs = []
    for m, keep in ((model, True), (other, True), (other, False)):
        if not keep:
            m.decoder.carried_state.clear()  # the loaded state forgotten
        m.train()
        torch.manual_seed(5)  # the same dropout masks
        outputs.append(m(tokens[:, 5:], reset_state=False)[0].detach())
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    assert (outputs[2] - outputs[0]).abs().max() > 1e-3  # the state is what made them agree


def test_a_state_dict_without_the_entry_loads_as_holding_nothing(lm_data):
    model, other = build(lm_data), build(lm_data)
    other.train()
    other(tokens_batch(len(other.decoder.dictionary)), reset_state=True)
    older = {key: value for key, value in model.state_dict().items() if key != KEY}  # written before it existed
    other.load_state_dict(older)
    assert not other.decoder.carried_state.has_state(True)
    torch.testing.assert_close(
        log_probs(other.eval(), tokens_batch(len(other.decoder.dictionary))),
        log_probs(model.eval(), tokens_batch(len(model.decoder.dictionary))),
        rtol=0,
        atol=0,
    )


def test_fp16_state_comes_back_in_fp16_on_the_modules_device(tmp_path):
    kept = CarriedState()
    state = [(torch.randn(2, 3).half(), torch.randn(2, 3).half())]
    kept.keep(True, True, 2, state)
    loaded = CarriedState().to("meta")  # the module's device, wherever the checkpoint was read
    loaded.set_extra_state(saved_and_read(kept.get_extra_state(), tmp_path / "state.pt"))
    assert loaded.kept_state(True)[0][0].dtype == torch.float16
    assert loaded.initial(False, True, 2)[0][0].device.type == "meta"
    fresh = CarriedState()
    fresh.set_extra_state(saved_and_read(kept.get_extra_state(), tmp_path / "state.pt"))
    assert torch.equal(fresh.kept_state(True)[0][0], state[0][0])


def test_a_state_of_another_rank_or_world_size_is_not_taken(caplog):
    kept = CarriedState("LSTM state")
    kept.keep(True, True, 2, [(torch.ones(2, 3), torch.ones(2, 3))])
    saved = kept.get_extra_state()
    assert saved["world_size"] == 1
    loaded = CarriedState("LSTM state")
    loaded.set_extra_state({"world_size": 2, "ranks": [saved["ranks"][0], {}]})  # a 2-process run's, read by one
    assert not loaded.has_state(True)
    with caplog.at_level(logging.WARNING):
        assert loaded.initial(False, True, 2) is None
    assert "the checkpoint holds the state of 2 data-parallel processes, this run has 1" in caplog.text
    loaded.set_extra_state(saved)
    assert torch.equal(loaded.initial(False, True, 2)[0][0], torch.ones(2, 3))


def test_the_earlier_format_of_one_ranks_state_still_loads():
    """Checkpoints written before every rank's state was saved hold one rank's rows at the top level."""
    state = [(torch.full((2, 3), 2.0), torch.ones(2, 3))]
    older = {"batch_size": 2, "rank": 0, "world_size": 1, "dtypes": ["float32", "float32"], "state": state}
    loaded = CarriedState()
    loaded.set_extra_state(older)
    assert torch.equal(loaded.initial(False, True, 2)[0][0], state[0][0])
    loaded.set_extra_state(dict(older, world_size=2))  # rank 0's rows of a 2-process run, read by one
    assert not loaded.has_state(True)


@pytest.fixture(scope="module")
def stateful_checkpoints(lm_data, tmp_path_factory):
    """Update checkpoints after 2 and 4 updates of a stateful lstm_lm_define run, both inside the first epoch."""
    save_dir = tmp_path_factory.mktemp("stateful")
    flags = (*LSTM, *ADAM, "--batch-size", "4", "--tokens-per-sample", "10", "--max-update", "4")
    flags += ("--save-interval-updates", "2", "--no-epoch-checkpoints", "--disable-validation")
    fairseq_train(lm_data, save_dir, "lstm_lm_define", *flags, task="stateful_lm")
    return [save_dir / "checkpoint_1_2.pt", save_dir / "checkpoint_1_4.pt"]


@needs_fairseq_eos_blocks
def test_a_checkpoint_with_the_state_generates(stateful_checkpoints, lm_data):
    check_generate_continues_a_prefix(lm_data, stateful_checkpoints[1], "--beam", "2")  # --task language_modeling


def test_checkpoints_with_the_state_load_average_and_fold(stateful_checkpoints, lm_data, tmp_path):
    from define_fairseq.tools import average_checkpoints as avg
    from define_fairseq.tools.fold_define import fold_checkpoint

    for path in stateful_checkpoints:
        assert torch.load(path, map_location="cpu", weights_only=False)["model"][KEY]["ranks"][0]["batch_size"] == 4
    model, _ = load(stateful_checkpoints[1])  # as fairseq-generate and fairseq-eval-lm load it
    assert model.decoder.carried_state.has_state(True)
    tokens = tokens_batch(len(model.decoder.dictionary))

    averaged = tmp_path / "averaged.pt"
    avg.average_checkpoints(stateful_checkpoints, averaged)
    assert KEY not in torch.load(averaged, map_location="cpu", weights_only=False)["model"]
    loss, perplexity = eval_lm(lm_data, averaged, "--batch-size", "2", "--tokens-per-sample", "10")
    assert 1 < perplexity < 100

    folded = tmp_path / "folded.pt"
    fold_checkpoint(str(stateful_checkpoints[1]), str(folded))
    folded_model, _ = load(folded)
    assert folded_model.decoder.carried_state.has_state(True)
    torch.testing.assert_close(log_probs(folded_model, tokens), log_probs(model, tokens), rtol=1e-5, atol=1e-5)
