# shellcheck shell=bash
# The eval.sh of the PTB and WikiText-2 recipes (sourced after lib.sh, not run): both evaluate AWD-LSTM and the
# Mogrifier LSTM the same way and differ only in the corpus and the names of its configs.

# lstm_eval CORPUS SUFFIX ARGS... : run eval.sh with the command line ARGS on the corpus whose data and
# checkpoints are in data/CORPUS and checkpoints/CORPUS by default (e.g. ptb) and whose Mogrifier configs are
# mogrifier_lstm_lm_SUFFIX and lstm_lm_SUFFIX (e.g. ptb).
lstm_eval() {
    CORPUS=$1
    TEMPERATURE_CONFIGS="mogrifier_lstm_lm_$2 lstm_lm_$2"
    CONFIGS="awd_lstm_lm awd_lstm_lm_define $TEMPERATURE_CONFIGS"
    shift 2

    DATA_DIR=${DATA_DIR:-data/$CORPUS}
    SAVE_ROOT=${SAVE_ROOT:-checkpoints/$CORPUS}
    CONFIG=""
    lib_parse_options hc:d:s: "CONFIG or CHECKPOINT" "$@"
    shift "$LIB_SHIFT"
    local target=$1
    shift

    lib_eval_target "$target" "$CONFIG" "$CONFIGS" "$SAVE_ROOT" "$HERE/train.sh"

    local specs=("valid|stateful, BPTT 70, 10 streams|--task stateful_lm --tokens-per-sample 70 --batch-size 10"
                 "test|stateful, BPTT 70, 1 stream|--task stateful_lm --tokens-per-sample 70 --batch-size 1")
    if [[ " $TEMPERATURE_CONFIGS " == *" $CONFIG "* ]]; then
        lib_eval_with_temperature "$DATA_DIR/data-bin" "$CHECKPOINT" "${specs[@]}" -- "$@"
    else
        lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "${CHECKPOINT%.pt}.eval.txt" "${specs[@]}" -- "$@"
    fi
}

usage() {
    lib_eval_usage "$CORPUS" "$CONFIGS" "$(cat <<HOW
As AWD-LSTM evaluates: --task stateful_lm, BPTT 70, the state carried through the whole split, valid with 10
parallel streams, test with 1.

For the Mogrifier configs (${TEMPERATURE_CONFIGS// /, }) the perplexities are given twice: as they are
(softmax temperature T = 1), and as the Mogrifier paper reports them, with the softmax temperature T tuned on the
valid split (the lowest valid perplexity) and then applied to test; written to <checkpoint>.eval.temperature.txt
(logs <checkpoint>.eval.temperature.<split>.T<T>.log). T divides the logits (--model-overrides
"{'mogrifier_softmax_temperature': T}"). The grid is the official code's: it multiplies the logits by
t = 1.06, 1.04, ..., 0.80, i.e. T = 1/t from 0.9434 to 1.2500; TEMPERATURES="T1 T2 ..." sets another grid.
HOW
)"
}
