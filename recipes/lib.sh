# Shared shell helpers for the recipes under recipes/. Source it (`source "$HERE/../lib.sh"`) from a script that
# runs under `set -euo pipefail`; besides defining functions and variables it only exports PYTHONWARNINGS and
# LC_NUMERIC=C and installs the EXIT/INT/TERM traps that clean up after a failure.
#
# What the helpers guarantee:
#   * every output is written under a temporary name and renamed into place when complete, so an interrupted or
#     failed run never leaves a half-written file or directory that a rerun would trust;
#   * each finished step leaves a marker (<dir>/.done/<step>), so a rerun skips it;
#   * a failing run removes its temporary files, and an output directory that this run created and in which no
#     step finished (e.g. the download failed);
#   * errors say what failed and what to do, on stderr, and stop the script.
#
# Variables: LIB_REPO (the repository root), LIB_USER_DIR (the plugin folder given to --user-dir).

LIB_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB_USER_DIR="$LIB_REPO/define_fairseq"
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

# ---------------------------------------------------------------------------------------- download and unpack

# lib_md5 FILE: print FILE's MD5 digest.
lib_md5() {
    if command -v md5sum >/dev/null 2>&1; then
        md5sum "$1" | cut -d' ' -f1
    elif command -v md5 >/dev/null 2>&1; then
        md5 -q "$1"
    else
        python3 -c 'import hashlib,sys; print(hashlib.md5(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

# lib_download URL DEST MD5 URL_VAR MD5_VAR: fetch URL (http(s)://, ftp://, file:// or a local path) into DEST
# through DEST.part; when MD5 is not empty the file must have that digest. URL_VAR and MD5_VAR name the
# environment variables that override URL and MD5, for the error messages.
lib_download() {
    local url=$1 dest=$2 md5=$3 url_var=$4 md5_var=$5
    local part="$dest.part" errfile="$dest.part.err" what
    what=$(basename "$dest")
    lib_tmp "$part"
    lib_tmp "$errfile"
    rm -f -- "$part"
    local hint="Check the network connection, or set $url_var to a reachable copy of $what (an http(s):// or"
    hint+=" file:// URL, or a local path)."
    case $url in
        *://*)
            if command -v curl >/dev/null 2>&1; then
                local status=0 reason
                if [[ -t 2 ]]; then  # a terminal: show curl's progress bar and messages as they come
                    curl -fL --retry 2 --connect-timeout 30 --progress-bar -o "$part" "$url" || status=$?
                    reason="curl exit code $status, message above"
                else
                    curl -fL --retry 2 --connect-timeout 30 -sS -o "$part" "$url" 2> "$errfile" || status=$?
                    reason=$(grep -v '^[[:space:]]*$' "$errfile" | tail -n 1 | tr -d '\r') || true
                fi
                (( status == 0 )) || die "download of $url failed: ${reason:-curl exit code $status}. $hint"
            elif command -v wget >/dev/null 2>&1; then
                wget -q --tries 3 --timeout 30 -O "$part" "$url" 2> "$errfile" \
                    || die "download of $url failed (wget exit code $?: $(tail -n 1 "$errfile")). $hint"
            else
                die "neither curl nor wget is installed; install one, or download $url yourself and set $url_var" \
                    "to the local file"
            fi
            ;;
        *)
            [[ -f $url ]] || die "$url_var=$url is neither a URL nor an existing file. $hint"
            cp -- "$url" "$part" || die "cannot copy $url"
            ;;
    esac
    [[ -s $part ]] || die "the download of $url is empty. $hint"
    if [[ -n $md5 ]]; then
        local got
        got=$(lib_md5 "$part")
        [[ $got == "$md5" ]] || die "checksum mismatch for $url: MD5 $got, expected $md5. The file is truncated," \
            "damaged or another version; nothing was kept. To use a different file on purpose, set $md5_var to its" \
            "MD5 (or to an empty string to skip the check)."
    else
        log "no checksum to verify for $what ($md5_var is empty)"
    fi
    mv -f -- "$part" "$dest"
}

# lib_unpack ARCHIVE DIR: unpack a .zip, .tgz/.tar.gz or .tar into the new directory DIR.
lib_unpack() {
    local archive=$1 dir=$2 errfile="$2.err"
    lib_tmp "$errfile"
    rm -rf -- "$dir"
    mkdir -p "$dir"
    case $archive in
        *.zip)
            if command -v unzip >/dev/null 2>&1; then
                unzip -q -o "$archive" -d "$dir" > "$errfile" 2>&1
            else
                python3 -m zipfile -e "$archive" "$dir" > "$errfile" 2>&1
            fi ;;
        *.tgz | *.tar.gz) tar -xzf "$archive" -C "$dir" > "$errfile" 2>&1 ;;
        *.tar) tar -xf "$archive" -C "$dir" > "$errfile" 2>&1 ;;
        *) die "do not know how to unpack $archive (expected .zip, .tgz, .tar.gz or .tar)" ;;
    esac || { rm -rf -- "$dir"; return 1; }
}

# lib_listing DIR: up to 8 paths found in DIR, for error messages. (awk reads to the end where head would stop
# early and fail the pipeline, under pipefail, by the broken pipe of a long listing.)
lib_listing() {
    (cd "$1" && find . -mindepth 1 | sed 's|^\./||' | sort | awk 'NR <= 8' | paste -sd ' ' -)
}

# -------------------------------------------------------------------------------------- corpus preparation

# lib_prepare_corpus DATA_DIR: download, unpack, check and binarize a language-modelling corpus described by
# these variables (set them before the call):
#   CORPUS_ARCHIVE     file name of the archive, e.g. wikitext-103-v1.zip (kept as DATA_DIR/CORPUS_ARCHIVE)
#   CORPUS_URL         where to fetch it from;   CORPUS_URL_VAR: the environment variable that overrides it
#   CORPUS_MD5         its MD5, or empty;        CORPUS_MD5_VAR: the environment variable that overrides it
#   CORPUS_MEMBER_DIR  the folder inside the archive that holds the splits, e.g. wikitext-103
#   CORPUS_SPLITS      array of the three file names (train, valid, test) inside CORPUS_MEMBER_DIR
#   CORPUS_TEXT_DIR    the folder under DATA_DIR the three files are kept in
# and, optionally (both empty unless the recipe sets them):
#   CORPUS_SPLIT_MEMBERS    for a corpus whose splits are several files each (e.g. shards): array of three
#                           space-separated lists of files inside CORPUS_MEMBER_DIR; each list is concatenated, in
#                           the order given, into the train, valid and test files that CORPUS_SPLITS names
#   CORPUS_PREPROCESS_ARGS  array of extra fairseq-preprocess arguments (e.g. --thresholdsrc 3)
# Steps (each skipped on a rerun once done): download -> DATA_DIR/CORPUS_ARCHIVE; unpack ->
# DATA_DIR/CORPUS_TEXT_DIR/<the three files>; binarize (fairseq-preprocess --only-source) -> DATA_DIR/data-bin.
CORPUS_SPLIT_MEMBERS=()
CORPUS_PREPROCESS_ARGS=()

# _lib_split_members INDEX: the files inside CORPUS_MEMBER_DIR that make split INDEX (0 train, 1 valid, 2 test),
# one a line: CORPUS_SPLIT_MEMBERS[INDEX] when the recipe gives members, else the split's own file name.
_lib_split_members() {
    if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
        local names
        read -r -a names <<< "${CORPUS_SPLIT_MEMBERS[$1]}"
        printf '%s\n' "${names[@]}"
    else
        printf '%s\n' "${CORPUS_SPLITS[$1]}"
    fi
}

lib_prepare_corpus() {
    local data_dir=$1
    local archive="$data_dir/$CORPUS_ARCHIVE" text_dir="$data_dir/$CORPUS_TEXT_DIR" bin_dir="$data_dir/data-bin"
    local train=${CORPUS_SPLITS[0]} valid=${CORPUS_SPLITS[1]} test=${CORPUS_SPLITS[2]}

    require_tool fairseq-preprocess
    require_tool tar
    lib_output_dir "$data_dir"

    # 1. download
    if lib_step_done "$data_dir" download "$archive"; then
        lib_skip "download" "$archive"
    else
        log "download $CORPUS_URL -> $archive"
        lib_download "$CORPUS_URL" "$archive" "$CORPUS_MD5" "$CORPUS_URL_VAR" "$CORPUS_MD5_VAR"
        lib_mark_done "$data_dir" download "$CORPUS_URL md5=${CORPUS_MD5:-unchecked}"
    fi

    # 2. unpack and check the layout; keep only the three split files
    if lib_step_done "$data_dir" unpack "$text_dir/$train" "$text_dir/$valid" "$text_dir/$test"; then
        lib_skip "unpack" "$text_dir"
    else
        log "unpack $archive -> $text_dir"
        local unpacked="$data_dir/unpack.tmp" staged="$text_dir.tmp" split
        lib_tmp "$unpacked"
        lib_tmp "$staged"
        if ! lib_unpack "$archive" "$unpacked"; then
            local reason
            reason=$(tail -n 2 "$unpacked.err" 2>/dev/null | tr -s ' \n\t' ' ' | sed 's/ $//') || true
            rm -f -- "$archive"
            lib_unmark "$data_dir" download
            die "cannot unpack $archive (${reason:-not a valid archive}); deleted it. Is $CORPUS_URL_VAR" \
                "($CORPUS_URL) the right file?"
        fi
        local index member members expected="$CORPUS_MEMBER_DIR/{$train,$valid,$test}"
        if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
            members=$(for index in 0 1 2; do _lib_split_members "$index"; done)
            expected="the $(wc -l <<< "$members" | tr -d ' ') files $CORPUS_MEMBER_DIR/{$(head -n 1 <<< "$members"),"
            expected+="...,$(tail -n 1 <<< "$members")}"
        fi
        for index in 0 1 2; do
            while IFS= read -r member; do
                if [[ ! -s $unpacked/$CORPUS_MEMBER_DIR/$member ]]; then
                    local found
                    found=$(lib_listing "$unpacked")
                    rm -f -- "$archive"
                    lib_unmark "$data_dir" download
                    die "unexpected layout of $CORPUS_ARCHIVE from $CORPUS_URL: $CORPUS_MEMBER_DIR/$member is missing" \
                        "or empty (the archive holds: ${found:-nothing}). Expected $expected; deleted the download." \
                        "Point $CORPUS_URL_VAR at the original $CORPUS_ARCHIVE."
                fi
            done < <(_lib_split_members "$index")
        done
        rm -rf -- "$staged" "$text_dir"
        mkdir -p "$staged"
        for index in 0 1 2; do
            split=${CORPUS_SPLITS[$index]}
            if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
                local parts=()
                mapfile -t parts < <(_lib_split_members "$index")
                (cd "$unpacked/$CORPUS_MEMBER_DIR" && cat -- "${parts[@]}") > "$staged/$split" \
                    || die "cannot write $split (${#parts[@]} files of $CORPUS_ARCHIVE concatenated); is the disk full?"
            else
                mv -- "$unpacked/$CORPUS_MEMBER_DIR/$split" "$staged/$split"
            fi
        done
        mv -- "$staged" "$text_dir"
        rm -rf -- "$unpacked"  # now, not at exit: the rest of a large archive need not wait for the binarization
        lib_mark_done "$data_dir" unpack "$(wc -l < "$text_dir/$train") training lines"
    fi

    # 3. binarize with fairseq-preprocess into a temporary folder, renamed when complete
    if lib_step_done "$data_dir" binarize "$bin_dir/dict.txt" "$bin_dir/train.bin" "$bin_dir/test.bin"; then
        lib_skip "binarize" "$bin_dir"
    else
        local workers=${PREPROCESS_WORKERS:-$(nproc 2>/dev/null || echo 1)}
        (( workers > 20 )) && workers=20
        local extra=("${CORPUS_PREPROCESS_ARGS[@]+"${CORPUS_PREPROCESS_ARGS[@]}"}")
        log "fairseq-preprocess --only-source ${extra[*]+${extra[*]} }-> $bin_dir ($workers workers)"
        local staged_bin="$bin_dir.tmp" prep_log="$data_dir/preprocess.log.tmp"
        lib_tmp "$staged_bin"
        lib_tmp "$prep_log"
        rm -rf -- "$staged_bin" "$bin_dir"
        fairseq-preprocess --only-source --trainpref "$text_dir/$train" --validpref "$text_dir/$valid" \
            --testpref "$text_dir/$test" --destdir "$staged_bin" --workers "$workers" \
            "${extra[@]+"${extra[@]}"}" > "$prep_log" 2>&1 \
            || { tail -n 20 "$prep_log" >&2; die "fairseq-preprocess failed on $text_dir (its output is above)"; }
        grep -E "Dictionary|\[None\] .*sents" "$prep_log" | sed -E 's/^.*\[None\] /    /' | awk '!seen[$0]++' || true
        mv -- "$staged_bin" "$bin_dir"
        lib_mark_done "$data_dir" binarize "$(wc -l < "$bin_dir/dict.txt") dictionary entries${extra[*]+ (${extra[*]})}"
    fi
    log "done: binarized data in $bin_dir"
}

# ------------------------------------------------------------------------------------------------ training

# lib_train DRY_RUN DATA_BIN SAVE_DIR ARGS... : train as `fairseq-train DATA_BIN --user-dir <plugin> ARGS...
# --save-dir SAVE_DIR` does, logging to SAVE_DIR/train.log. Put the recipe's arguments first and the user's extra
# arguments last in ARGS (argparse keeps the last value of a repeated flag). With DRY_RUN=1 only print the
# command (shell-quoted, one line). A finished run leaves the marker SAVE_DIR/.done/train and is skipped on a
# rerun; an interrupted one resumes from SAVE_DIR/checkpoint_last.pt (fairseq writes each checkpoint atomically;
# the recurrent LMs' carried state is in it, so a run resumed mid-epoch continues exactly).
# The program is `python -m define_fairseq.tools.train`: fairseq-train's arguments and training loop, but a
# finished run exits with status 0, where fairseq-train can abort at exit after stopping mid-epoch (its collating
# thread meets PyTorch's shutdown) and a finished step would be reported as failed. Every GPU process reads
# checkpoint_last.pt itself (--load-checkpoint-on-all-dp-ranks): fairseq's default sends rank 0's copy to the
# others through torch.load, which refuses the configuration object in it (torch >= 2.6), so a multi-GPU run
# could not resume.
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

# ------------------------------------------------------------------------------------------------ evaluation

# lib_eval_split LOG DATA_BIN CHECKPOINT SPLIT ARGS... : run fairseq-eval-lm on SPLIT (output in LOG, written
# through LOG.tmp) and set EVAL_LOSS (bits per token) and EVAL_PPL (perplexity). fairseq-eval-lm silently drops
# the samples longer than the model's max positions (it only logs a warning); with EVAL_FORBID_SKIPPED=1 that
# stops the script instead, so a perplexity always covers the whole split.
lib_eval_split() {
    local log_file=$1 data_bin=$2 checkpoint=$3 split=$4
    shift 4
    lib_tmp "$log_file.tmp"
    PYTHONUNBUFFERED=1 fairseq-eval-lm "$data_bin" --user-dir "$LIB_USER_DIR" --path "$checkpoint" \
        --gen-subset "$split" "$@" > "$log_file.tmp" 2>&1 \
        || { tail -n 20 "$log_file.tmp" >&2; die "fairseq-eval-lm failed on the $split split (its output is above)"; }
    local line
    if [[ ${EVAL_FORBID_SKIPPED:-0} == 1 ]]; then
        line=$(grep -Eo '[0-9,]+ samples have invalid sizes and will be skipped.*' "$log_file.tmp" | head -n 1) || true
        [[ -z $line ]] || die "fairseq-eval-lm did not score the whole $split split: $line. The perplexity would" \
            "leave those samples out; give the model more positions (e.g. --model-overrides) or evaluate shorter" \
            "samples (--tokens-per-sample, --sample-break-mode)."
    fi
    line=$(grep -Eo 'Loss \(base 2\): [^,]+, Perplexity: [^[:space:]]+' "$log_file.tmp" | tail -n 1) || true
    [[ -n $line ]] || { tail -n 20 "$log_file.tmp" >&2; die "no perplexity in the fairseq-eval-lm output for $split"; }
    mv -f -- "$log_file.tmp" "$log_file"
    local pattern='Loss \(base 2\): ([^,]+), Perplexity: (.+)'
    [[ $line =~ $pattern ]]
    EVAL_LOSS=${BASH_REMATCH[1]}
    EVAL_PPL=${BASH_REMATCH[2]}
}

# lib_eval DATA_BIN CHECKPOINT RESULTS SPEC... -- EXTRA... : evaluate CHECKPOINT on each split and write
# RESULTS (atomically). Each SPEC is "SPLIT|DESCRIPTION|ARG ARG ..." (the arguments split on spaces); EXTRA is
# appended to every fairseq-eval-lm call. RESULTS is reused when it is newer than the checkpoint and was made
# with the same arguments (FORCE=1 redoes it).
lib_eval() {
    local data_bin=$1 checkpoint=$2 results=$3
    shift 3
    local specs=()
    while (( $# )) && [[ $1 != -- ]]; do specs+=("$1"); shift; done
    (( $# )) && shift
    local extra=("$@")
    require_tool fairseq-eval-lm
    require_plugin
    [[ -f $checkpoint ]] || die "checkpoint $checkpoint not found"
    [[ -f $data_bin/dict.txt ]] || die "no binarized data in $data_bin; run the recipe's prepare.sh first"
    local signature
    signature="# evaluated with: data $data_bin, checkpoint $checkpoint; ${specs[*]}; extra arguments: ${extra[*]-}"
    if [[ ${FORCE:-0} != 1 && -f $results && $results -nt $checkpoint ]] \
        && [[ $(head -n 1 "$results") == "$signature" ]]; then
        lib_skip "evaluation" "$results; FORCE=1 redoes it"
        tail -n +2 "$results"
        return 0
    fi
    lib_tmp "$results.tmp"
    printf '%s\n' "$signature" > "$results.tmp"
    local spec split description args argv
    for spec in "${specs[@]}"; do
        IFS='|' read -r split description args <<< "$spec"
        read -r -a argv <<< "$args"
        log "fairseq-eval-lm on $split ($description)"
        lib_eval_split "${results%.txt}.$split.log" "$data_bin" "$checkpoint" "$split" \
            "${argv[@]}" "${extra[@]+"${extra[@]}"}"
        (( ${#extra[@]} )) && description+="; with ${extra[*]}"
        printf '%-5s perplexity %s  (loss %s bits/token; %s)\n' "$split" "$EVAL_PPL" "$EVAL_LOSS" "$description" \
            >> "$results.tmp"
    done
    mv -f -- "$results.tmp" "$results"
    tail -n +2 "$results"
}

# lib_eval_target TARGET CONFIG CONFIGS SAVE_ROOT TRAIN_SCRIPT : what an eval.sh argument names. TARGET is a
# checkpoint file or one of CONFIGS (space-separated); CONFIG is what -c gave (may be empty). Sets CONFIG and
# CHECKPOINT (SAVE_ROOT/CONFIG/checkpoint_best.pt for a config), or stops with a message saying what to give.
lib_eval_target() {
    local target=$1 configs=$3 save_root=$4 train_script=$5
    CONFIG=$2
    if [[ -f $target ]]; then
        CHECKPOINT=$target
        [[ -n $CONFIG ]] || CONFIG=$(basename "$(dirname "$target")")
        [[ " $configs " == *" $CONFIG "* ]] || die "cannot tell which config $target belongs to (its folder is not" \
            "named after one); give it with -c CONFIG ($configs)"
    elif [[ " $configs " == *" $target "* ]]; then
        [[ -z $CONFIG || $CONFIG == "$target" ]] || die "-c $CONFIG contradicts CONFIG $target"
        CONFIG=$target
        CHECKPOINT="$save_root/$CONFIG/checkpoint_best.pt"
        [[ -f $CHECKPOINT ]] || die "$CHECKPOINT not found; train it first: $train_script $CONFIG" \
            "(or give -s SAVE_ROOT / a checkpoint file)"
    else
        die "'$target' is neither a checkpoint file nor a config ($configs)"
    fi
}

# The official Mogrifier code's softmax-temperature grid (lamb/evaluation.py multiplies the logits by
# t = 1.06 - 0.02 i down to 0.80); --mogrifier-softmax-temperature T divides them, so T = 1 / t.
LIB_LAMB_TEMPERATURES=$(awk 'BEGIN { for (i = 0; i <= 13; i++) printf "%s%.4f", (i ? " " : ""), 1 / (1.06 - 0.02 * i) }')

# lib_tune_temperature DATA_BIN CHECKPOINT RESULTS VALID_ARGS TEST_ARGS EXTRA... : score the valid split at every
# temperature of the grid ($TEMPERATURES, default the official code's), then the test split at the best one;
# VALID_ARGS / TEST_ARGS are fairseq-eval-lm arguments split on spaces. Writes RESULTS atomically (a signature
# line, then a valid and a test line), reused like lib_eval's while the checkpoint and the arguments are
# unchanged (FORCE=1 redoes it).
lib_tune_temperature() {
    local data_bin=$1 checkpoint=$2 results=$3 valid_args test_args
    read -r -a valid_args <<< "$4"
    read -r -a test_args <<< "$5"
    shift 5
    local grid=${TEMPERATURES:-$LIB_LAMB_TEMPERATURES}
    local signature="# temperature search with: data $data_bin, checkpoint $checkpoint; grid $grid; extra arguments: $*"
    if [[ ${FORCE:-0} != 1 && -f $results && $results -nt $checkpoint ]] \
        && [[ $(head -n 1 "$results") == "$signature" ]]; then
        lib_skip "temperature search" "$results; FORCE=1 redoes it"
        tail -n +2 "$results"
        return 0
    fi
    local t count=0 best_t="" best_loss="" best_ppl="" stem="${results%.txt}"
    for t in $grid; do
        [[ $t =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v t="$t" 'BEGIN { exit !(t > 0) }' \
            || die "TEMPERATURES: '$t' is not a positive number (give temperatures separated by spaces, e.g. 1 1.1)"
    done
    for t in $grid; do
        log "fairseq-eval-lm on valid with the softmax temperature T = $t"
        lib_eval_split "$stem.valid.T$t.log" "$data_bin" "$checkpoint" valid "${valid_args[@]}" \
            --model-overrides "{'mogrifier_softmax_temperature': $t}" "$@"
        printf '    T = %s: valid perplexity %s\n' "$t" "$EVAL_PPL"
        count=$((count + 1))
        if [[ -z $best_loss ]] || awk -v a="$EVAL_LOSS" -v b="$best_loss" 'BEGIN { exit !(a < b) }'; then
            best_t=$t best_loss=$EVAL_LOSS best_ppl=$EVAL_PPL
        fi
    done
    log "fairseq-eval-lm on test with the softmax temperature T = $best_t (the best on valid)"
    lib_eval_split "$stem.test.T$best_t.log" "$data_bin" "$checkpoint" test "${test_args[@]}" \
        --model-overrides "{'mogrifier_softmax_temperature': $best_t}" "$@"
    lib_tmp "$results.tmp"
    {
        printf '%s\n' "$signature"
        printf '%-5s perplexity %s  (loss %s bits/token; softmax temperature T = %s, the best of %s on valid)\n' \
            valid "$best_ppl" "$best_loss" "$best_t" "$count"
        printf '%-5s perplexity %s  (loss %s bits/token; softmax temperature T = %s, tuned on valid)\n' \
            test "$EVAL_PPL" "$EVAL_LOSS" "$best_t"
    } > "$results.tmp"
    mv -f -- "$results.tmp" "$results"
    tail -n +2 "$results"
}

# lib_eval_with_temperature DATA_BIN CHECKPOINT VALID_SPEC TEST_SPEC -- EXTRA... : the Mogrifier configs'
# evaluation. First as lib_eval does (softmax temperature T = 1; CHECKPOINT's .eval.txt), then as the Mogrifier
# paper reports it, with T tuned on valid and applied to test (lib_tune_temperature; .eval.temperature.txt); then
# prints both. VALID_SPEC and TEST_SPEC are lib_eval's "SPLIT|DESCRIPTION|ARGS" for valid and test.
lib_eval_with_temperature() {
    local data_bin=$1 checkpoint=$2 valid_spec=$3 test_spec=$4
    shift 4
    (( $# )) && [[ $1 == -- ]] && shift
    local plain="${checkpoint%.pt}.eval.txt" tuned="${checkpoint%.pt}.eval.temperature.txt"
    lib_eval "$data_bin" "$checkpoint" "$plain" "valid|T = 1; ${valid_spec#valid|}" "test|T = 1; ${test_spec#test|}" \
        -- "$@"
    lib_tune_temperature "$data_bin" "$checkpoint" "$tuned" "${valid_spec##*|}" "${test_spec##*|}" "$@"
    log "results of $checkpoint"
    printf 'without softmax temperature (T = 1):\n'
    tail -n +2 "$plain"
    printf 'with the softmax temperature tuned on valid (the Mogrifier paper'"'"'s protocol):\n'
    tail -n +2 "$tuned"
}
