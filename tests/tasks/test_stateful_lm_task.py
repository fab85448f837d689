"""--task stateful_lm: the batches against a plain re-computation, carried state, sharding, eval-lm and errors."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import ADAM, USER_DIR, fairseq_train, run_cli

import define_fairseq  # noqa: F401  (registers the task)
from define_fairseq.tasks.bptt_windows import BPTTWindows
from define_fairseq.tasks.stateful_lm import check_model_carries_state, window_schedule


def setup_task(data, *argv, arch="lstm_lm"):
    """``(cfg, task)`` exactly as fairseq-train builds them from ``argv`` (``--arch`` only to satisfy the parser)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data), "--user-dir", USER_DIR, "--task", "stateful_lm", "--arch", arch, *map(str, argv)]
    )
    cfg = convert_namespace_to_omegaconf(args)
    return cfg, tasks.setup_task(cfg.task)


def split_tokens(data, split):
    """The split's binarized lines concatenated, as a Python list."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(Path(data) / split), None)
    return torch.cat([dataset[i] for i in range(len(dataset))]).tolist()


def reference_rows(tokens, num_rows, keep_remainder, eos, pad):
    """Plain re-computation of the layout: ``(inputs, targets)``, both ``[R, L]``.

    The targets are the split's tokens cut into R rows of L (dropping the remainder, or padding the end); each
    input is the token before its target, the first one of the split being preceded by EOS.
    """
    n = len(tokens)
    length = math.ceil(n / num_rows) if keep_remainder else n // num_rows
    stream = [eos] + list(tokens)
    stream += [pad] * max(0, num_rows * length + 1 - len(stream))
    inputs = [stream[j * length : (j + 1) * length] for j in range(num_rows)]
    targets = [stream[j * length + 1 : (j + 1) * length + 1] for j in range(num_rows)]
    return torch.tensor(inputs), torch.tensor(targets)


def epoch_batches(task, split, rows, epoch=1, num_shards=1, shard_id=0):
    itr = task.get_batch_iterator(
        task.dataset(split), max_sentences=rows, num_shards=num_shards, shard_id=shard_id, epoch=epoch
    )
    return list(itr.next_epoch_itr(shuffle=True))  # shuffle=True is what fairseq-train asks for


class TinyLSTMLM(nn.Module):
    """A plain-torch LSTM LM following the carried-state protocol of the plugin's recurrent models.

    ``reset_state`` None: zero state, nothing kept; True: zero state, keep the final one; False: continue from the
    kept state of the current mode (train/eval). Returns logits ``[B, T, V]``.
    """

    def __init__(self, vocab_size, dim=8, hidden=12):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)
        self.kept = {}
        for p in self.parameters():  # large weights: a long memory, so that the state matters
            nn.init.normal_(p, std=1.0)

    def forward(self, src_tokens, src_lengths=None, reset_state=None, incremental_state=None):
        state = self.kept.get(self.training) if reset_state is False else None
        if state is not None and state[0].size(1) != src_tokens.size(0):
            state = None
        features, (h, c) = self.lstm(self.embed(src_tokens), state)
        if reset_state is not None:
            self.kept[self.training] = (h.detach(), c.detach())
        return self.out(features), {}


def summed_nll(logits, target, pad):
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=pad, reduction="sum"
    ).item()


@pytest.fixture(scope="module")
def task(lm_data):
    _, task = setup_task(lm_data, "--batch-size", 4, "--tokens-per-sample", 10, "--variable-bptt")
    for split in ("train", "valid", "test"):
        task.load_dataset(split)
    return task


@pytest.mark.parametrize("split,rows", [("train", 4), ("valid", 3), ("test", 5)])
def test_fixed_windows_reproduce_the_rows(lm_data, split, rows):
    _, task = setup_task(lm_data, "--batch-size", rows, "--tokens-per-sample", 7)
    task.load_dataset(split)
    d = task.source_dictionary
    tokens = split_tokens(lm_data, split)
    training = split == "train"
    inputs, targets = reference_rows(tokens, rows, keep_remainder=not training, eos=d.eos(), pad=d.pad())
    length = inputs.size(1)

    batches = epoch_batches(task, split, rows)
    assert len(batches) == math.ceil(length / 7)
    for i, batch in enumerate(batches):
        width = min(7, length - 7 * i)  # the last window is shorter
        src = batch["net_input"]["src_tokens"]
        assert src.shape == batch["target"].shape == (rows, width)
        assert torch.equal(src, inputs[:, 7 * i : 7 * i + width])
        assert torch.equal(batch["target"], targets[:, 7 * i : 7 * i + width])
        assert batch["net_input"]["reset_state"] is (i == 0)
        assert batch["net_input"]["src_lengths"].tolist() == [width] * rows
        assert batch["nsentences"] == rows and batch["id"].tolist() == list(range(rows))
        assert batch["ntokens"] == int(batch["target"].ne(d.pad()).sum())

    all_inputs = torch.cat([b["net_input"]["src_tokens"] for b in batches], dim=1)
    all_targets = torch.cat([b["target"] for b in batches], dim=1)
    # nothing lost at window ends: the targets of a row are its inputs shifted by one
    assert torch.equal(all_targets[:, :-1], all_inputs[:, 1:])
    real = all_targets[all_targets.ne(d.pad())].tolist()  # row-major: row 0, then row 1, ...
    if training:  # AWD-LSTM's batchify: the remainder (< rows tokens) is dropped
        assert real == tokens[: rows * length] and len(tokens) - len(real) < rows
    else:  # evaluation: every token of the split is a target exactly once, in order
        assert real == tokens


def test_variable_bptt_is_deterministic_per_epoch_and_tiles_the_rows(lm_data, task):
    d = task.source_dictionary
    inputs, targets = reference_rows(split_tokens(lm_data, "train"), 4, False, d.eos(), d.pad())
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=4, epoch=1)
    epochs = [list(itr.next_epoch_itr(shuffle=True)) for _ in range(2)]  # one iterator, as fairseq-train reuses
    lengths = [[b["net_input"]["src_tokens"].size(1) for b in batches] for batches in epochs]

    assert lengths[0] != lengths[1]  # a new schedule every epoch
    assert lengths[0] == [b["net_input"]["src_tokens"].size(1) for b in epoch_batches(task, "train", 4, epoch=1)]
    assert lengths[1] == [b["net_input"]["src_tokens"].size(1) for b in epoch_batches(task, "train", 4, epoch=2)]
    assert len(set(lengths[0])) > 3  # really variable
    for batches, lens in zip(epochs, lengths):
        assert all(5 <= n <= 20 for n in lens[:-1]) and 1 <= lens[-1] <= 20  # max(5, .), capped at 2 T
        assert [b["net_input"]["reset_state"] for b in batches] == [True] + [False] * (len(batches) - 1)
        # the windows tile the rows: no gap, no overlap
        assert torch.equal(torch.cat([b["net_input"]["src_tokens"] for b in batches], dim=1), inputs)
        assert torch.equal(torch.cat([b["target"] for b in batches], dim=1), targets)

    # another seed, another schedule; validation never varies
    _, other = setup_task(lm_data, "--batch-size", 4, "--tokens-per-sample", 10, "--variable-bptt", "--seed", 7)
    other.load_dataset("train")
    assert [b["net_input"]["src_tokens"].size(1) for b in epoch_batches(other, "train", 4)] != lengths[0]
    valid = [b["net_input"]["src_tokens"].size(1) for b in epoch_batches(task, "valid", 4, epoch=3)]
    assert valid[:-1] == [10] * (len(valid) - 1)


def test_window_schedule_follows_awd_lstm():
    windows = window_schedule(200000, 70, variable=True, std=5.0, seed=3, epoch=1)
    lengths = [n for _, n in windows]
    assert [s for s, _ in windows] == [sum(lengths[:i]) for i in range(len(lengths))]
    assert sum(lengths) == 200000
    assert all(5 <= n <= 140 for n in lengths[:-1])
    short = sum(n < 52 for n in lengths) / len(lengths)  # base T/2 = 35 (+- 3.4 std) with probability 0.05
    assert 0.03 < short < 0.07
    assert 66 < sum(n for n in lengths if n >= 52) / sum(n >= 52 for n in lengths) < 70  # int() floors ~0.5
    assert window_schedule(23, 10) == [(0, 10), (10, 10), (20, 3)]


def test_resuming_mid_epoch_gives_the_remaining_batches(task):
    dataset = task.dataset("train")
    itr = task.get_batch_iterator(dataset, max_sentences=4, epoch=2)
    epoch = itr.next_epoch_itr(shuffle=True)
    for _ in range(5):
        next(epoch)
    state = itr.state_dict()
    rest = [b["net_input"]["src_tokens"] for b in epoch]

    resumed = task.get_batch_iterator(dataset, max_sentences=4, epoch=1)
    resumed.load_state_dict(state)
    again = list(resumed.next_epoch_itr(shuffle=True))
    assert len(again) == len(rest) and all(torch.equal(a["net_input"]["src_tokens"], b) for a, b in zip(again, rest))
    assert not any(b["net_input"]["reset_state"] for b in again)


@pytest.mark.parametrize("split", ["train", "valid"])
def test_two_shards_partition_the_global_rows(lm_data, task, split):
    d = task.source_dictionary
    inputs, targets = reference_rows(split_tokens(lm_data, split), 4, split != "train", d.eos(), d.pad())
    shards = [epoch_batches(task, split, 2, epoch=3, num_shards=2, shard_id=r) for r in range(2)]
    assert len(shards[0]) == len(shards[1])
    for a, b in zip(*shards):
        assert a["net_input"]["src_tokens"].shape == b["net_input"]["src_tokens"].shape  # same (variable) windows
        assert a["net_input"]["reset_state"] == b["net_input"]["reset_state"]
    for r, batches in enumerate(shards):
        assert batches[0]["id"].tolist() == [2 * r, 2 * r + 1]
        assert torch.equal(torch.cat([b["net_input"]["src_tokens"] for b in batches], dim=1), inputs[2 * r : 2 * r + 2])
        assert torch.equal(torch.cat([b["target"] for b in batches], dim=1), targets[2 * r : 2 * r + 2])


@pytest.mark.parametrize("split,rows", [("train", 4), ("valid", 3)])
def test_carried_state_equals_one_pass_over_each_row(lm_data, task, split, rows):
    d = task.source_dictionary
    torch.manual_seed(0)
    model = TinyLSTMLM(len(d)).double().eval()
    check_model_carries_state(model)
    inputs, targets = reference_rows(split_tokens(lm_data, split), rows, split != "train", d.eos(), d.pad())
    with torch.no_grad():
        whole = sum(summed_nll(model(inputs[j : j + 1])[0], targets[j : j + 1], d.pad()) for j in range(rows))
        batches = epoch_batches(task, split, rows, epoch=2)
        assert len(batches) > 5
        carried = sum(summed_nll(model(**b["net_input"])[0], b["target"], d.pad()) for b in batches)
        reset = sum(
            summed_nll(model(**{**b["net_input"], "reset_state": True})[0], b["target"], d.pad()) for b in batches
        )
    assert carried == pytest.approx(whole, rel=1e-10)
    assert abs(reset - whole) > 1e-2 * whole


def test_eval_lm_dataloader_yields_every_token_once(lm_data, task):
    d = task.source_dictionary
    tokens = split_tokens(lm_data, "test")
    for rows in (1, 3):
        batches = list(task.eval_lm_dataloader(task.dataset("test"), batch_size=rows, num_workers=0))
        assert [b["net_input"]["reset_state"] for b in batches] == [True] + [False] * (len(batches) - 1)
        assert all(b["net_input"]["src_tokens"].size(1) == 10 for b in batches[:-1])
        targets = torch.cat([b["target"] for b in batches], dim=1)
        assert targets[targets.ne(d.pad())].tolist() == tokens
        assert sum(b["ntokens"] for b in batches) == len(tokens)
    with pytest.raises(ValueError, match="--context-window"):
        task.eval_lm_dataloader(task.dataset("test"), batch_size=1, context_window=5)


def test_bad_inputs_raise_clear_errors(lm_data, tmp_path, task):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        setup_task(tmp_path / "missing", "--batch-size", 2)
    with pytest.raises(FileNotFoundError, match="dict.txt"):
        setup_task(tmp_path, "--batch-size", 2)
    with pytest.raises(FileNotFoundError, match="'nosuch'.*fairseq-preprocess"):
        task.load_dataset("nosuch")
    with pytest.raises(ValueError, match="fewer than the 100000 streams.*--batch-size-valid"):
        task.get_batch_iterator(task.dataset("valid"), max_sentences=100000)
    with pytest.raises(ValueError, match="fewer than the 100000 streams.*--batch-size 50000 x 2"):
        task.get_batch_iterator(task.dataset("train"), max_sentences=50000, num_shards=2)
    with pytest.raises(ValueError, match="--tokens-per-sample"):
        setup_task(lm_data, "--batch-size", 2, "--tokens-per-sample", 0)
    windows = BPTTWindows(task.dataset("train").stream, 4, (0, 4), keep_remainder=False, pad=1)
    with pytest.raises(ValueError, match="one window of all rows, got 2 windows"):
        windows.collater([windows[windows.code(0, 3)], windows[windows.code(3, 3)]])

    cfg, unbatched = setup_task(lm_data, "--max-tokens", 100)
    unbatched.load_dataset("test")
    with pytest.raises(ValueError, match="needs --batch-size"):
        unbatched.get_batch_iterator(unbatched.dataset("test"), max_tokens=100)
    with pytest.raises(ValueError, match="needs --batch-size"):
        unbatched.eval_lm_dataloader(unbatched.dataset("test"), batch_size=None)

    # fairseq's own LSTM LM has no reset_state: it cannot carry state, so build_model refuses it
    cfg, stateless = setup_task(
        lm_data,
        "--batch-size",
        2,
        "--decoder-embed-dim",
        8,
        "--decoder-hidden-size",
        8,
        "--decoder-out-embed-dim",
        8,
        arch="lstm_lm",
    )
    with pytest.raises(ValueError, match="stateful_lm.*reset_state.*--task language_modeling"):
        stateless.build_model(cfg.model)


TINY_LSTM = ["--decoder-embed-dim", "16", "--decoder-hidden-size", "32", "--decoder-layers", "2"]
TINY_LSTM += ["--input-layer", "table"]


def test_train_and_eval_lm_through_the_cli(lm_data, tmp_path):
    flags = (*TINY_LSTM, "--criterion", "cross_entropy", *ADAM, "--batch-size", 32, "--tokens-per-sample", 30)
    flags += ("--variable-bptt", "--max-epoch", 2, "--no-save-optimizer-state")
    out = fairseq_train(lm_data, tmp_path, "lstm_lm_define", *flags, task="stateful_lm").stdout
    # fairseq-train ran exactly the task's schedule of each epoch
    row_length = len(split_tokens(lm_data, "train")) // 32
    per_epoch = [len(window_schedule(row_length, 30, True, 5.0, seed=1, epoch=e)) for e in (1, 2)]
    updates = [int(n) for n in re.findall(r"\| train \| epoch \d+ .*?\| num_updates (\d+)", out)]
    assert updates == [per_epoch[0], sum(per_epoch)]
    assert len(re.findall(r"\| valid \| epoch \d+ .*\| loss [\d.]+", out)) == 2

    def eval_lm(*flags):
        proc = run_cli(
            "fairseq-eval-lm",
            lm_data,
            "--user-dir",
            USER_DIR,
            "--task",
            "stateful_lm",
            "--path",
            tmp_path / "checkpoint_last.pt",
            "--gen-subset",
            "test",
            "--cpu",
            "--num-workers",
            0,
            "--no-progress-bar",
            *flags,
        )
        text = proc.stdout + proc.stderr
        evaluated = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
        return evaluated, float(re.search(r"Loss \(base 2\): ([\d.]+)", text).group(1))

    tokens = split_tokens(lm_data, "test")
    evaluated, loss = eval_lm("--batch-size", 2, "--tokens-per-sample", 5)
    assert evaluated == len(tokens)  # every token once

    # re-computation: one forward over each of the two whole rows, from zero state
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "checkpoint_last.pt")])
    model = models[0].eval()
    pad = model.decoder.dictionary.pad()
    inputs, targets = reference_rows(tokens, 2, True, model.decoder.dictionary.eos(), pad)
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(inputs), log_probs=True)
    scores = lprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[targets.ne(pad)]
    assert scores.numel() == len(tokens)
    assert loss == pytest.approx(-scores.sum().item() / len(tokens) / math.log(2), abs=2e-4)


def test_bptt_std_sets_the_spread_of_the_variable_windows(lm_data):
    common = ("--batch-size", 4, "--tokens-per-sample", 10, "--variable-bptt")
    tasks = [setup_task(lm_data, *common, "--bptt-std", 3.0)[1], setup_task(lm_data, *common)[1]]
    for task in tasks:
        task.load_dataset("train")
    lengths = [[b["net_input"]["src_tokens"].size(1) for b in epoch_batches(task, "train", 4)] for task in tasks]
    assert lengths[0] != lengths[1] and len(set(lengths[0])) > 3
    assert tasks[0].bptt_std == 3.0 and tasks[1].bptt_std == 5.0
