#!/usr/bin/env bash
# Real-text comparison on CPU: the Mogrifier LSTM against the plain LSTM (rounds 0) with the same parameter count,
# each trained for the same wall time.
#
#   bash examples/mogrifier/compare.sh [OUT_DIR] [MINUTES_PER_MODEL]
#
# Text: the English side of the demo corpus (English gettext messages installed on this machine, see
# examples/demo/README.md), word level, words seen fewer than 3 times in train mapped to <unk> (the same text as
# examples/language_model/compare.sh). Two 2-layer models with tied embeddings, trained with the plugin's
# truncated-BPTT task for MINUTES_PER_MODEL (default 5) each with --stop-time-hours, then scored on the test split
# with fairseq-eval-lm (state carried, batch 1), at softmax temperature 1. Results: OUT_DIR/results.md (default
# mogrifier_compare_output/). Steps whose output exists are skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-mogrifier_compare_output}
MINUTES=${2:-5}
source examples/lib.sh
require_tools python fairseq-preprocess fairseq-train fairseq-eval-lm
HOURS=$(python -c "print($MINUTES / 60)")
mkdir -p "$OUT"

lm_data "$OUT"  # the English side of the demo corpus, binarised (examples/lib.sh)

# Same regularisation for both; the LSTM's hidden size is the largest whose parameter count does not exceed the
# Mogrifier's (the paper's protocol: equal budgets, so the Mogrifier's rounds cost it hidden units).
COMMON=(--task stateful_lm --tokens-per-sample 35 --batch-size 20 --batch-size-valid 10
        --mogrifier-layers 2 --mogrifier-input-dropout 0.3 --mogrifier-inter-layer-dropout 0.2
        --mogrifier-state-dropout 0.2 --mogrifier-output-dropout 0.3 --mogrifier-shared-mask-dropout
        --criterion cross_entropy --optimizer adam --adam-betas '(0, 0.999)' --lr 0.002 --clip-norm 10
        --seed 1 --cpu --num-workers 0 --stop-time-hours "$HOURS" --max-epoch 1000 --disable-validation)
declare -A MODEL=(
    [mogrifier]="--arch mogrifier_lstm_lm_ptb --mogrifier-hidden-size 256 --mogrifier-embed-dim 256 --mogrifier-rounds 5 --mogrifier-rank 32"
    [lstm]="--arch lstm_lm_ptb --mogrifier-hidden-size HIDDEN --mogrifier-embed-dim HIDDEN --mogrifier-rounds 0"
)

params() {  # params <args...>: the total parameter count (an integer) of the model those arguments build
    python - "$@" <<'PY'
import logging, sys, warnings
logging.disable(logging.INFO); warnings.filterwarnings("ignore")
from define_fairseq.tools.params import parameter_breakdown, setup_from_train_args
_, _, model = setup_from_train_args(sys.argv[1:])
print(parameter_breakdown(model)["total"])
PY
}
TRAIN_ARGS=("$OUT/data-bin" --user-dir define_fairseq)
# shellcheck disable=SC2206
mog=(${MODEL[mogrifier]})
budget=$(params "${TRAIN_ARGS[@]}" "${mog[@]}" "${COMMON[@]}")
hidden=256
while (( $(params "${TRAIN_ARGS[@]}" ${MODEL[lstm]//HIDDEN/$((hidden + 1))} "${COMMON[@]}") <= budget )); do
    hidden=$((hidden + 1))
done
MODEL[lstm]=${MODEL[lstm]//HIDDEN/$hidden}
echo "Mogrifier: $budget parameters; LSTM with the same budget: hidden = embedding = $hidden"

for name in mogrifier lstm; do
    # shellcheck disable=SC2206
    model=(${MODEL[$name]})
    dir=$OUT/$name
    # a run counts as done only once it finished (train_run: its log says so); an interrupted one trains again
    grep -qs "done training" "$dir/train.log" || echo "==> training $name for $MINUTES min: ${MODEL[$name]}"
    train_run "$dir" "${TRAIN_ARGS[@]}" "${model[@]}" "${COMMON[@]}" --no-epoch-checkpoints
    params "${TRAIN_ARGS[@]}" "${model[@]}" "${COMMON[@]}" > "$dir/params.txt"
    eval_lm_test "$OUT" "$dir" --task stateful_lm --tokens-per-sample 35 --batch-size 1
done

{
    echo "| model | arguments | parameters | updates in $MINUTES min | test perplexity |"
    echo "|---|---|---|---|---|"
    for name in mogrifier lstm; do
        dir=$OUT/$name
        updates=$(grep -o 'num_updates[^0-9]*[0-9]*' "$dir/train.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
        ppl=$(test_perplexity "$dir")
        echo "| $name | \`${MODEL[$name]}\` | $(cat "$dir/params.txt") | $updates | $ppl |"
    done
    echo
    echo "Vocabulary: $(vocabulary_size "$OUT") symbols."
} > "$OUT/results.md"
cat "$OUT/results.md"
