#!/usr/bin/env bash
# Perplexity of a WikiText-2 model of this recipe on the valid and test splits (fairseq-eval-lm).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

TEMPERATURE_CONFIGS="mogrifier_lstm_lm_wt2 lstm_lm_wt2"
CONFIGS="awd_lstm_lm awd_lstm_lm_define $TEMPERATURE_CONFIGS"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-d DATA_DIR] [-s SAVE_ROOT] [-c CONFIG] CONFIG|CHECKPOINT [fairseq-eval-lm arguments...]

Evaluate SAVE_ROOT/CONFIG/checkpoint_best.pt (or the CHECKPOINT file given) on the valid and test splits of
DATA_DIR/data-bin and print the perplexities; they are also written to <checkpoint>.eval.txt (reused while the
checkpoint and the arguments are unchanged; FORCE=1 redoes it) with the full fairseq output in
<checkpoint>.eval.<split>.log. Arguments after the checkpoint are appended to every fairseq-eval-lm call
(e.g. --cpu).

As AWD-LSTM evaluates: --task stateful_lm, BPTT 70, the state carried through the whole split, valid with 10
parallel streams, test with 1.

For the Mogrifier configs (mogrifier_lstm_lm_wt2, lstm_lm_wt2) the perplexities are given twice: as they are
(softmax temperature T = 1), and as the Mogrifier paper reports them, with the softmax temperature T tuned on the
valid split (the lowest valid perplexity) and then applied to test; written to <checkpoint>.eval.temperature.txt
(logs <checkpoint>.eval.temperature.<split>.T<T>.log). T divides the logits (--model-overrides
"{'mogrifier_softmax_temperature': T}"). The grid is the official code's: it multiplies the logits by
t = 1.06, 1.04, ..., 0.80, i.e. T = 1/t from 0.9434 to 1.2500; TEMPERATURES="T1 T2 ..." sets another grid.

Options:
  -c CONFIG     the config of a CHECKPOINT whose folder is not named after it
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/wikitext-2)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/wikitext-2)
  -h            this help
CONFIG is one of: $CONFIGS
USAGE
}

DATA_DIR=${DATA_DIR:-data/wikitext-2}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/wikitext-2}
CONFIG=""
while getopts ":hc:d:s:" opt; do
    case $opt in
        h) usage; exit 0 ;;
        c) CONFIG=$OPTARG ;;
        d) DATA_DIR=$OPTARG ;;
        s) SAVE_ROOT=$OPTARG ;;
        :) usage >&2; die "option -$OPTARG needs a value" ;;
        *) usage >&2; die "unknown option -$OPTARG" ;;
    esac
done
shift $((OPTIND - 1))
(( $# >= 1 )) || { usage >&2; die "missing CONFIG or CHECKPOINT"; }
TARGET=$1
shift

is_config() { [[ " $CONFIGS " == *" $1 "* ]]; }
if [[ -f $TARGET ]]; then
    CHECKPOINT=$TARGET
    [[ -n $CONFIG ]] || CONFIG=$(basename "$(dirname "$TARGET")")
    is_config "$CONFIG" || die "cannot tell which config $TARGET belongs to (its folder is not named after one);" \
        "give it with -c CONFIG ($CONFIGS)"
elif is_config "$TARGET"; then
    [[ -z $CONFIG || $CONFIG == "$TARGET" ]] || die "-c $CONFIG contradicts CONFIG $TARGET"
    CONFIG=$TARGET
    CHECKPOINT="$SAVE_ROOT/$CONFIG/checkpoint_best.pt"
    [[ -f $CHECKPOINT ]] || die "$CHECKPOINT not found; train it first: $HERE/train.sh $CONFIG" \
        "(or give -s SAVE_ROOT / a checkpoint file)"
else
    die "'$TARGET' is neither a checkpoint file nor a config ($CONFIGS)"
fi

SPECS=("valid|stateful, BPTT 70, 10 streams|--task stateful_lm --tokens-per-sample 70 --batch-size 10"
       "test|stateful, BPTT 70, 1 stream|--task stateful_lm --tokens-per-sample 70 --batch-size 1")

if [[ " $TEMPERATURE_CONFIGS " != *" $CONFIG "* ]]; then
    lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "${CHECKPOINT%.pt}.eval.txt" "${SPECS[@]}" -- "$@"
    exit 0
fi

# The official code's temperature grid (lamb/evaluation.py multiplies the logits by t = 1.06 - 0.02 i down to
# 0.80); here T divides them, so T = 1 / t.
LAMB_TEMPERATURES=$(awk 'BEGIN { for (i = 0; i <= 13; i++) printf "%s%.4f", (i ? " " : ""), 1 / (1.06 - 0.02 * i) }')
VALID_ARGS=(--task stateful_lm --tokens-per-sample 70 --batch-size 10)
TEST_ARGS=(--task stateful_lm --tokens-per-sample 70 --batch-size 1)

# tune_temperature DATA_BIN CHECKPOINT RESULTS EXTRA... : score the valid split at every temperature of the grid,
# then the test split at the best one; write RESULTS (atomically: a signature line, then a valid and a test
# line). Reused, as lib_eval's results, while the checkpoint and the arguments are unchanged (FORCE=1 redoes it).
tune_temperature() {
    local data_bin=$1 checkpoint=$2 results=$3
    shift 3
    local grid=${TEMPERATURES:-$LAMB_TEMPERATURES}
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
        lib_eval_split "$stem.valid.T$t.log" "$data_bin" "$checkpoint" valid "${VALID_ARGS[@]}" \
            --model-overrides "{'mogrifier_softmax_temperature': $t}" "$@"
        printf '    T = %s: valid perplexity %s\n' "$t" "$EVAL_PPL"
        count=$((count + 1))
        if [[ -z $best_loss ]] || awk -v a="$EVAL_LOSS" -v b="$best_loss" 'BEGIN { exit !(a < b) }'; then
            best_t=$t best_loss=$EVAL_LOSS best_ppl=$EVAL_PPL
        fi
    done
    log "fairseq-eval-lm on test with the softmax temperature T = $best_t (the best on valid)"
    lib_eval_split "$stem.test.T$best_t.log" "$data_bin" "$checkpoint" test "${TEST_ARGS[@]}" \
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

SPECS[0]="valid|T = 1; ${SPECS[0]#valid|}"
SPECS[1]="test|T = 1; ${SPECS[1]#test|}"
PLAIN_RESULTS="${CHECKPOINT%.pt}.eval.txt"
TEMPERATURE_RESULTS="${CHECKPOINT%.pt}.eval.temperature.txt"
lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "$PLAIN_RESULTS" "${SPECS[@]}" -- "$@"
tune_temperature "$DATA_DIR/data-bin" "$CHECKPOINT" "$TEMPERATURE_RESULTS" "$@"
log "results of $CHECKPOINT"
printf 'without softmax temperature (T = 1):\n'
tail -n +2 "$PLAIN_RESULTS"
printf 'with the softmax temperature tuned on valid (the Mogrifier paper'"'"'s protocol):\n'
tail -n +2 "$TEMPERATURE_RESULTS"
