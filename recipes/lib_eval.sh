# shellcheck shell=bash
# The recipes' evaluation helpers: fairseq-eval-lm on the valid and test splits, the Mogrifier's softmax
# temperature (sourced by recipes/lib.sh, not run).

# ------------------------------------------------------------------------------------------------ evaluation

# lib_eval_usage CORPUS CONFIGS HOW : the usage of a language-model eval.sh (fairseq-eval-lm) whose data and
# checkpoints are in data/CORPUS and checkpoints/CORPUS by default; HOW says how its configs are evaluated.
lib_eval_usage() {
    local corpus=$1 configs=$2 how=$3
    cat <<USAGE
Usage: $(basename "$0") [-h] [-d DATA_DIR] [-s SAVE_ROOT] [-c CONFIG] CONFIG|CHECKPOINT [fairseq-eval-lm arguments...]

Evaluate SAVE_ROOT/CONFIG/checkpoint_best.pt (or the CHECKPOINT file given) on the valid and test splits of
DATA_DIR/data-bin and print the perplexities; they are also written to <checkpoint>.eval.txt (reused while the
checkpoint and the arguments are unchanged; FORCE=1 redoes it) with the full fairseq output in
<checkpoint>.eval.<split>.log. Arguments after the checkpoint are appended to every fairseq-eval-lm call
(e.g. --cpu).

$how

Options:
  -c CONFIG     the config of a CHECKPOINT whose folder is not named after it
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/$corpus)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/$corpus)
  -h            this help
CONFIG is one of: $configs
USAGE
}

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

# lib_eval_recipe ARGS... : the whole of a language-model eval.sh, whose command line is lib_eval_usage's (defaults
# data/RECIPE and checkpoints/RECIPE; CONFIGS: the recipe's configs). The script's function `recipe_specs CONFIG`
# sets SPECS, lib_eval's SPEC of each split, and may set EVAL_FORBID_SKIPPED=1 (lib_eval_split), or
# EVAL_TEMPERATURE=1 for the Mogrifier's two perplexities (lib_eval_with_temperature).
lib_eval_recipe() {
    DATA_DIR=${DATA_DIR:-data/$RECIPE}
    SAVE_ROOT=${SAVE_ROOT:-checkpoints/$RECIPE}
    CONFIG=""
    lib_parse_options hc:d:s: "CONFIG or CHECKPOINT" "$@"
    shift "$LIB_SHIFT"
    lib_eval_target "$1" "$CONFIG" "$CONFIGS" "$SAVE_ROOT" "$RECIPE_DIR/train.sh"
    shift
    EVAL_TEMPERATURE=0
    recipe_specs "$CONFIG"
    if [[ $EVAL_TEMPERATURE == 1 ]]; then
        lib_eval_with_temperature "$DATA_DIR/data-bin" "$CHECKPOINT" "${SPECS[@]}" -- "$@"
    else
        lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "${CHECKPOINT%.pt}.eval.txt" "${SPECS[@]}" -- "$@"
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
