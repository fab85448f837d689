#!/usr/bin/env bash
# The DeFINE paper's Table 2 at a small scale: Transformer-XL with the standard, the projective and the DeFINE input
# at the same n, and the projective input at DeFINE's parameter count, on any word-level corpus, several seeds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

LAYERS=4 D=128 HEADS=4 FFN=512 SEGMENT=64 EVAL_MEMORY=256 N=64 K=1024 LR=1e-3 WARMUP=400 BATCH=16
SAVE_EVERY=200 TIME_MARGIN=130
OUT=txl_compare_output SEEDS=3 UPDATES=3000 MODELS="define projective standard projective_eq"
declare -A MODEL=(
    [standard]="--input-layer table"
    [projective]="--input-layer projective --define-n $N"
    [define]="--input-layer define --define-n $N --define-k $K --define-depth 3"
    [projective_eq]="--input-layer projective --define-n PROJECTIVE_EQ_N"
)
usage() {
    lm_compare_usage "$(cat <<EOF
Model, the same for all but the input layer: transformer_xl_lm, $LAYERS layers, d $D, $HEADS heads, FFN $FFN,
segments of $SEGMENT tokens with a memory of $SEGMENT, dropout 0.1; Transformer-XL's projected adaptive softmax with
clusters at 10% and 30% of the vocabulary, tied to the V x n table. Adam, lr $LR, $WARMUP warm-up updates then
inverse square root, gradient norm clipped at 0.25, $BATCH streams a batch.
  standard        a V x $D table (n = d)
  projective      a V x $N table and an n -> d projection (Transformer-XL's adaptive input with div_val 1)
  define          a V x $N table and DeFINE (N = 3, k = $K) to d
  projective_eq   the projective input at DeFINE's parameter count (the largest such n below d; the vocabulary
                  must be large enough for the unit's parameters to fit in d - $N - 1 more table columns)
EOF
)" "test perplexity, the memory carried, a memory of $EVAL_MEMORY (longer, as Transformer-XL evaluates)" \
        "the first model"
}
lm_compare_start "$@"
# shellcheck disable=SC2054
TXL=(--user-dir define_fairseq --task stateful_lm --arch transformer_xl_lm --decoder-layers "$LAYERS"
     --decoder-embed-dim "$D" --decoder-attention-heads "$HEADS" --txl-head-dim $((D / HEADS))
     --decoder-ffn-embed-dim "$FFN" --txl-mem-len "$SEGMENT" --tokens-per-sample "$SEGMENT" --batch-size "$BATCH"
     --batch-size-valid "$BATCH" --dropout 0.1 --adaptive-softmax-cutoff "$((V / 10)),$((V * 3 / 10))"
     --criterion lm_regularized_loss --optimizer adam --adam-betas '(0.9, 0.999)' --lr "$LR"
     --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-7 --clip-norm 0.25
     --ddp-backend legacy_ddp --num-workers 0 --max-epoch 1000)

# projective_eq's n: the largest n < d at which the projective input has no more parameters than DeFINE, -x's
# arguments included, kept in OUT/projective_eq (lib.sh's equal_size).
if [[ " $MODELS " == *" projective_eq "* ]]; then
    equal_size "$OUT/projective_eq" "${MODEL[define]} $EXTRA" "--input-layer projective --define-n {} $EXTRA" \
        "$N" $((D - 1)) 1 "$OUT/data-bin" "${TXL[@]}" --cpu
    MODEL[projective_eq]=${MODEL[projective_eq]//PROJECTIVE_EQ_N/$EQUAL_SIZE}
fi

# run_args NAME SEED (compare_run's): the common model and training, with NAME's input layer and -x's arguments.
run_args() {
    # shellcheck disable=SC2206
    RUN_ARGS=("$OUT/data-bin" "${TXL[@]}" ${MODEL[$1]} "${DEVICE_ARGS[@]}" --seed "$2" $EXTRA)
}

# score_checkpoint CHECKPOINT DIR (compare_run's): test perplexity, the memory carried across the test stream.
score_checkpoint() {
    eval_lm_test "$OUT" "$2" --task stateful_lm --tokens-per-sample "$SEGMENT" --batch-size 10 --path "$1" \
        --model-overrides "{'txl_mem_len': $EVAL_MEMORY, 'txl_same_length': True}"
    test_perplexity "$2"
}

lm_compare_report "the first model"
