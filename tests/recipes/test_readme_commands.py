"""The commands written by hand in README.md and the recipes' READMEs are the ones the recipes run.

A hand-written ``fairseq-train`` command is compared, flag by flag and value by value, with what the recipe's
``train.sh -n`` prints for the same config on one GPU; the ``fairseq-generate`` command with eval.sh's call; the
data folders and checkpoint paths of the other programs with the recipe's; and every ``bash recipes/.../train*.sh``
line is run with ``-n``. Editing a value in a README, or in a recipe, without the other fails here."""

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO, training_arguments
from recipe_runs import ok, run_recipe

README = REPO / "README.md"
RECIPE_READMES = sorted((REPO / "recipes").glob("*/README.md"))

# The flags of a recipe's command that README.md leaves out of its hand-written copy, as its text says: logging,
# and the two that matter only on several GPUs (train.sh -n -g 1 prints --distributed-world-size 1).
LEFT_OUT = {"--load-checkpoint-on-all-dp-ranks", "--distributed-world-size", "--log-format", "--log-interval"}
# Programs whose data folder and --path a README writes by hand.
SCORING_PROGRAMS = ("fairseq-generate", "fairseq-interactive", "fairseq-eval-lm")


def bash_commands(markdown: Path):
    """Each command of the file's ```bash blocks as its argv (continuation lines joined, comments dropped)."""
    text = markdown.read_text()
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):  # VAR=value before the program
                argv = argv[1:]
            if argv:
                yield argv


def flag_values(argv, later_wins=False):
    """(positional arguments, {flag: value or None}) of a fairseq command line; a flag given twice fails, unless
    ``later_wins`` (a recipe's command with the user's arguments appended, which argparse reads so)."""
    positional, flags, i = [], {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            flag = argv[i]
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            assert later_wins or flag not in flags, f"{flag} given twice in {argv}"
            flags[flag] = value
            i += 1 if value is None else 2
        else:
            positional.append(argv[i])
            i += 1
    return positional, flags


def recipe_of(data_dir: str):
    """The recipe whose prepare.sh writes ``data_dir`` (data/<recipe>/data-bin, as the recipes' defaults)."""
    match = re.fullmatch(r"data/([\w.-]+)/data-bin", data_dir)
    assert match and (REPO / "recipes" / match.group(1) / "train.sh").exists(), (
        f"{data_dir}: a hand-written command should read a recipe's data folder, data/<recipe>/data-bin"
    )
    return match.group(1)


def train_script(config: str):
    """The script that trains ``config``: WikiText-103's Transformer-XL configs have their own."""
    return "train-transformer-xl.sh" if config.startswith("transformer_xl") else "train.sh"


def takes_gpus(script: str) -> bool:
    return "[-g GPUS]" in (REPO / "recipes" / script).read_text()


def recipe_command(recipe: str, config: str):
    """The fairseq-train arguments of ``train.sh -n [-g 1] CONFIG`` (one GPU where the script asks how many)."""
    script = f"{recipe}/{train_script(config)}"
    gpus = ["-g", "1"] if takes_gpus(script) else []
    return training_arguments(ok(run_recipe(script, "-n", *gpus, config)).stdout)


def same_user_dir(readme_value: str, recipe_value: str) -> bool:
    return (REPO / readme_value).resolve() == Path(recipe_value).resolve()


def hand_written(program: str):
    return [argv for argv in bash_commands(README) if argv[0] == program and "..." not in argv]


def test_readme_has_hand_written_commands():
    """The checks below cannot pass on an empty list: README.md writes one training and one scoring command."""
    assert hand_written("fairseq-train") and hand_written("fairseq-generate")


@pytest.mark.parametrize("argv", hand_written("fairseq-train"), ids=lambda argv: argv[argv.index("--arch") + 1])
def test_hand_written_training_command_is_the_recipes(argv):
    positional, flags = flag_values(argv[1:])
    recipe, config = recipe_of(positional[0]), flags["--arch"]
    recipe_positional, recipe_flags = flag_values(recipe_command(recipe, config))
    assert positional == recipe_positional
    assert same_user_dir(flags.pop("--user-dir"), recipe_flags.pop("--user-dir"))
    differ = {
        flag: (value, recipe_flags.get(flag, "(not in the recipe)"))
        for flag, value in flags.items()
        if flag not in recipe_flags or recipe_flags[flag] != value
    }
    assert not differ, f"README.md's values (left) are not the recipe's (right): {differ}"
    missing = sorted(set(recipe_flags) - set(flags) - LEFT_OUT)
    assert not missing, f"README.md's {config} command leaves out the recipe's {missing}"
    # fairseq-train cannot train in bfloat16 (its parser asks for a TPU): the recipe's program is needed for that
    assert "--bf16" not in recipe_flags


def eval_sh_generate_call():
    """The arguments of the WMT14 recipe's fairseq-generate call in eval.sh, with its defaults (beam, length
    penalty, batch) filled in and the subword-nmt BPE's --remove-bpe; the arguments from variables left as names."""
    script = (REPO / "recipes/wmt14-en-de/eval.sh").read_text()
    defaults = {}
    for name, value in re.findall(r"\b(BEAM|LENPEN|BATCH)=(\S+)", script):
        defaults.setdefault(name, value)  # the first assignment: the default, before the options' (=$2)
    call = re.search(r"fairseq-generate (\"\$BIN\".*?)(?<!\\)\n", script, flags=re.S).group(1)
    argv = shlex.split(call.replace("\\\n", " ").split(">")[0])
    remove_bpe = re.search(r"BPE=subword-nmt REMOVE_BPE=\(([^)]*)\)", script).group(1).split()
    argv = [defaults.get(a.lstrip("$"), a) for a in argv if "REMOVE_BPE" not in a and "EXTRA" not in a]
    return argv + remove_bpe


def test_hand_written_generate_command_is_eval_sh():
    (argv,) = hand_written("fairseq-generate")
    positional, flags = flag_values(argv[1:])
    _, recipe_flags = flag_values(eval_sh_generate_call())
    assert recipe_flags.pop("--user-dir") == "$LIB_USER_DIR"
    assert same_user_dir(flags.pop("--user-dir"), REPO / "define_fairseq")  # lib.sh's LIB_USER_DIR
    assert recipe_flags.pop("--path") == "$CHECKPOINT" and recipe_flags.pop("--gen-subset") == "$subset"
    # newstest2014, eval.sh's first test set, is the subset "test" (prepare.sh's binarize step)
    assert flags.pop("--gen-subset") == "test"
    checkpoint = Path(flags.pop("--path"))
    assert flags == recipe_flags, "README.md's fairseq-generate flags (left) against eval.sh's (right)"
    # the data and checkpoint the training command above reads and writes
    recipe = recipe_of(positional[0])
    train_positional, train_flags = flag_values(recipe_command(recipe, checkpoint.parent.name))
    assert positional == train_positional
    assert checkpoint == Path(train_flags["--save-dir"]) / "checkpoint_best.pt"


@pytest.mark.parametrize("program", SCORING_PROGRAMS)
def test_scoring_commands_read_the_recipes_data_and_checkpoints(program):
    for argv in hand_written(program):
        positional, flags = flag_values(argv[1:])
        checkpoint = Path(flags["--path"])
        recipe = recipe_of(positional[0])
        train_positional, train_flags = flag_values(recipe_command(recipe, checkpoint.parent.name))
        assert positional == train_positional
        assert checkpoint.parent == Path(train_flags["--save-dir"])


def script_lines():
    """Every ``bash recipes/<recipe>/train*.sh ...`` line of README.md and the recipes' READMEs."""
    for markdown in [README, *RECIPE_READMES]:
        for argv in bash_commands(markdown):
            if argv[0] == "bash" and re.fullmatch(r"recipes/[\w.-]+/train[\w-]*\.sh", argv[1]):
                yield pytest.param(argv[1:], id=f"{markdown.relative_to(REPO)}: {' '.join(argv[1:])}")


@pytest.mark.parametrize("argv", list(script_lines()))
def test_readme_training_lines_run(argv):
    """Each line's config exists and its options are accepted: ``-n`` prints the command (one GPU where the script
    would count them: this machine may have none), and the config is the command's --arch."""
    script, args = argv[0].removeprefix("recipes/"), argv[1:]
    gpus = ["-g", "1"] if takes_gpus(script) and "-g" not in args else []
    _, flags = flag_values(training_arguments(ok(run_recipe(script, "-n", *gpus, *args)).stdout), later_wins=True)
    assert flags["--arch"] == script_config(args)


def script_config(args):
    """The CONFIG of a train script's arguments: the first after the script's own options (-n, -h; -d, -s, -g, -p
    with a value)."""
    i = 0
    while args[i].startswith("-"):
        i += 2 if args[i] in ("-d", "-s", "-g", "-p") else 1
    return args[i]
