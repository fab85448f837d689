"""Training stopped after some updates and resumed from ``checkpoint_last.pt`` ends with the same weights as an
uninterrupted run of the same number of updates (CPU, dropout on: the resumed run must also pick up the data
order, the position inside the epoch, the optimizer state and the per-update seeds). For the recurrent LMs of
``--task stateful_lm`` the checkpoint must also hold the state carried from batch to batch (the LSTM and Mogrifier
state, the Transformer-XL memory); without it the resumed run starts its streams from zeros and ends elsewhere.

Both runs do the same arithmetic on the same inputs in the same order, in processes with the same thread settings
(one OpenMP thread, see conftest), so the weights are compared exactly."""

import pytest
import torch
from arch_cases import CASES, REGULARIZED, TRANSLATION as TINY_MODEL
from conftest import ADAM, RUN_FLAGS, TRAIN_FLAGS, fairseq_train

UPDATES = 8
STOP_AT = 3  # inside the first epoch: the resumed run starts in the middle of it
assert TRAIN_FLAGS[-2:] == ["--dropout", "0.0"]
FLAGS = TRAIN_FLAGS[:-2] + ["--dropout", "0.2"]  # dropout on: the per-update seeds matter too
TRANSLATION = ["--arch", "transformer_define", *TINY_MODEL, *FLAGS]


def train(data, save_dir, max_update, *flags):
    """fairseq-train's output for ``max_update`` updates (``flags`` name the arch), without epoch checkpoints and
    validation."""
    end = ("--max-update", max_update, "--no-epoch-checkpoints", "--disable-validation")
    proc = fairseq_train(data, save_dir, None, *flags, *end)
    return proc.stdout + proc.stderr


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def weights(path):
    return load(path)["model"]


def assert_same_weights(a, b):
    assert set(a) == set(b)
    for name in a:
        if torch.is_tensor(a[name]):
            torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


def test_resumed_training_matches_an_uninterrupted_run(translation_data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(translation_data, straight, UPDATES, *TRANSLATION)
    first = train(translation_data, resumed, STOP_AT, *TRANSLATION)
    assert f"num_updates: {STOP_AT} >= max_update: {STOP_AT}" in first
    state = load(resumed / "checkpoint_last.pt")
    assert state["extra_state"]["train_iterator"]["iterations_in_epoch"] == STOP_AT  # stopped mid-epoch
    second = train(translation_data, resumed, UPDATES, *TRANSLATION)
    assert "Loaded checkpoint" in second
    a, b = weights(straight / "checkpoint_last.pt"), weights(resumed / "checkpoint_last.pt")
    assert_same_weights(a, b)
    # and the weights did move after the interruption
    halfway = state["model"]
    assert any(not torch.equal(halfway[name], a[name]) for name in a)


# -- the stateful language models ---------------------------------------------------------------------------------

LM_FLAGS = ["--task", "stateful_lm", "--batch-size", "4", "--tokens-per-sample", "10", *ADAM, *RUN_FLAGS]


def regularised(arch, *flags):
    """``--arch arch`` on its tiny case, then ``flags``."""
    return ["--arch", arch, *CASES[arch][1], *flags]


# Each model on its tiny case with its regularisers on (every random draw must repeat after the interruption).
# model -> (its arguments, the name of its decoder's CarriedState)
STATEFUL = {
    "lstm_lm_define": (regularised("lstm_lm_define", "--dropout", "0.2", "--awd-weight-drop", "0.2"), "carried_state"),
    "awd_lstm_lm, variable BPTT": (regularised("awd_lstm_lm", "--variable-bptt", "--bptt-std", "2"), "carried_state"),
    "mogrifier_lstm_lm": (
        regularised("mogrifier_lstm_lm_ptb", "--mogrifier-drop-state-probability", "0.3", *REGULARIZED),
        "carried_state",
    ),
    "transformer_xl_lm": (regularised("transformer_xl_lm", "--dropout", "0.1"), "memory"),
}
ZEROS_WARNING = "starting from zeros"


@pytest.mark.parametrize("model", list(STATEFUL))
def test_resumed_stateful_lm_matches_an_uninterrupted_run(model, lm_data, tmp_path):
    arch_flags, attribute = STATEFUL[model]
    flags = (*LM_FLAGS, *arch_flags)

    key = f"decoder.{attribute}._extra_state"
    straight, resumed, stateless = tmp_path / "straight", tmp_path / "resumed", tmp_path / "stateless"
    assert ZEROS_WARNING not in train(lm_data, straight, UPDATES, *flags)
    train(lm_data, resumed, STOP_AT, *flags)
    halfway = load(resumed / "checkpoint_last.pt")
    assert halfway["extra_state"]["train_iterator"]["iterations_in_epoch"] == STOP_AT  # stopped mid-epoch
    saved = halfway["model"][key]
    assert saved["world_size"] == 1 and saved["ranks"][0]["batch_size"] == 4

    # the counter-check: the same checkpoint without the carried state, as written before it was saved
    stateless.mkdir()
    older = {name: value for name, value in halfway["model"].items() if name != key}
    torch.save(dict(halfway, model=older), stateless / "checkpoint_last.pt")

    out = train(lm_data, resumed, UPDATES, *flags)
    assert "Loaded checkpoint" in out and ZEROS_WARNING not in out
    final = weights(straight / "checkpoint_last.pt")
    assert_same_weights(final, weights(resumed / "checkpoint_last.pt"))
    assert any(not torch.equal(halfway["model"][name], final[name]) for name in final if torch.is_tensor(final[name]))

    assert ZEROS_WARNING in train(lm_data, stateless, UPDATES, *flags)
    other = weights(stateless / "checkpoint_last.pt")
    differences = [(other[name] - final[name]).abs().max().item() for name in final if torch.is_tensor(final[name])]
    assert max(differences) > 1e-4  # far beyond rounding: the carried state is what made the runs agree
