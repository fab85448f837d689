"""scripts.lstm_gates: the first LSTM layer's gate pre-activations, recomputed, and the share beyond +-6."""

import shutil

import lm_helpers as lm
import pytest
import torch
from arch_cases import CASES
from conftest import ADAM

from scripts.lstm_gates import checkpoints, gate_preactivations, main, saturation

BATCHES = ["--tokens-per-sample", "32", "--max-tokens", "256"]


def lstm(inputs=5, hidden=7):
    torch.manual_seed(0)
    return torch.nn.LSTM(inputs, hidden, batch_first=True).double()


def test_the_recurrence_gives_the_lstms_own_hidden_states():
    net = lstm()
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    pre, h = gate_preactivations(net, x)
    assert pre.shape == (3, 6, 4, 7)
    torch.testing.assert_close(h, net(x)[0], rtol=1e-12, atol=1e-12)
    # the first step from a zero state is the input's part and the biases alone
    first = x[:, 0] @ net.weight_ih_l0.T + net.bias_ih_l0 + net.bias_hh_l0
    torch.testing.assert_close(pre[:, 0].reshape(3, 28), first, rtol=1e-12, atol=1e-12)


def test_the_shares_count_each_gate_and_all_four():
    pre = torch.zeros(2, 3, 4, 5, dtype=torch.float64)
    pre[..., 0, :] = 7.0  # every input gate beyond +6
    pre[..., 1, :2] = -6.5  # two fifths of the forget gates beyond -6
    pre[..., 3, :] = 6.0  # on the threshold: not beyond it
    assert saturation(pre) == pytest.approx([1.0, 0.4, 0.0, 0.0, 0.35])


def test_larger_inputs_saturate_the_gates():
    net = lstm(inputs=64, hidden=32)
    x = torch.randn(4, 10, 64, dtype=torch.float64)
    small, large = (saturation(gate_preactivations(net, scale * x)[0])[-1] for scale in (1.0, 100.0))
    assert small < 0.01 < 0.5 < large


def test_only_the_points_checkpoints_are_read(tmp_path):
    names = (
        "a.s1/checkpoint_1_3000.pt",
        "a.s1/checkpoint_last.pt",
        "a.s1/checkpoint1.pt",
        "a.s1/checkpoint_10_500.pt",
        "b_c.s2/checkpoint_8_30000.pt",
    )
    for name in names:
        (tmp_path / "runs" / "train" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / "train" / name).touch()
    found = [(model, seed, updates) for model, seed, updates, _ in checkpoints(tmp_path)]
    assert found == [("a", 1, 500), ("a", 1, 3000), ("b_c", 2, 30000)]  # by updates, not by name


def comparison_out(lm_data, tmp_path, arch, name):
    """A comparison's OUT with one run of ``arch`` (2 updates) kept as ``runs/train/NAME.s1/checkpoint_1_2.pt``."""
    out = tmp_path / "out"
    run = out / "runs" / "train" / f"{name}.s1"
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path / name, arch, *CASES[arch][1], *ADAM, *BATCHES, updates=2)
    run.mkdir(parents=True)
    shutil.copy(checkpoint, run / "checkpoint_1_2.pt")
    if not (out / "data-bin").exists():
        shutil.copytree(lm_data, out / "data-bin")
    return out, checkpoint


def test_a_comparisons_lstm_checkpoint_is_measured_as_recomputed(lm_data, tmp_path, capsys):
    from fairseq import checkpoint_utils

    out, checkpoint = comparison_out(lm_data, tmp_path, "lstm_lm_adaptive_wt103", "lstm_adaptive")
    main([str(out), "--tokens", "60", "--rows", "3"])
    header, row = capsys.readouterr().out.splitlines()
    assert header.split("\t") == [
        "model",
        "seed",
        "updates",
        "input_rms",
        "share_i",
        "share_f",
        "share_g",
        "share_o",
        "share",
    ]
    values = row.split("\t")
    assert values[:3] == ["lstm_adaptive", "1", "2"]
    # the same first 60 validation tokens as 3 streams, through the model's own embedding and first LSTM layer
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = model.eval().double()
    stream = lm.split_stream(lm_data, task.target_dictionary, "valid")[:60].view(3, 20)
    with torch.no_grad():
        x = model.decoder.embed_tokens(stream)
        expected = [
            x.pow(2).mean().sqrt().item(),
            *saturation(gate_preactivations(model.decoder.lstm.layers[0].lstm, x)[0]),
        ]
    assert [float(v) for v in values[3:]] == pytest.approx(expected, abs=5e-5)  # printed to 4 decimals


def test_a_model_without_an_lstm_stack_is_skipped_and_said_so(lm_data, tmp_path, capsys):
    out, _ = comparison_out(lm_data, tmp_path, "mogrifier_lstm_lm", "mogrifier")
    main([str(out), "--tokens", "60", "--rows", "3"])
    printed = capsys.readouterr()
    assert (
        printed.out.splitlines()[1:] == []
        and "mogrifier.s1/checkpoint_1_2.pt: its decoder reads no LSTM" in printed.err
    )


def test_an_out_without_checkpoints_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "holds no checkpoint_E_U.pt" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--models", "b"], "--models: no kept checkpoint under"),
        (["--models", "a", "--updates", "3000,30000"], "has 30000"),
        (["--rows", "0"], "--rows 0 must be at least 1"),
    ],
)
def test_models_updates_and_rows_not_there_are_refused(tmp_path, capsys, flags, message):
    (tmp_path / "runs" / "train" / "a.s1").mkdir(parents=True)
    (tmp_path / "runs" / "train" / "a.s1" / "checkpoint_1_3000.pt").touch()
    with pytest.raises(SystemExit):
        main([str(tmp_path), *flags])
    assert message in capsys.readouterr().err
