"""average_checkpoints on real checkpoints: the mean of the weights computed by hand, each dtype kept, the last
checkpoints chosen by number, the command and fairseq-generate on its output, and its errors."""

import pytest
import torch
from arch_cases import TRANSLATION as TINY_MODEL
from conftest import TRAIN_FLAGS, USER_DIR, run_cli, run_module
from lm_helpers import generate

from define_fairseq.tools import average_checkpoints as avg


@pytest.fixture(scope="module")
def save_dir(translation_data, tmp_path_factory):
    """checkpoint_1_1.pt .. checkpoint_1_4.pt of a tiny transformer_define."""
    directory = tmp_path_factory.mktemp("updates")
    run_cli(
        "fairseq-train",
        translation_data,
        "--user-dir",
        USER_DIR,
        "--arch",
        "transformer_define",
        *TINY_MODEL,
        *TRAIN_FLAGS,
        "--max-update",
        "4",
        "--save-dir",
        directory,
        "--save-interval-updates",
        "1",
        "--keep-interval-updates",
        "5",
        "--disable-validation",
    )
    assert sorted(p.name for p in directory.glob("checkpoint_*_*.pt")) == [f"checkpoint_1_{u}.pt" for u in range(1, 5)]
    return directory


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def mean_by_hand(models):
    """Sum in float64 in the given order, divide, cast back; non-floating entries from the first model."""
    out = {}
    for key, value in models[0].items():
        if value.is_floating_point():
            total = models[0][key].double()
            for model in models[1:]:
                total = total + model[key].double()
            out[key] = (total / len(models)).to(value.dtype)
        else:
            out[key] = value
    return out


def assert_same_model(actual, expected):
    assert list(actual) == list(expected)
    for key in expected:
        assert actual[key].dtype == expected[key].dtype, key
        assert torch.equal(actual[key], expected[key]), key


def test_average_of_real_checkpoints(save_dir, tmp_path):
    paths = [save_dir / f"checkpoint_1_{u}.pt" for u in (4, 2, 3)]  # the newest is not the last given
    states = [load(p) for p in paths]
    assert all("last_optimizer_state" in s for s in states)
    avg.average_checkpoints(paths, tmp_path / "avg.pt")
    out = load(tmp_path / "avg.pt")
    assert_same_model(out["model"], mean_by_hand([s["model"] for s in states]))
    key = "encoder.layers.0.fc1.weight"
    assert all(not torch.equal(out["model"][key], s["model"][key]) for s in states)  # really an average
    assert out["averaged_from"] == ["checkpoint_1_4.pt", "checkpoint_1_2.pt", "checkpoint_1_3.pt"]
    assert "last_optimizer_state" not in out
    assert out["optimizer_history"] == states[0]["optimizer_history"]  # the newest input's (4 updates)
    assert out["optimizer_history"][-1]["num_updates"] == 4
    assert out["cfg"] == states[0]["cfg"] and out["extra_state"].keys() == states[0]["extra_state"].keys()
    assert_same_model(avg.average_state_dicts([s["model"] for s in states]), out["model"])


def test_average_checkpoints_command_and_fairseq_generate(save_dir, translation_data, tmp_path):
    out = tmp_path / "averaged.pt"
    proc = run_module("define_fairseq.tools.average_checkpoints", "--dir", save_dir, "--last", "3", "--output", out)
    names = "checkpoint_1_2.pt, checkpoint_1_3.pt, checkpoint_1_4.pt"
    assert proc.stdout.strip() == f"averaged 3 checkpoints: {names} -> {out}"
    models = [load(save_dir / f"checkpoint_1_{u}.pt")["model"] for u in (2, 3, 4)]
    assert_same_model(load(out)["model"], mean_by_hand(models))
    assert not (tmp_path / "averaged.pt.tmp").exists()
    # the averaged checkpoint translates every test sentence with the stock fairseq-generate
    assert sum(line.startswith("H-") for line in generate(translation_data, out)) == 20


def test_average_keeps_each_dtype(save_dir, tmp_path):
    base = load(save_dir / "checkpoint_1_4.pt")
    generator = torch.Generator().manual_seed(0)
    paths, models = [], []
    for i, dtype in enumerate([torch.bfloat16] * 3):
        model = {
            k: (v + 0.01 * (i + 1) * torch.randn(v.shape, generator=generator)).to(dtype)
            if v.is_floating_point()
            else v
            for k, v in base["model"].items()
        }
        state = dict(base, model=model)
        paths.append(tmp_path / f"bf16_{i}.pt")
        torch.save(state, paths[-1])
        models.append(model)
    avg.average_checkpoints(paths, tmp_path / "bf16.pt")
    averaged = load(tmp_path / "bf16.pt")["model"]
    assert all(v.dtype == torch.bfloat16 for v in averaged.values() if v.is_floating_point())
    assert_same_model(averaged, mean_by_hand(models))
    # mixed dtypes in one state dict, an integer buffer copied, a float64 one
    a = {
        "w": torch.tensor([1.0, 2.0]),
        "h": torch.tensor([1.0, 3.0], dtype=torch.float16),
        "b": torch.tensor([0.5, 1.5], dtype=torch.bfloat16),
        "n": torch.tensor([7, 8]),
        "d": torch.tensor([1.0], dtype=torch.float64),
    }
    b = {
        "w": torch.tensor([2.0, 4.0]),
        "h": torch.tensor([2.0, 4.0], dtype=torch.float16),
        "b": torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
        "n": torch.tensor([7, 8]),
        "d": torch.tensor([2.0], dtype=torch.float64),
    }
    out = avg.average_state_dicts([a, b])
    assert_same_model(
        out,
        {
            "w": torch.tensor([1.5, 3.0]),
            "h": torch.tensor([1.5, 3.5], dtype=torch.float16),
            "b": torch.tensor([0.75, 1.75], dtype=torch.bfloat16),
            "n": torch.tensor([7, 8]),
            "d": torch.tensor([1.5], dtype=torch.float64),
        },
    )
    assert torch.equal(a["w"], torch.tensor([1.0, 2.0]))  # inputs untouched
    with pytest.raises(avg.CheckpointError, match=r"'n'.*differs"):
        avg.average_state_dicts([a, dict(b, n=torch.tensor([7, 9]))])
    with pytest.raises(avg.CheckpointError, match=r"'b' has dtype torch.float32"):
        avg.average_state_dicts([a, dict(b, b=b["b"].float())])


def test_last_checkpoints_by_number(tmp_path):
    for name in [
        "checkpoint_1_10.pt",
        "checkpoint_2_20.pt",
        "checkpoint_10_100.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
        "checkpoint.best_loss_2.31.pt",
        "checkpoint3.pt",
        "checkpoint12.pt",
        "checkpoint9.pt",
        "checkpoint_1_5.pt.tmp",
        "notes.txt",
    ]:
        (tmp_path / name).write_bytes(b"")
    names = lambda paths: [p.name for p in paths]  # noqa: E731
    assert names(avg.last_checkpoints(tmp_path, 2)) == ["checkpoint_2_20.pt", "checkpoint_10_100.pt"]
    assert names(avg.last_checkpoints(tmp_path, 3, epochs=True)) == [
        "checkpoint3.pt",
        "checkpoint9.pt",
        "checkpoint12.pt",
    ]
    assert names(avg.last_checkpoints(tmp_path, 1, epochs=True)) == ["checkpoint12.pt"]
    with pytest.raises(avg.CheckpointError) as error:
        avg.last_checkpoints(tmp_path, 4)
    message = str(error.value)
    assert "has 3 update checkpoints checkpoint_<epoch>_<updates>.pt" in message
    assert "checkpoint_10_100.pt" in message and "--save-interval-updates" in message
    assert "--keep-interval-updates" in message and "--epochs" in message
    with pytest.raises(avg.CheckpointError, match="--no-epoch-checkpoints"):
        avg.last_checkpoints(tmp_path, 4, epochs=True)


def test_average_checkpoints_errors(save_dir, tmp_path, capsys):
    good = save_dir / "checkpoint_1_3.pt"
    state = load(save_dir / "checkpoint_1_4.pt")
    key = "decoder.layers.0.fc1.bias"
    torch.save(dict(state, model=dict(state["model"], **{key: state["model"][key][:-1]})), tmp_path / "shape.pt")
    cfg = dict(state["cfg"], model=dict(state["cfg"]["model"], _name="transformer"))
    torch.save(dict(state, cfg=cfg), tmp_path / "arch.pt")
    extra = dict(state["model"], **{"encoder.extra": torch.zeros(2)})
    torch.save(dict(state, model=extra), tmp_path / "extra.pt")
    torch.save({"weights": {}}, tmp_path / "nomodel.pt")
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    out = tmp_path / "out.pt"
    cases = [
        ([good, tmp_path / "shape.pt"], rf"shape\.pt: '{key}' has shape \(63,\) but \(64,\) in .*checkpoint_1_3"),
        ([good, tmp_path / "arch.pt"], r"arch\.pt is a checkpoint of arch 'transformer' but .*checkpoint_1_3"),
        ([good, tmp_path / "extra.pt"], r"extra\.pt has a parameter 'encoder.extra'"),
        ([tmp_path / "extra.pt", good], r"checkpoint_1_3\.pt has no parameter 'encoder.extra'"),
        ([good, tmp_path / "nomodel.pt"], r"nomodel\.pt is not a fairseq checkpoint"),
        ([good, tmp_path / "text.pt"], r"text\.pt cannot be read as a PyTorch checkpoint"),
        ([good, tmp_path / "missing.pt"], r"checkpoint .*missing\.pt does not exist"),
    ]
    for inputs, pattern in cases:
        with pytest.raises(SystemExit, match=r"^error: .*" + pattern):
            avg.main(["--inputs", *map(str, inputs), "--output", str(out)])
        assert not out.exists() and not (tmp_path / "out.pt.tmp").exists()
    with pytest.raises(SystemExit, match=r"has 4 update checkpoints .* fewer than --last 5"):
        avg.main(["--dir", str(save_dir), "--last", "5", "--output", str(out)])
    for argv, flag in (
        (["--inputs", str(good), str(good)], "given twice"),
        (["--dir", str(save_dir)], "--last"),
        (["--inputs", str(good), "--last", "2"], "--last"),
        (["--dir", str(save_dir), "--last", "0"], "--last"),
        (["--inputs", str(good), "--output", str(tmp_path / "no" / "x.pt")], "does not exist"),
    ):
        with pytest.raises(SystemExit) as error:
            avg.main(argv if "--output" in argv else argv + ["--output", str(out)])
        assert error.value.code == 2 and flag in capsys.readouterr().err, argv
    assert not out.exists()
