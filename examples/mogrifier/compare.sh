#!/usr/bin/env bash
# The Mogrifier paper's Table 1 at a small scale: the Mogrifier LSTM against the LSTM with the same parameter count,
# on any word-level corpus, several seeds, equal updates and equal time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

HIDDEN=256 ROUNDS=5 RANK=32 STREAMS=20 BPTT=35
SAVE_EVERY=200 TIME_MARGIN=110
OUT=mogrifier_compare_output SEEDS=3 UPDATES=4000 MODELS="lstm mogrifier"
declare -A MODEL=(
    [mogrifier]="--mogrifier-rounds $ROUNDS --mogrifier-rank $RANK --mogrifier-hidden-size $HIDDEN
                 --mogrifier-embed-dim $HIDDEN"
    [lstm]="--mogrifier-rounds 0 --mogrifier-hidden-size {} --mogrifier-embed-dim {}"
)
usage() {
    lm_compare_usage "$(cat <<EOF
Models (mogrifier_lstm_lm, 2 layers, embeddings as wide as the hidden state and tied to the softmax, the two
layers' outputs summed, lamb's capped input gate; the paper's protocol: equal parameter counts):
  lstm        rounds 0, the largest hidden size whose model has no more parameters than the Mogrifier
  mogrifier   hidden $HIDDEN, r = $ROUNDS rounds of rank k = $RANK
Both train alike: variational dropout 0.3 on the input, 0.2 between the layers, 0.2 on the state, 0.3 on the output
(the paper's tuned PTB values, about 0.7 / 0.3 / 0.4 / 0.7, are for 24M parameters on 1M words); Adam (0, 0.999)
at a constant lr 0.002, the gradient norm clipped at 10 (lamb's setting); --task stateful_lm, $STREAMS streams x BPTT
$BPTT, the state carried across batches.
EOF
)" "test perplexity, the state carried, batch 1, temperature 1" "the first model"
}
lm_compare_start "$@"
# shellcheck disable=SC2054
MOGRIFIER=(--user-dir define_fairseq --task stateful_lm --arch mogrifier_lstm_lm --mogrifier-layers 2
           --mogrifier-sum-layer-outputs --tokens-per-sample "$BPTT" --batch-size "$STREAMS"
           --batch-size-valid "$STREAMS" --mogrifier-input-dropout 0.3 --mogrifier-inter-layer-dropout 0.2
           --mogrifier-state-dropout 0.2 --mogrifier-output-dropout 0.3 --mogrifier-shared-mask-dropout
           --criterion cross_entropy --optimizer adam --adam-betas '(0, 0.999)' --lr 0.002 --lr-scheduler fixed
           --clip-norm 10 --num-workers 0 --max-epoch 1000)

# The LSTM's hidden size: the largest within the Mogrifier's count, -x's arguments included, kept in OUT/lstm_size
# (lib.sh's equal_size).
if [[ " $MODELS " == *" lstm "* ]]; then
    equal_size "$OUT/lstm_size" "${MODEL[mogrifier]} $EXTRA" "${MODEL[lstm]} $EXTRA" 1 $((HIDDEN * 2)) 1 \
        "$OUT/data-bin" "${MOGRIFIER[@]}" --cpu
    MODEL[lstm]=${MODEL[lstm]//\{\}/$EQUAL_SIZE}
fi

# run_args NAME SEED (compare_run's): the common model and training, with NAME's size and -x's arguments.
run_args() {
    # shellcheck disable=SC2206
    RUN_ARGS=("$OUT/data-bin" "${MOGRIFIER[@]}" ${MODEL[$1]} "${DEVICE_ARGS[@]}" --seed "$2" $EXTRA)
}

# score_checkpoint CHECKPOINT DIR (compare_run's): test perplexity, the state carried across the test stream.
score_checkpoint() {
    eval_lm_test "$OUT" "$2" --task stateful_lm --tokens-per-sample "$BPTT" --batch-size 1 --path "$1"
    test_perplexity "$2"
}

lstm_note=""
[[ " $MODELS " != *" lstm "* ]] || lstm_note="lstm: ${MODEL[lstm]}."
lm_compare_report "the first model" "$lstm_note"
