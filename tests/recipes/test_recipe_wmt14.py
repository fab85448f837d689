"""The WMT14 En-De recipe's train.sh commands (the paper's settings for any number of GPUs), then the whole chain
offline (wmt14_recipe.py): train.sh (tiny models, CPU, a few updates, one of them in bfloat16) -> average.sh ->
eval.sh, whose BLEU files are checked against the hypotheses and references they were computed from; the
SentencePiece option; the recipe's model from Python and fairseq-interactive."""

import json
import re
import subprocess

import pytest
import torch
from conftest import BIN, REPO, training_arguments
from recipe_runs import leftovers, ok, parse_commands
from wmt14_recipe import BPE_SIZE, TESTSETS, TINY, TINY_DEFINE, binarized, mirror_env, normalize, read_lines, run_script

# ------------------------------------------------------------------------------------------ train.sh commands

PARSE = r"""
import json, sys
from fairseq import options
from define_fairseq.tools.train import parse_args
result = {}
for name, argv in json.load(sys.stdin).items():
    program, argv = argv[0], argv[1:]
    args = parse_args(argv) if program == "define_fairseq.tools.train" else \
        options.parse_args_and_arch(options.get_training_parser(), argv)
    result[name] = {key: str(getattr(args, key, None)) for key in (
        "arch", "share_all_embeddings", "optimizer", "adam_betas", "adam_eps", "lr", "lr_scheduler",
        "warmup_updates", "warmup_init_lr", "criterion", "label_smoothing", "dropout", "max_tokens", "update_freq",
        "distributed_world_size", "max_update", "fp16", "bf16", "tpu", "clip_norm", "save_dir", "seed",
        "save_interval_updates", "keep_interval_updates", "define_n", "define_k", "define_depth")}
print(json.dumps(result))
"""


def dry_run(*args):
    proc = ok(run_script("train.sh", "-n", "-d", "data", "-s", "ck", *args))
    return ["define_fairseq.tools.train", *training_arguments(proc.stdout)]


def test_train_commands_keep_the_batch_and_the_papers_settings():
    commands = {
        f"{config}-{gpus}": dry_run("-g", gpus, config)
        for config in ("transformer_wmt_en_de", "transformer_define")
        for gpus in (1, 2, 4, 8)
    }
    commands["bf16"] = dry_run("-g", 2, "-p", "bf16", "transformer_define")
    commands["fp32"] = dry_run("-g", 1, "-p", "fp32", "transformer_define", "--max-update", "7", "--lr", "0.002")
    parsed = parse_commands(PARSE, commands)
    for name, info in parsed.items():
        config = name.rsplit("-", 1)[0] if name not in ("bf16", "fp32") else "transformer_define"
        assert info["arch"] == config and info["save_dir"] == f"ck/{config}"
        assert info["share_all_embeddings"] == "True"
        # 8 batches of 4096 tokens an update, however many GPUs
        world, update_freq = int(info["distributed_world_size"]), eval(info["update_freq"])[0]
        assert int(info["max_tokens"]) * world * update_freq == 8 * 4096, name
        # OpenNMT-py's Transformer-base recipe: Adam (0.9, 0.998), noam = inverse sqrt from 0, peak after 8000
        assert (info["optimizer"], info["adam_betas"], info["adam_eps"]) == ("adam", "(0.9, 0.998)", "1e-09")
        assert (info["lr_scheduler"], info["warmup_updates"], info["warmup_init_lr"]) == ("inverse_sqrt", "8000", "0.0")
        assert (info["criterion"], info["label_smoothing"], info["dropout"]) == (
            "label_smoothed_cross_entropy",
            "0.1",
            "0.1",
        )
        assert (info["clip_norm"], info["save_interval_updates"], info["keep_interval_updates"]) == (
            "0.0",
            "2000",
            "10",
        )
        if name != "fp32":
            assert eval(info["lr"]) == [0.000988] and info["max_update"] == "200000"
            assert abs(2 / (512 * 8000) ** 0.5 - 0.000988) < 1e-6  # noam's peak: 2 * 512^-0.5 * 8000^-0.5
        if config == "transformer_define":  # the arch's defaults are the paper's n, k, N (no flag overrides them)
            assert (info["define_n"], info["define_k"], info["define_depth"]) == ("None", "None", "None")
    assert (parsed["transformer_define-1"]["fp16"], parsed["transformer_define-1"]["bf16"]) == ("True", "False")
    # bf16 runs through the plugin's entry point: fairseq-train's own parser would ask for a TPU
    assert (parsed["bf16"]["bf16"], parsed["bf16"]["tpu"], parsed["bf16"]["fp16"]) == ("True", "False", "False")
    assert (parsed["fp32"]["fp16"], parsed["fp32"]["bf16"]) == ("False", "False")
    assert parsed["fp32"]["max_update"] == "7" and eval(parsed["fp32"]["lr"]) == [0.002]  # the user's flags win


def test_fairseq_trains_own_bf16_flag_asks_for_a_tpu():
    """Why bf16 goes through define_fairseq.tools.train: fairseq-train's parser turns --bf16 into --tpu."""
    from fairseq import options

    from define_fairseq.tools.train import parse_args

    argv = ["data", "--task", "translation", "--arch", "transformer", "--bf16"]
    assert options.parse_args_and_arch(options.get_training_parser(), argv).tpu is True
    args = parse_args(argv)
    assert args.bf16 is True and args.tpu is False
    assert parse_args(argv + ["--tpu"]).tpu is True


def test_train_bad_options_fail_clearly(tmp_path):
    proc = ok(run_script("train.sh", "-n", "-g", "3", "transformer_define", "--update-freq", "3"))
    # the user's --update-freq comes last, after the recipe's, and wins
    assert "--distributed-world-size 3" in proc.stdout and "--update-freq 3 --save-dir" in proc.stdout
    proc = run_script("eval.sh", "-s", tmp_path, "transformer_define", "--nbest", "2")
    assert proc.returncode != 0 and "do not pass --nbest" in proc.stderr
    for args, message in (
        (["-g", "3", "transformer_define"], "-g 3 does not divide 8"),
        (["-g", "1", "-p", "fp8", "transformer_define"], "-p fp8: give fp16, bf16 or fp32"),
        (["-g", "1", "transformer"], "unknown CONFIG 'transformer'"),
    ):
        proc = run_script("train.sh", "-n", *args)
        assert proc.returncode != 0 and message in proc.stderr, args
    proc = run_script("train.sh", "-d", tmp_path, "-s", tmp_path / "ck", "-g", "1", "transformer_define")
    assert proc.returncode != 0 and f"no binarized data in {tmp_path}/data-bin" in proc.stderr
    proc = run_script("average.sh", "-s", tmp_path, "transformer_define")
    assert proc.returncode != 0 and f"{tmp_path}/transformer_define not found" in proc.stderr
    proc = run_script("eval.sh", "-s", tmp_path, "-a", "5", "transformer_define")
    assert proc.returncode != 0 and f"{tmp_path}/transformer_define/checkpoint_avg5.pt not found" in proc.stderr


# ----------------------------------------------------------------------------- the chain: train, average, eval


@pytest.fixture(scope="module")
def trained(wmt14_prepared, tmp_path_factory):
    """transformer_define in float32 and the baseline in bfloat16, 6 updates each, a checkpoint every 2."""
    data_dir, _ = wmt14_prepared
    save_root = tmp_path_factory.mktemp("checkpoints")
    outputs = {}
    for config, precision, extra in (
        ("transformer_define", "fp32", TINY_DEFINE),
        ("transformer_wmt_en_de", "bf16", []),
    ):
        proc = ok(
            run_script("train.sh", "-d", data_dir, "-s", save_root, "-g", 1, "-p", precision, config, *TINY, *extra)
        )
        outputs[config] = proc.stdout
    return save_root, outputs


def state(path):
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.slow
def test_train_writes_checkpoints_and_logs(trained):
    save_root, outputs = trained
    for config in ("transformer_define", "transformer_wmt_en_de"):
        folder = save_root / config
        assert sorted(p.name for p in folder.glob("checkpoint_*_*.pt")) == [f"checkpoint_1_{u}.pt" for u in (2, 4, 6)]
        assert (folder / ".done" / "train").exists() and (folder / "checkpoint_best.pt").exists()
        log = (folder / "train.log").read_text()
        assert log.startswith("# ") and f"--arch {config}" in log.splitlines()[0]  # the command, then its output
        assert "num_updates: 6 >= max_update: 6" in log
        last = state(folder / "checkpoint_last.pt")
        assert last["optimizer_history"][-1]["num_updates"] == 6
        floats = [v for v in last["model"].values() if v.is_floating_point()]
        # fairseq saves float32; a model trained in bfloat16 holds only values that bfloat16 represents
        in_bf16 = all(torch.equal(v, v.bfloat16().float()) for v in floats)
        assert in_bf16 == (config == "transformer_wmt_en_de")
        assert last["cfg"]["common"]["bf16"] == (config == "transformer_wmt_en_de")


@pytest.fixture(scope="module")
def averaged(trained):
    save_root, _ = trained
    proc = ok(run_script("average.sh", "-s", save_root, "-n", 3, "transformer_define"))
    return save_root / "transformer_define" / "checkpoint_avg3.pt", proc.stdout + proc.stderr


@pytest.mark.slow
def test_average_is_the_mean_of_the_last_checkpoints(averaged, trained):
    path, output = averaged
    save_root, _ = trained
    inputs = [state(save_root / "transformer_define" / f"checkpoint_1_{u}.pt")["model"] for u in (2, 4, 6)]
    result = state(path)
    assert sorted(result["averaged_from"]) == [f"checkpoint_1_{u}.pt" for u in (2, 4, 6)]
    assert set(result["model"]) == set(inputs[0])
    for key, value in result["model"].items():
        if value.is_floating_point():
            torch.testing.assert_close(value, sum(m[key].double() for m in inputs).div(3).float(), msg=key)
    assert not leftovers(path.parent)
    # a rerun with no newer checkpoint keeps it
    proc = ok(run_script("average.sh", "-s", save_root, "-n", 3, "transformer_define"))
    assert "skip averaging" in proc.stdout
    proc = run_script("average.sh", "-s", save_root, "-n", 4, "transformer_define")
    assert proc.returncode != 0 and not (path.parent / "checkpoint_avg4.pt").exists()


BLEU_LINE = re.compile(
    r"^(newstest201[47]) +sacreBLEU +([0-9.]+) +tokenized compound-split BLEU +([0-9.]+) +"
    r"\((\d+) sentences; (nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[0-9.]+)\)$"
)


def moses_tokenize(lines, lang="de"):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    tokenizer, normalizer = MosesTokenizer(lang), MosesPunctNormalizer(lang)
    return [
        tokenizer.tokenize(normalize(normalizer, line), aggressive_dash_splits=True, escape=True, return_str=True)
        for line in lines
    ]


def check_bleu_folder(folder, data_dir, checkpoint, bpe="subword-nmt", beam=2, testsets=tuple(TESTSETS)):
    import sacrebleu
    from sacremoses import MosesDetokenizer

    lines = (folder / "bleu.txt").read_text().splitlines()
    assert lines[0].startswith(f"# BLEU of {checkpoint} on {data_dir} ({bpe}): beam {beam}, lenpen 0.6")
    assert len(lines) == 1 + len(testsets)
    detokenizer = MosesDetokenizer("de")
    for line, testset in zip(lines[1:], testsets):
        match = BLEU_LINE.match(line)
        assert match, line
        assert match.group(1) == testset and match.group(4) == "30"
        # the hypotheses: fairseq-generate's H lines in the order of the test set, BPE removed
        log = (folder / f"{testset}.generate.log").read_text()
        hyps = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", log, flags=re.M))
        hyps = [hyps[str(i)] for i in range(30)]
        tokenized = read_lines(folder / f"{testset}.hyp.tok")
        detokenized = read_lines(folder / f"{testset}.hyp.detok")
        if bpe == "subword-nmt":  # the output is tokenised text, detokenised for sacreBLEU
            assert tokenized == hyps and "@@" not in " ".join(tokenized)
            assert detokenized == [detokenizer.detokenize(h.split(), unescape=True) for h in tokenized]
        else:  # SentencePiece gives plain text, tokenised for the tokenised BLEU
            assert detokenized == hyps and "\u2581" not in " ".join(hyps)
            assert tokenized == moses_tokenize(detokenized)
        reference = read_lines(data_dir / "raw" / f"{testset}.de")
        # sacreBLEU on the detokenised output against the original reference, as recorded in the JSON
        recorded = json.loads((folder / f"{testset}.sacrebleu.json").read_text())
        score = sacrebleu.corpus_bleu(detokenized, [reference])
        assert float(match.group(2)) == pytest.approx(score.score, abs=0.006) == recorded["score"]
        assert recorded["signature"] == match.group(5)
        # the tokenised compound-split BLEU scored what the tokenised, compound-split files hold
        split = [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", r) for r in moses_tokenize(reference)]
        assert read_lines(folder / f"{testset}.ref.tok.split") == split
        assert any("##AT##-##AT##" in r for r in split)  # the stand-in has hyphenated compounds
        assert read_lines(folder / f"{testset}.hyp.tok.split") == [
            re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", h) for h in tokenized
        ]
        fairseq_score = (folder / f"{testset}.fairseq-score.txt").read_text()
        assert f"BLEU4 = {float(match.group(3)):.2f}" in fairseq_score


@pytest.mark.slow
def test_eval_chain_writes_well_formed_bleu(averaged, wmt14_prepared, trained):
    data_dir, _ = wmt14_prepared
    save_root, _ = trained
    checkpoint, _ = averaged
    quick = ["--cpu", "--max-len-b", "20"]
    proc = ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-a", 3, "-b", 2, "transformer_define", *quick))
    folder = checkpoint.parent / "bleu.checkpoint_avg3.beam2.lenpen0.6"
    check_bleu_folder(folder, data_dir, checkpoint)
    assert not leftovers(checkpoint.parent)
    # the baseline, trained in bfloat16, evaluated from its best checkpoint
    best = save_root / "transformer_wmt_en_de" / "checkpoint_best.pt"
    ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-b", 2, "transformer_wmt_en_de", *quick))
    check_bleu_folder(best.parent / "bleu.checkpoint_best.beam2.lenpen0.6", data_dir, best)
    # reused while the checkpoint and the arguments are unchanged
    again = ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-a", 3, "-b", 2, "transformer_define", *quick))
    assert "skip evaluation" in again.stdout and proc.stdout.strip().splitlines()[-1] in again.stdout


# ------------------------------------------------------------------------------------------ the SentencePiece option


@pytest.mark.slow
def test_sentencepiece_option_prepares_trains_and_evaluates(wmt14_mirror, tmp_path):
    import sentencepiece

    data_dir = tmp_path / "spm"
    env = mirror_env(wmt14_mirror)
    proc = ok(run_script("prepare.sh", "-b", "sentencepiece", "-v", BPE_SIZE, "-j", "2", data_dir, env=env))
    assert "SentencePiece BPE, vocabulary 300" in proc.stdout
    assert (data_dir / "settings").read_text() == f"bpe=sentencepiece size={BPE_SIZE}\n"
    assert not (data_dir / "bpe" / "code").exists()
    model = sentencepiece.SentencePieceProcessor(model_file=str(data_dir / "bpe" / "spm.model"))
    assert model.get_piece_size() == int(BPE_SIZE)
    from sacremoses import MosesPunctNormalizer

    for lang in ("en", "de"):
        # normalised only (SentencePiece segments raw text): no Moses tokenisation, no XML escapes
        raw = read_lines(data_dir / "raw" / f"newstest2014.{lang}")
        normalizer = MosesPunctNormalizer(lang)
        assert read_lines(data_dir / "tok" / f"newstest2014.{lang}") == [normalize(normalizer, r) for r in raw]
        for split in ("train", "newstest2014"):
            source = data_dir / "tok" / f"{'train.clean' if split == 'train' else split}.{lang}"
            expected = [" ".join(model.encode(line, out_type=str)) for line in read_lines(source)]
            assert read_lines(data_dir / "bpe" / f"{split}.{lang}") == expected
            # binarized with the joint dictionary of the training pieces (a test piece it lacks is <unk>)
            vocabulary = {row.split(" ")[0] for row in read_lines(data_dir / "data-bin" / f"dict.{lang}.txt")}
            subset = "test" if split == "newstest2014" else split
            assert binarized(data_dir / "data-bin", subset, lang) == [
                " ".join(piece if piece in vocabulary else "<unk>" for piece in line.split()) for line in expected
            ]
    save_root = tmp_path / "checkpoints"
    ok(
        run_script(
            "train.sh",
            "-d",
            data_dir,
            "-s",
            save_root,
            "-g",
            1,
            "-p",
            "fp32",
            "transformer_define",
            *TINY,
            *TINY_DEFINE,
            "--max-update",
            "2",
        )
    )
    ok(
        run_script(
            "eval.sh",
            "-d",
            data_dir,
            "-s",
            save_root,
            "-b",
            2,
            "-t",
            "newstest2014",
            "transformer_define",
            "--cpu",
            "--max-len-b",
            "20",
        )
    )
    best = save_root / "transformer_define" / "checkpoint_best.pt"
    check_bleu_folder(
        best.parent / "bleu.checkpoint_best.beam2.lenpen0.6",
        data_dir,
        best,
        bpe="sentencepiece",
        testsets=("newstest2014",),
    )


# ------------------------------------------------------------------------- the recipe's model from Python and CLI


@pytest.mark.slow
def test_recipe_checkpoint_translates_raw_text_from_python_and_interactive(wmt14_prepared, trained):
    """The hub interface and fairseq-interactive on the recipe's outputs, with the Moses tokenizer (the data
    are Moses-tokenised) and the BPE codes: raw sentences in, detokenised translations out, the same both ways."""
    from define_fairseq.models.transformer_define import TransformerDefineModel

    data_dir, _ = wmt14_prepared
    save_root, _ = trained
    sentences = ['The Commission\'s well-known report & the "new" road.', "Mr President, we must not forget it."]
    hub = TransformerDefineModel.from_pretrained(
        str(save_root / "transformer_define"),
        "checkpoint_best.pt",
        data_name_or_path=str(data_dir / "data-bin"),
        tokenizer="moses",
        bpe="subword_nmt",
        bpe_codes=str(data_dir / "bpe" / "code"),
        user_dir=str(REPO / "define_fairseq"),
    )
    hub.eval()
    encoded = hub.apply_bpe(hub.tokenize(sentences[0]))
    assert "@-@" in encoded and "&amp;" in encoded and "@@" in encoded  # tokenised as the data, then segmented
    from_python = hub.translate(sentences, beam=2, max_len_b=20)
    assert len(from_python) == 2 and all("@@" not in text and "&amp;" not in text for text in from_python)
    proc = subprocess.run(
        [
            str(BIN / "fairseq-interactive"),
            str(data_dir / "data-bin"),
            "--user-dir",
            str(REPO / "define_fairseq"),
            "--path",
            str(save_root / "transformer_define" / "checkpoint_best.pt"),
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--tokenizer",
            "moses",
            "--bpe",
            "subword_nmt",
            "--bpe-codes",
            str(data_dir / "bpe" / "code"),
            "--beam",
            "2",
            "--max-len-b",
            "20",
            "--cpu",
        ],
        input="".join(s + "\n" for s in sentences),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    detokenized = dict(re.findall(r"^D-(\d+)\t[^\t]*\t(.*)$", proc.stdout, flags=re.M))
    assert [detokenized[str(i)] for i in range(2)] == from_python
