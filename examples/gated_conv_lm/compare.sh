#!/usr/bin/env bash
# gcnn_lm (the paper's layout) against fairseq's fconv_lm at the same shape, on any word-level corpus, several
# seeds, equal updates and equal time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

SAVE_EVERY=100 TIME_MARGIN=120
OUT=gcnn_compare_output SEEDS=3 UPDATES=1000 MODELS="fconv_lm gcnn_lm_8"
declare -A MODEL=(
    [gcnn_lm_8]="--arch gcnn_lm_8 --decoder-embed-dim 128 --gcnn-layers [(256,4)]*8"
    [fconv_lm]="--arch fconv_lm --decoder-embed-dim 128 --decoder-layers [(256,4)]*8"
)
usage() {
    lm_compare_usage "$(cat <<EOF
Models, GCNN-8's shape (8 gated convolutions of kernel 4) at a small size (lookup 128, width 256), the same
adaptive softmax (clusters at a quarter and three quarters of the vocabulary) and dropout 0.1 for both:
  fconv_lm     fairseq's (an input projection, residuals scaled by sqrt(0.5) around every layer)
  gcnn_lm_8    the paper's layout (define_fairseq's gcnn_lm)
The paper's optimiser for both: Nesterov momentum 0.99, lr 1, gradient norm clipped at 0.1; blocks of 128 tokens,
2048 tokens a batch.
EOF
)" "test perplexity, every token after 32 tokens of context (more than the receptive field)" "the first model"
}
lm_compare_start "$@"
COMMON=(--user-dir define_fairseq --task language_modeling --tokens-per-sample 128 --sample-break-mode none
        --max-tokens 2048 --criterion adaptive_loss --adaptive-softmax-cutoff "$((V / 4)),$((V * 3 / 4))"
        --dropout 0.1 --optimizer nag --momentum 0.99 --lr 1.0 --clip-norm 0.1 --weight-decay 0
        --required-batch-size-multiple 1 --num-workers 0 --max-epoch 1000 --ddp-backend legacy_ddp)

# run_args NAME SEED (compare_run's): the common training, with NAME's model and -x's arguments.
run_args() {
    local -
    set -f  # the layer specs ([(256,4)]*8) are words, not file patterns
    # shellcheck disable=SC2206
    RUN_ARGS=("$OUT/data-bin" "${COMMON[@]}" ${MODEL[$1]} "${DEVICE_ARGS[@]}" --seed "$2" $EXTRA)
}

# score_checkpoint CHECKPOINT DIR (compare_run's): test perplexity, 128-token blocks of which the last 96 are
# scored, each after 32 tokens of context.
score_checkpoint() {
    # fairseq's fconv_lm keeps its options as an argparse.Namespace, which torch >= 2.6 unpickles only with
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (these checkpoints are this script's own).
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 eval_lm_test "$OUT" "$2" --task language_modeling --tokens-per-sample 128 \
        --context-window 32 --max-tokens 2048 --path "$1"
    test_perplexity "$2"
}

lm_compare_report "the first model"
