"""The language-model recipes' train.sh configs (valid fairseq commands with the papers' settings), then train.sh
and eval.sh end to end on the stand-in corpora (lm_recipe.py): one config per recipe shrunk to a few seconds,
scored on valid and test as the papers evaluate, and the Mogrifier's tuned softmax temperature."""

import re

import pytest
from conftest import training_arguments
from lm_recipe import CORPORA, raw_token_count
from recipe_runs import leftovers, ok, parse_commands, run_recipe

# ------------------------------------------------------------------------------------------ train.sh configs

# Every config of the three recipes' train.sh.
CONFIGS = [
    *(
        f"wikitext-103/{c}"
        for c in (
            "lstm_lm_standard_wt103",
            "lstm_lm_adaptive_wt103",
            "lstm_lm_define_wt103_n3",
            "lstm_lm_define_wt103_n7",
            "lstm_lm_define_wt103_n11",
            "transformer_lm_wiki103",
            "transformer_lm_define_wiki103",
        )
    ),
    *(f"{corpus}/{c}" for corpus in ("ptb", "wikitext-2") for c in ("awd_lstm_lm", "awd_lstm_lm_define")),
    "ptb/mogrifier_lstm_lm_ptb",
    "ptb/mogrifier_lstm_lm_baseline_ptb",
    "wikitext-2/mogrifier_lstm_lm_wt2",
    "wikitext-2/mogrifier_lstm_lm_baseline_wt2",
]
# The official code's learning rate and L2 penalty of each Mogrifier-paper config (lamb's tuned trials).
LAMB_LR_L2 = {
    "mogrifier_lstm_lm_ptb": ("0.0023", "0.000252"),
    "mogrifier_lstm_lm_baseline_ptb": ("0.00304", "0.000249"),
    "mogrifier_lstm_lm_wt2": ("0.00329", "0.00019"),
    "mogrifier_lstm_lm_baseline_wt2": ("0.00318", "0.000231"),
}

# Parses each config's fairseq-train command with fairseq's own parser (arch defaults applied, then the
# dataclass config built), and reads the learning rate per epoch from the scheduler the command asks for.
PARSE_COMMANDS = r"""
import json, sys
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler
result = {}
for name, argv in json.load(sys.stdin).items():
    try:
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        cfg = convert_namespace_to_omegaconf(args)
    except SystemExit as error:
        result[name] = {"error": f"argparse exit {error.code}"}
        continue
    info = {key: str(getattr(args, key, None)) for key in (
        "arch", "task", "criterion", "optimizer", "lr_scheduler", "max_epoch", "max_update", "batch_size",
        "batch_size_valid", "tokens_per_sample", "clip_norm", "weight_decay", "seed", "ddp_backend", "dropout",
        "variable_bptt", "awd_input_dropout", "awd_hidden_dropout", "awd_output_dropout",
        "awd_embed_dropout", "awd_weight_drop", "awd_ar_alpha", "awd_tar_beta", "define_n",
        "define_depth", "decoder_embed_dim", "decoder_layers", "adaptive_softmax_cutoff", "lr_patience",
        "lr_shrink", "save_dir", "max_tokens", "update_freq", "momentum", "adam_betas", "adam_eps",
        "sentence_avg", "mogrifier_l2_penalty", "mogrifier_drop_state_probability",
        "load_checkpoint_on_all_dp_ranks")}
    if args.lr_scheduler == "fixed":
        sgd = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
        scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, sgd)
        info["lr_by_epoch"] = [scheduler.step_begin_epoch(epoch) for epoch in range(1, 21)]
    else:
        info["lr"] = list(args.lr)
    result[name] = info
print(json.dumps(result))
"""


def dry_run(config, *extra, save_root="ck"):
    corpus, name = config.split("/")
    proc = ok(run_recipe(f"{corpus}/train.sh", "-n", "-d", "data", "-s", save_root, name, *extra))
    return training_arguments(proc.stdout)


def test_every_config_is_a_valid_fairseq_command_with_the_papers_settings():
    commands = {config: dry_run(config) for config in CONFIGS}
    commands["override"] = dry_run("ptb/awd_lstm_lm", "--max-epoch", "3", "--lr", "7", save_root="elsewhere")
    parsed = parse_commands(PARSE_COMMANDS, commands)
    errors = {config: info["error"] for config, info in parsed.items() if "error" in info}
    assert not errors, errors
    for config, info in parsed.items():
        # every GPU process reads checkpoint_last.pt itself (fairseq's broadcast of it fails with torch >= 2.6)
        assert info["load_checkpoint_on_all_dp_ranks"] == "True"
        if config == "override":
            continue
        corpus, name = config.split("/")
        assert info["save_dir"] == f"ck/{name}"  # one checkpoint folder per config
        # Table 9: SGD lr 20, / 10 after epoch 15, 20 epochs, BPTT 140, batch 60
        if corpus == "wikitext-103" and name.startswith("lstm_lm_"):
            assert info["lr_by_epoch"] == [20.0] * 15 + [2.0] * 5
            assert (info["task"], info["max_epoch"]) == ("stateful_lm", "20")
            assert (info["optimizer"], info["momentum"]) == ("nag", "0.0")  # plain SGD
            assert (info["tokens_per_sample"], info["batch_size"], info["batch_size_valid"]) == ("140", "60", "10")
            assert (info["weight_decay"], info["clip_norm"], info["dropout"]) == ("0.0", "0.25", "0.1")
            assert info["criterion"] == ("cross_entropy" if name == "lstm_lm_standard_wt103" else "adaptive_loss")
            if name != "lstm_lm_standard_wt103":
                assert info["ddp_backend"] == "legacy_ddp"
        elif name.startswith("transformer"):  # fairseq's adaptive-input recipe
            assert (info["task"], info["criterion"], info["optimizer"]) == ("language_modeling", "adaptive_loss", "nag")
            assert (info["max_update"], info["tokens_per_sample"], info["max_tokens"]) == ("286000", "3072", "3072")
        elif name in LAMB_LR_L2:  # the official Mogrifier code's settings (lamb's tuned configs)
            lr, l2 = LAMB_LR_L2[name]
            assert (info["task"], info["criterion"], info["sentence_avg"]) == (
                "stateful_lm",
                "lm_regularized_loss",
                "True",
            )
            assert (info["optimizer"], info["adam_betas"], info["adam_eps"]) == ("adam", "(0, 0.999)", "1e-08")
            assert (info["weight_decay"], info["clip_norm"], info["lr_scheduler"]) == ("0.0", "10.0", "fixed")
            assert info["lr_by_epoch"] == [float(lr)] * 20 and info["mogrifier_l2_penalty"] == l2
            assert (info["batch_size"], info["tokens_per_sample"], info["max_update"]) == ("64", "70", "200000")
            assert (info["seed"], info["mogrifier_drop_state_probability"]) == ("1", "0.01")
        else:  # AWD-LSTM's settings for the corpus
            batch, dropouti, dropouth, epochs, seed = {
                "ptb": ("20", "0.4", "0.25", "500", "141"),
                "wikitext-2": ("80", "0.65", "0.2", "750", "1882"),
            }[corpus]
            assert (info["task"], info["criterion"]) == ("stateful_lm", "lm_regularized_loss")
            assert (info["optimizer"], info["momentum"]) == ("nag", "0.0")
            assert info["lr"] == [30.0] and info["lr_scheduler"] == "reduce_lr_on_plateau"
            assert (info["batch_size"], info["batch_size_valid"], info["tokens_per_sample"]) == (batch, "10", "70")
            assert (info["max_epoch"], info["seed"], info["variable_bptt"]) == (epochs, seed, "True")
            assert (info["clip_norm"], info["weight_decay"]) == ("0.25", "1.2e-06")
            assert (info["awd_input_dropout"], info["awd_hidden_dropout"]) == (dropouti, dropouth)
            assert (info["awd_output_dropout"], info["awd_embed_dropout"]) == ("0.4", "0.1")
            assert info["awd_weight_drop"] == "0.5"
            assert (info["awd_ar_alpha"], info["awd_tar_beta"]) == ("2.0", "1.0")
    # arguments after the config win over the recipe's
    assert parsed["override"]["max_epoch"] == "3" and parsed["override"]["lr"] == [7.0]
    assert parsed["override"]["save_dir"] == "elsewhere/awd_lstm_lm"


def test_nag_without_momentum_is_plain_sgd():
    """The recipes' SGD is fairseq's nag with --momentum 0: the same steps as torch's SGD (with weight decay),
    also when the learning rate changes between steps. In float64: the two order their operations differently, and
    in float32 steps of 30 x the gradient leave rounding differences of a few units in the last place of values
    near 100, larger than a float32 tolerance for the smaller entries."""
    import torch
    from fairseq.optim.nag import NAG

    torch.manual_seed(0)
    start = torch.randn(5, 3, dtype=torch.float64)
    ours, reference = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    nag = NAG([ours], lr=30.0, momentum=0.0, weight_decay=1.2e-3)
    sgd = torch.optim.SGD([reference], lr=30.0, momentum=0.0, weight_decay=1.2e-3)
    for step, lr in enumerate([30.0, 30.0, 3.0, 0.3]):
        for optimizer in (nag, sgd):
            optimizer.param_groups[0]["lr"] = lr
        grad = torch.randn(5, 3).double()  # float32 values: nag reads the gradient in float32, losslessly
        ours.grad, reference.grad = grad.clone(), grad.clone()
        nag.step()
        sgd.step()
        torch.testing.assert_close(ours.data, reference.data, rtol=1e-10, atol=1e-10, msg=f"step {step}")


# ------------------------------------------------------------------------------------- train.sh + eval.sh

# Tiny models: the arch's structure with small widths, the recipe's optimisation settings, one epoch on CPU.
TINY = {
    "wikitext-103/lstm_lm_define_wt103_n3": (
        "--define-n 16 --decoder-embed-dim 16 --define-k 32 --decoder-hidden-size 32 --decoder-layers 2 "
        "--adaptive-input-cutoff 20,40 --adaptive-softmax-cutoff 20,40 --batch-size 4 --tokens-per-sample 35 "
        "--max-epoch 1"
    ).split(),
    "wikitext-103/transformer_lm_define_wiki103": (
        "--decoder-layers 1 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2 "
        "--define-n 16 --define-k 32 --adaptive-input-cutoff 20,40 --adaptive-softmax-cutoff 20,40 "
        "--tokens-per-sample 64 --max-tokens 256 --update-freq 1 --max-update 2 --warmup-updates 1"
    ).split(),
    "ptb/awd_lstm_lm": (
        "--define-n 16 --decoder-embed-dim 16 --decoder-hidden-size 32 --decoder-layers 2 --max-epoch 1"
    ).split(),
    "wikitext-2/awd_lstm_lm_define": (
        "--define-n 16 --define-k 32 --define-depth 3 --decoder-embed-dim 16 --decoder-hidden-size 32 "
        "--decoder-layers 2 --batch-size 10 --max-epoch 1"
    ).split(),
}
# (--data-buffer-size 0: batches collated in the main thread, see SHUTDOWN_ABORT in conftest.py)
CPU = ["--cpu", "--num-workers", "0", "--data-buffer-size", "0"]
# the transformer's evaluation blocks (3072 tokens, context 2560) shrunk to the tiny model's 64 positions
EVAL_EXTRA = {
    "wikitext-103/transformer_lm_define_wiki103": "--tokens-per-sample 64 --context-window 32 --max-tokens 256".split()
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(TINY))
def test_train_then_eval(config, lm_prepared, tmp_path):
    corpus, name = config.split("/")
    data_dir = lm_prepared[corpus][0]
    save_root = tmp_path / "checkpoints"
    proc = ok(run_recipe(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU))
    save_dir = save_root / name
    assert (save_dir / "checkpoint_best.pt").is_file() and (save_dir / "checkpoint_last.pt").is_file()
    assert "done training" in (save_dir / "train.log").read_text()
    assert (save_dir / ".done" / "train").is_file()
    # a rerun does not train again
    stamp = (save_dir / "checkpoint_last.pt").stat().st_mtime_ns
    proc = ok(run_recipe(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU))
    assert "skip training" in proc.stdout and "done training" not in proc.stdout
    assert (save_dir / "checkpoint_last.pt").stat().st_mtime_ns == stamp
    if config == "ptb/awd_lstm_lm":  # an unfinished run (no marker) resumes from checkpoint_last.pt
        (save_dir / ".done" / "train").unlink()
        ok(
            run_recipe(
                f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU, "--max-epoch", "2"
            )
        )
        log = (save_dir / "train.log").read_text()
        assert "Loaded checkpoint" in log and "| epoch 002 |" in log and "| epoch 001 |" in log
        assert log.count("done training") == 2 and (save_dir / ".done" / "train").is_file()

    extra = EVAL_EXTRA.get(config, []) + ["--cpu"]
    proc = ok(run_recipe(f"{corpus}/eval.sh", "-d", data_dir, "-s", save_root, name, *extra))
    files = CORPORA[corpus][4][1:]  # valid, test
    results = save_dir / "checkpoint_best.eval.txt"
    assert results.read_text().splitlines()[1:] == proc.stdout.strip().splitlines()[-2:]
    for split, name_of_file in zip(("valid", "test"), files):
        match = re.search(rf"^{split} +perplexity ([0-9.]+) +\(loss ([0-9.]+) bits/token", proc.stdout, re.M)
        assert match, proc.stdout
        ppl, loss = map(float, match.groups())
        assert ppl == pytest.approx(2**loss, rel=1e-3)
        assert 1 < ppl < 10 * 200  # a barely trained model on a ~200-word vocabulary
        # every token of the split was scored once, as a plain count of the raw text says
        log = (save_dir / f"checkpoint_best.eval.{split}.log").read_text()
        evaluated = int(re.search(r"Evaluated ([0-9,]+) tokens", log).group(1).replace(",", ""))
        assert evaluated == raw_token_count(data_dir / CORPORA[corpus][3] / name_of_file)
        if not name.startswith("transformer"):  # the paper's evaluation batches: valid 10 streams, test 1
            assert f"--batch-size {10 if split == 'valid' else 1}" in results.read_text().splitlines()[0]
    # the same checkpoint given as a file reuses the results; FORCE=1 recomputes the same numbers
    again = ok(run_recipe(f"{corpus}/eval.sh", "-d", data_dir, save_dir / "checkpoint_best.pt", *extra))
    assert "skip evaluation" in again.stdout
    assert again.stdout.strip().splitlines()[-2:] == proc.stdout.strip().splitlines()[-2:]
    if config == "ptb/awd_lstm_lm":
        forced = ok(run_recipe(f"{corpus}/eval.sh", "-d", data_dir, "-s", save_root, name, *extra, env={"FORCE": "1"}))
        assert "skip" not in forced.stdout
        assert forced.stdout.strip().splitlines()[-2:] == proc.stdout.strip().splitlines()[-2:]
    assert not leftovers(save_dir)


# A Mogrifier config, tiny: train.sh, then eval.sh with and without the softmax temperature tuned on valid.
MOGRIFIER_TINY = (
    "--mogrifier-hidden-size 16 --mogrifier-rank 4 --batch-size 8 --batch-size-valid 8 --tokens-per-sample 35 "
    "--max-update 3"
).split()


@pytest.mark.slow
def test_mogrifier_eval_reports_perplexity_without_and_with_the_tuned_temperature(lm_prepared, tmp_path):
    data_dir = lm_prepared["ptb"][0]
    save_root = tmp_path / "checkpoints"
    ok(run_recipe("ptb/train.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", *MOGRIFIER_TINY, *CPU))
    save_dir = save_root / "mogrifier_lstm_lm_ptb"
    assert "done training" in (save_dir / "train.log").read_text()
    env = {"TEMPERATURES": "1.0 1.7"}
    proc = ok(run_recipe("ptb/eval.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", "--cpu", env=env))
    searched = {
        float(t): float(ppl)
        for t, ppl in re.findall(r"^ +T = ([0-9.]+): valid perplexity ([0-9.]+)$", proc.stdout, re.M)
    }
    assert set(searched) == {1.0, 1.7}
    best = min(searched, key=searched.get)
    tail = proc.stdout.strip().splitlines()[-7:]
    assert tail[1] == "without softmax temperature (T = 1):"
    assert tail[4] == "with the softmax temperature tuned on valid (the Mogrifier paper's protocol):"
    plain = {line.split()[0]: float(line.split()[2]) for line in tail[2:4]}
    tuned = {line.split()[0]: float(line.split()[2]) for line in tail[5:]}
    assert list(plain) == list(tuned) == ["valid", "test"]
    assert tuned["valid"] == searched[best] == min(searched.values())
    assert plain["valid"] == pytest.approx(searched[1.0], rel=1e-3)  # T = 1 through --model-overrides: no change
    assert tail[0].startswith("==> results of ") and f"softmax temperature T = {best}, tuned on valid" in tail[-1]
    test_log = next(save_dir.glob("checkpoint_best.eval.temperature.test.T*.log"))
    assert float(re.search(r"\.T([0-9.]+)\.log$", test_log.name).group(1)) == best
    assert "Perplexity" in test_log.read_text()
    if best != 1.0:
        assert tuned["test"] != plain["test"]
    # a rerun reuses both results
    again = ok(run_recipe("ptb/eval.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", "--cpu", env=env))
    assert "skip evaluation" in again.stdout and "skip temperature search" in again.stdout
    assert again.stdout.strip().splitlines()[-7:] == tail
    assert not leftovers(save_dir)
