# shellcheck shell=bash
# Shared shell helpers for the recipes under recipes/. Source it (`source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"`)
# from a script that runs under `set -euo pipefail`; besides defining functions and variables it only exports
# PYTHONWARNINGS and LC_NUMERIC=C and installs the EXIT/INT/TERM traps that clean up after a failure. It brings in
# the data helpers (lib_data.sh: download, unpack, prepare a corpus) and the evaluation helpers (lib_eval.sh:
# fairseq-eval-lm).
#
# What the helpers guarantee:
#   * every output is written under a temporary name and renamed into place when complete, so an interrupted or
#     failed run never leaves a half-written file or directory that a rerun would trust;
#   * each finished step leaves a marker (<dir>/.done/<step>), so a rerun skips it;
#   * a failing run removes its temporary files, and an output directory that this run created and in which no
#     step finished (e.g. the download failed);
#   * errors say what failed and what to do, on stderr, and stop the script.
#
# Variables: LIB_REPO (the repository root), LIB_USER_DIR (the plugin folder given to --user-dir), RECIPE_DIR and
# RECIPE (the folder of the script that runs and its name, e.g. ptb: the recipes' default data and
# checkpoint folders are data/RECIPE and checkpoints/RECIPE).

LIB_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB_USER_DIR="$LIB_REPO/define_fairseq"
RECIPE_DIR=$(cd "$(dirname "$0")" && pwd)
RECIPE=$(basename "$RECIPE_DIR")
# torch's deprecation warnings about fairseq's own calls would drown the logs; PYTHONWARNINGS=default shows them.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
# Numbers are read and printed with a decimal point whatever the user's locale (bash's printf follows LC_NUMERIC).
export LC_NUMERIC=C

# ---------------------------------------------------------------------------------------------------- messages

log() { printf '==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# require_tool TOOL [HINT]: stop unless TOOL is on PATH.
require_tool() {
    local hint="Install it, or put the environment that has it first on PATH (e.g. PATH=\$PWD/.venv/bin:\$PATH)."
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH. ${2:-$hint}"
}

# lib_python: the Python interpreter of the environment that has the fairseq programs (the one beside
# fairseq-preprocess when there is one), for this project's tools (python -m define_fairseq.tools...).
lib_python() {
    local bin
    bin=$(dirname "$(command -v fairseq-preprocess || command -v fairseq-train || echo /nonexistent/x)")
    if [[ -x $bin/python ]]; then
        printf '%s\n' "$bin/python"
    else
        command -v python3 || die "no python3 found on PATH"
    fi
}

# lib_tool TOOL ARGS...: run define_fairseq/tools/TOOL.py as a script with lib_python. The text and checkpoint
# tools need no fairseq; run as scripts (not with -m, which imports the package) they do not load it.
lib_tool() { "$(lib_python)" "$LIB_REPO/define_fairseq/tools/$1.py" "${@:2}"; }

# lib_lines FILE: its number of lines (wc -l), without padding.
lib_lines() { wc -l < "$1" | tr -d ' '; }

# lib_gpu_count CPU_HINT: print the number of visible CUDA GPUs; stop when torch cannot tell or there is none,
# saying to give -g (CPU_HINT: the command line of a CPU run, for the message).
lib_gpu_count() {
    local count
    count=$("$(lib_python)" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null) \
        || die "cannot count the GPUs (is torch installed?); give -g GPUS"
    (( count > 0 )) || die "no CUDA GPU is visible; give -g GPUS (for a CPU run: $1)"
    printf '%s\n' "$count"
}

# require_plugin: stop unless the define_fairseq plugin folder is where --user-dir will point.
require_plugin() {
    [[ -f $LIB_USER_DIR/__init__.py ]] \
        || die "the plugin folder $LIB_USER_DIR is missing; run the recipe from a checkout of define-fairseq"
}

# ------------------------------------------------------------------------------------------------ command line

# lib_parse_options OPTIONS OPERAND ARGS... : parse a recipe script's command line, "[options] OPERAND [arguments
# passed on...]", with getopts. OPTIONS are the script's option letters in getopts' notation (a colon after a
# letter that takes a value). A letter that the script's function `recipe_option LETTER VALUE` takes (it returns
# 0) is the script's own; the others mean the same in every script:
#   -h  print the script's usage (its function `usage`) and exit 0;  -n  DRY_RUN=1 (print the command and exit);
#   -d  DATA_DIR=VALUE;  -s  SAVE_ROOT=VALUE;  -c  CONFIG=VALUE.
# An unknown option, an option without its value, or a missing operand (when OPERAND, its name for the message,
# e.g. CONFIG, is not empty) prints the usage on stderr and stops. Sets LIB_SHIFT to the number of arguments the
# options took: the script then runs `shift "$LIB_SHIFT"`, which leaves the operand first.
lib_parse_options() {
    local options=$1 operand=$2 opt OPTARG OPTIND=1
    shift 2
    while getopts ":$options" opt; do
        case $opt in
            :) usage >&2; die "option -$OPTARG needs a value" ;;
            \?) usage >&2; die "unknown option -$OPTARG" ;;
        esac
        if declare -F recipe_option > /dev/null && recipe_option "$opt" "${OPTARG:-}"; then
            continue
        fi
        case $opt in
            h) usage; exit 0 ;;
            n) DRY_RUN=1 ;;
            d) DATA_DIR=$OPTARG ;;
            s) SAVE_ROOT=$OPTARG ;;
            c) CONFIG=$OPTARG ;;
            *) die "lib_parse_options: the script declares -$opt but does not handle it (recipe_option)" ;;
        esac
    done
    LIB_SHIFT=$((OPTIND - 1))
    shift "$LIB_SHIFT"
    [[ -z $operand ]] || (( $# >= 1 )) || { usage >&2; die "missing $operand"; }
}

# ------------------------------------------------------------------------------- temporary paths and clean-up

_LIB_TMP_PATHS=()
_LIB_CREATED_DIR=""
_LIB_CREATED_FOR=""

# lib_tmp PATH: remove PATH when the script exits (whatever the outcome); use it for every temporary name.
lib_tmp() { _LIB_TMP_PATHS+=("$1"); }

# lib_output_dir DIR: create DIR (and its parents). When this run creates it and fails before any step in it
# finished, the exit handler removes it again (from the topmost folder this run created).
lib_output_dir() {
    local dir=$1 top="" probe=$1
    while [[ -n $probe && ! -e $probe ]]; do
        top=$probe
        probe=$(dirname "$probe")
    done
    mkdir -p "$dir" || die "cannot create the output directory $dir"
    if [[ -n $top && -z $_LIB_CREATED_DIR ]]; then
        _LIB_CREATED_DIR=$top
        _LIB_CREATED_FOR=$dir
    fi
}

_lib_on_exit() {
    local status=$?
    local path
    for path in "${_LIB_TMP_PATHS[@]+"${_LIB_TMP_PATHS[@]}"}"; do
        rm -rf -- "$path"
    done
    if (( status != 0 )) && [[ -n $_LIB_CREATED_DIR && -d $_LIB_CREATED_DIR ]]; then
        if [[ -z $(ls -A "$_LIB_CREATED_FOR/.done" 2>/dev/null) ]]; then
            rm -rf -- "$_LIB_CREATED_DIR"
            printf 'note: removed %s (created by this run, nothing in it finished)\n' "$_LIB_CREATED_DIR" >&2
        fi
    fi
    exit "$status"
}
# A command that fails where no check expected it still stops the script (set -e), with a line saying which.
_lib_on_error() {
    [[ $BASHPID == "$$" ]] || return 0  # report once, from the script's own shell
    printf 'error: unexpected failure (exit code %s) of: %s (%s, line %s)\n' "$1" "$2" "$3" "$4" >&2
}
set -o errtrace
trap '_lib_on_error $? "$BASH_COMMAND" "${BASH_SOURCE[0]}" "$LINENO"' ERR
trap _lib_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------------------------------------ step markers

# lib_step_done DIR STEP [OUTPUT...]: true when STEP's marker exists in DIR and every OUTPUT exists.
lib_step_done() {
    local dir=$1 step=$2
    shift 2
    [[ -f $dir/.done/$step ]] || return 1
    local output
    for output in "$@"; do
        [[ -e $output ]] || return 1
    done
}

# lib_mark_done DIR STEP [TEXT]: record that STEP finished (the marker holds the date and TEXT).
lib_mark_done() {
    local dir=$1 step=$2 text=${3:-}
    mkdir -p "$dir/.done"
    lib_tmp "$dir/.done/$step.tmp"
    printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$text" > "$dir/.done/$step.tmp"
    mv -f "$dir/.done/$step.tmp" "$dir/.done/$step"
}

# lib_unmark DIR STEP: forget that STEP finished (and remove DIR/.done when no marker is left in it).
lib_unmark() {
    rm -f -- "$1/.done/$2"
    rmdir -- "$1/.done" 2>/dev/null || true
}

lib_skip() { log "skip $1: already done ($2)"; }

# ------------------------------------------------------------------------------------------------ training

# lib_train DRY_RUN DATA_BIN SAVE_DIR ARGS... : train as `fairseq-train DATA_BIN --user-dir <plugin> ARGS...
# --save-dir SAVE_DIR` does, logging to SAVE_DIR/train.log. Put the recipe's arguments first and the user's extra
# arguments last in ARGS (argparse keeps the last value of a repeated flag). With DRY_RUN=1 only print the
# command (shell-quoted, one line). A finished run leaves the marker SAVE_DIR/.done/train and is skipped on a
# rerun; an interrupted one resumes from SAVE_DIR/checkpoint_last.pt (the recurrent LMs' carried state is in it, so
# a run resumed mid-epoch continues exactly; docs/multi-gpu.md says what a kill during a save can leave).
# The program is `python -m define_fairseq.tools.train`: fairseq-train's arguments and training loop, but a
# finished run exits with status 0, where fairseq-train can abort at exit after stopping mid-epoch (its collating
# thread meets PyTorch's shutdown) and a finished step would be reported as failed. Every GPU process reads
# checkpoint_last.pt itself (--load-checkpoint-on-all-dp-ranks) rather than receiving rank 0's copy through the
# process group (fairseq's default, which works too: docs/multi-gpu.md).
lib_train() {
    local dry_run=$1 data_bin=$2 save_dir=$3
    shift 3
    local cmd=("$(lib_python)" -m define_fairseq.tools.train "$data_bin" --user-dir "$LIB_USER_DIR"
               --load-checkpoint-on-all-dp-ranks "$@" --save-dir "$save_dir")
    if [[ $dry_run == 1 ]]; then
        printf '%q ' "${cmd[@]}"
        printf '\n'
        return 0
    fi
    require_tool fairseq-train
    require_plugin
    compgen -G "$data_bin/dict*.txt" > /dev/null && compgen -G "$data_bin/train*.bin" > /dev/null \
        || die "no binarized data in $data_bin (dict*.txt, train*.bin); run the recipe's prepare.sh first"
    if lib_step_done "$save_dir" train; then
        lib_skip "training" "$save_dir/.done/train; remove that file to train again or longer"
        return 0
    fi
    mkdir -p "$save_dir"
    log "training -> $save_dir (log: $save_dir/train.log)"
    printf '# %s\n' "$(printf '%q ' "${cmd[@]}")" >> "$save_dir/train.log"
    local status=0
    PYTHONPATH="$LIB_REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 "${cmd[@]}" 2>&1 \
        | tee -a "$save_dir/train.log" || status=$?
    (( status == 0 )) || die "training failed (exit code $status); see $save_dir/train.log. A rerun resumes" \
        "from $save_dir/checkpoint_last.pt when it exists."
    [[ -f $save_dir/checkpoint_last.pt ]] || die "training wrote no checkpoint to $save_dir"
    lib_mark_done "$save_dir" train
    log "done: $save_dir/checkpoint_best.pt, $save_dir/checkpoint_last.pt"
}

# lib_train_recipe ARGS... : the whole of a train.sh, whose command line is "[options] CONFIG [fairseq-train
# arguments...]": -h, -n, -d DATA_DIR (default $DATA_DIR or data/RECIPE), -s SAVE_ROOT (default $SAVE_ROOT or
# checkpoints/RECIPE) and the letters of RECIPE_OPTIONS (getopts' notation; the script's recipe_option takes them).
# The script's function `recipe_args CONFIG` sets the array ARGS, the recipe's fairseq-train arguments (its case
# for an unknown CONFIG runs lib_unknown_config); lib_train then trains SAVE_ROOT/CONFIG, the user's arguments last.
lib_train_recipe() {
    DATA_DIR=${DATA_DIR:-data/$RECIPE}
    SAVE_ROOT=${SAVE_ROOT:-checkpoints/$RECIPE}
    DRY_RUN=0
    lib_parse_options "hnd:s:${RECIPE_OPTIONS:-}" CONFIG "$@"
    shift "$LIB_SHIFT"
    CONFIG=$1
    shift
    recipe_args "$CONFIG"
    lib_train "$DRY_RUN" "$DATA_DIR/data-bin" "$SAVE_ROOT/$CONFIG" "${ARGS[@]}" "$@"
}

lib_unknown_config() { usage >&2; die "unknown CONFIG '$CONFIG' (see the list above)"; }

# lib_train_usage CORPUS CONFIGS [NOTE]: the usage of a lib_train_recipe train.sh that trains on the binarized
# CORPUS (its name in words); CONFIGS lists its configs, NOTE (one or more lines) ends the text. A script with
# options of its own (RECIPE_OPTIONS) describes them in TRAIN_OPTIONS (its synopsis, e.g. "[-g GPUS]", then a
# newline and their help lines).
lib_train_usage() {
    local synopsis=${TRAIN_OPTIONS:+ ${TRAIN_OPTIONS%%$'\n'*}} options=${TRAIN_OPTIONS:+${TRAIN_OPTIONS#*$'\n'}$'\n'}
    cat <<USAGE
Usage: $(basename "$0") [-h] [-n] [-d DATA_DIR] [-s SAVE_ROOT]$synopsis CONFIG [fairseq-train arguments...]

Train CONFIG on the binarized $1 in DATA_DIR/data-bin (made by prepare.sh) and write the
checkpoints to SAVE_ROOT/CONFIG (checkpoint_best.pt, checkpoint_last.pt, train.log). Arguments after CONFIG are
appended to the fairseq-train command and win over the recipe's (e.g. --max-epoch 1, --cpu).

$2

Options:
$options  -n            print the training command and exit
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/$RECIPE)
  -s SAVE_ROOT  checkpoint root (default: \$SAVE_ROOT or checkpoints/$RECIPE)
  -h            this help

A finished training is skipped on a rerun (SAVE_ROOT/CONFIG/.done/train); an interrupted one resumes from
checkpoint_last.pt.${3:+ $3}
USAGE
}

# The data and evaluation helpers (recipes/lib_data.sh, recipes/lib_eval.sh).
source "$LIB_REPO/recipes/lib_data.sh"
source "$LIB_REPO/recipes/lib_eval.sh"
