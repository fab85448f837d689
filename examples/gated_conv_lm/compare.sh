#!/usr/bin/env bash
# Real-text comparison on CPU: gcnn_lm (the paper's layout) against fairseq's fconv_lm, same shape, same wall time.
#
#   bash examples/gated_conv_lm/compare.sh [OUT_DIR] [UPDATES]
#
# Text: the English side of the demo corpus (English gettext messages installed on this machine, see
# examples/demo/README.md), word level, split as the demo splits it; words seen fewer than 3 times in train
# become <unk>. Both models have GCNN-8's shape (8 gated convolutions of kernel 4) at CPU size (lookup 128,
# width 256) and the same adaptive softmax; they differ where fairseq departs from the paper (fairseq: an input
# projection fc1, residuals scaled by sqrt(0.5) around every layer). Each is trained for UPDATES (default 1000)
# updates of 2048 tokens with the paper's optimiser (Nesterov momentum 0.99, lr 1, gradient clipping 0.1), the
# same number for both so that load from other processes cannot favour one (the wall time is reported), then scored on the test split with fairseq-eval-lm, every token with its full receptive field (25 tokens)
# of context. The results land in OUT_DIR/results.md (default: gcnn_compare_output/). Steps whose output exists
# are skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-gcnn_compare_output}
UPDATES=${2:-1000}
source examples/lib.sh
require_tools python fairseq-preprocess fairseq-train fairseq-eval-lm
mkdir -p "$OUT"

lm_data "$OUT"  # the English side of the demo corpus, binarised (examples/lib.sh)
VOCAB=$(vocabulary_size "$OUT")

# The paper's optimiser; dropout 0.1 for both (the paper uses none, but this corpus has 250k words).
COMMON=(--task language_modeling --tokens-per-sample 128 --sample-break-mode none --max-tokens 2048
        --criterion adaptive_loss --adaptive-softmax-cutoff 2000,6000 --dropout 0.1
        --optimizer nag --momentum 0.99 --lr 1.0 --clip-norm 0.1 --weight-decay 0 --seed 1
        --cpu --num-workers 0 --no-progress-bar --log-format simple --log-interval 50
        --max-update "$UPDATES" --max-epoch 1000 --disable-validation --no-epoch-checkpoints
        --ddp-backend legacy_ddp)
declare -A MODEL=(
    [gcnn_lm_8]="--arch gcnn_lm_8 --decoder-embed-dim 128 --gcnn-layers [(256,4)]*8"
    [fconv_lm]="--arch fconv_lm --decoder-embed-dim 128 --decoder-layers [(256,4)]*8"
)
ORDER=(gcnn_lm_8 fconv_lm)

for name in "${ORDER[@]}"; do
    # shellcheck disable=SC2206
    model=(${MODEL[$name]})
    dir=$OUT/$name
    if [[ ! -f $dir/train_seconds.txt ]]; then  # written last: an interrupted training starts over
        rm -rf "$dir"
        mkdir -p "$dir"
        echo "==> training $name for $UPDATES updates"
        start=$(date +%s)
        fairseq-train "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" "${COMMON[@]}" \
            --save-dir "$dir" > "$dir/train.log" 2>&1 || { tail -20 "$dir/train.log" >&2; exit 1; }
        echo $(( $(date +%s) - start )) > "$dir/train_seconds.txt"
    fi
    python -m define_fairseq.tools.params "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" \
        "${COMMON[@]}" > "$dir/params.txt"
    # 128-token blocks of which the last 96 are scored, each after 32 tokens of context (> the receptive field).
    # fairseq's fconv_lm keeps its options as an argparse.Namespace in the checkpoint, which torch >= 2.6 only
    # unpickles with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (the checkpoint was written just above).
    (
        [[ $name != fconv_lm ]] || export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
        eval_lm_test "$OUT" "$dir" --task language_modeling --tokens-per-sample 128 --context-window 32 \
            --max-tokens 2048
    )
done

{
    echo "| model | parameters (total) | of which input/output | updates | training time | test perplexity |"
    echo "|---|---|---|---|---|---|"
    for name in "${ORDER[@]}"; do
        dir=$OUT/$name
        total=$(awk '/^total/ {print $2}' "$dir/params.txt")
        io=$(awk '/^input\/output/ {print $2}' "$dir/params.txt")
        updates=$(grep -o 'num_updates": "[0-9]*\|num_updates [0-9]*\|num_updates=[0-9]*' "$dir/train.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
        ppl=$(test_perplexity "$dir")
        seconds=$(cat "$dir/train_seconds.txt")
        echo "| \`$name\` | $total | $io | $updates | ${seconds} s | $ppl |"
    done
    echo
    echo "Vocabulary: $VOCAB symbols (words seen at least 3 times in train, plus fairseq's specials)."
} > "$OUT/results.md"
cat "$OUT/results.md"
