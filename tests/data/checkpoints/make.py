"""Write this folder: a tiny checkpoint of each model family, the validation data it scores, and ``expected.json``.

Run from the root of a checkout of the revision whose checkpoints you want, with fairseq installed::

    python tests/data/checkpoints/make.py

For each family's representative arch (``tests/helpers/arch_cases.py``: ``FAMILIES``, its case's tiny flags, dropout
off) it trains two updates with fairseq-train on the suite's tiny corpora, keeps ``checkpoint_last.pt`` without the
optimizer state and without this machine's paths, and records the loss of its first validation batch
(:func:`validation_loss`). ``tests/models/test_old_checkpoints.py`` loads them with the current code.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def validation_loss(fixture: Path, family: str, task: str):
    """``(loss, sample size)`` of the first validation batch of ``fixture/family.pt``, in eval mode, with the
    criterion the checkpoint trained with."""
    from fairseq import checkpoint_utils, utils

    import define_fairseq  # noqa: F401  (registers the plugin)

    data = fixture / ("lm" if task == "language_modeling" else "mt")
    models, cfg, fairseq_task = checkpoint_utils.load_model_ensemble_and_task(
        [str(fixture / f"{family}.pt")], arg_overrides={"data": str(data)}
    )
    model = models[0].eval()
    fairseq_task.load_dataset("valid")
    criterion = fairseq_task.build_criterion(cfg.criterion).eval()
    batches = fairseq_task.get_batch_iterator(
        dataset=fairseq_task.dataset("valid"),
        max_tokens=cfg.dataset.max_tokens_valid,
        max_sentences=cfg.dataset.batch_size_valid,
        max_positions=utils.resolve_max_positions(fairseq_task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=1,
        num_workers=0,
    ).next_epoch_itr(shuffle=False)
    with torch.no_grad():
        loss, sample_size, _ = criterion(model, next(iter(batches)))
    return float(loss), int(sample_size)


def binarize(raw: Path, dest: Path, *flags: str) -> None:
    fairseq_preprocess = Path(sys.executable).parent / "fairseq-preprocess"
    subprocess.run([str(fairseq_preprocess), *flags, "--destdir", str(dest), "--workers", "1"], check=True)


def main() -> None:
    root = Path.cwd()
    sys.path[:0] = [str(root), str(root / "tests"), str(root / "tests" / "helpers")]
    from arch_cases import CASES, FAMILIES, LM, NO_DROPOUT, STATEFUL, case_argv
    from conftest import write_tiny_corpus, write_tiny_lm_corpus

    work = Path(tempfile.mkdtemp())
    for name, write in (("lm", write_tiny_lm_corpus), ("mt", write_tiny_corpus)):
        (work / f"{name}-raw").mkdir()
        write(work / f"{name}-raw")
    binarize(work, work / "lm", "--only-source", "--trainpref", str(work / "lm-raw/train.txt"), "--validpref",
             str(work / "lm-raw/valid.txt"))  # fmt: skip
    binarize(work, work / "mt", "--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--trainpref",
             str(work / "mt-raw/train"), "--validpref", str(work / "mt-raw/valid"))  # fmt: skip
    for name in ("lm", "mt"):
        (HERE / name).mkdir(exist_ok=True)
        for f in (work / name).iterdir():
            if f.name.startswith(("dict", "valid")):
                shutil.copy(f, HERE / name / f.name)
    expected = {}
    for family, arch in sorted(FAMILIES.items()):
        task = CASES[arch][0]
        stateful = family in STATEFUL
        save = work / f"run-{family}"
        argv = case_argv(work / ("lm" if task == LM else "mt"), arch, *NO_DROPOUT[family],
                         *([] if stateful else ["--max-tokens", "256"]), "--optimizer", "adam", "--lr", "0.001",
                         "--seed", "1", "--cpu", "--num-workers", "0", "--max-update", "2", "--save-dir", str(save),
                         "--no-save-optimizer-state", "--no-epoch-checkpoints", "--disable-validation",
                         stateful=stateful)  # fmt: skip
        subprocess.run([str(Path(sys.executable).parent / "fairseq-train"), *map(str, argv)], check=True)
        state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        cfg = state["cfg"]  # no path of the machine that wrote it
        cfg["task"]["data"], cfg["common"]["user_dir"], cfg["checkpoint"]["save_dir"] = "DATA", None, "checkpoints"
        state["last_optimizer_state"] = None
        torch.save(state, HERE / f"{family}.pt")
        loss, sample_size = validation_loss(HERE, family, task)
        expected[family] = {"arch": arch, "task": task, "loss": loss, "sample_size": sample_size}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
