#!/usr/bin/env bash
# The DeFINE paper's Table 2 at a small scale: Transformer-XL with the standard, the projective and the DeFINE input
# at the same n, and the projective input at DeFINE's parameter count, on any word-level corpus, several seeds.
set -euo pipefail
usage() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT] [-s SEEDS] [-u UPDATES] [-L LONG] [-n LONG_SEEDS] [-i INTERVAL] [-m MODELS]
                  [-c CORPUS_DIR] [-x "TRAIN ARGS"] [-T] [-d cpu|cuda] [-p fp32|bf16]

Text: CORPUS_DIR/{train,valid,test}.txt (one paragraph or sentence a line, tokens separated by spaces;
examples/language_model/corpus.sh builds one from Debian's manuals), or the English side of the demo corpus; word
level, words seen fewer than 3 times in train mapped to <unk>.

Model, the same for all but the input layer: transformer_xl_lm, $LAYERS layers, d $D, $HEADS heads, FFN $FFN,
segments of $SEGMENT tokens with a memory of $SEGMENT, dropout 0.1; Transformer-XL's projected adaptive softmax with
clusters at 10% and 30% of the vocabulary, tied to the V x n table. Adam, lr $LR, $WARMUP warm-up updates then
inverse square root, gradient norm clipped at 0.25, $BATCH streams a batch.
  standard        a V x $D table (n = d)
  projective      a V x $N table and an n -> d projection (Transformer-XL's adaptive input with div_val 1)
  define          a V x $N table and DeFINE (N = 3, k = $K) to d
  projective_eq   the projective input at DeFINE's parameter count (the largest such n below d; the vocabulary
                  must be large enough for the unit's parameters to fit in d - $N - 1 more table columns)
Each model of MODELS (default: "projective define standard projective_eq") trains once per seed 1..SEEDS (default
3), saving and validating every INTERVAL updates (default $SAVE_EVERY), and is scored (test perplexity with the memory
carried, evaluated with a memory of $EVAL_MEMORY as Transformer-XL evaluates with a longer one) at:
  - equal updates: after UPDATES updates (default $UPDATES);
  - equal time (skipped with -T): the last checkpoint within the first model's time for UPDATES updates (the
    others train $((TIME_MARGIN - 100))% past UPDATES for it);
  - longer training (with -L): after LONG updates, for seeds 1..LONG_SEEDS (default 1).
-x adds fairseq-train arguments to every model alike; -d cuda and -p bf16 train on the GPU, in bfloat16.
Writes OUT/results.md and OUT/curves.png (validation loss against updates and time). OUT defaults to
txl_compare_output. A rerun skips what is done; give each setting (-x) its own
OUT. Time figures need a machine doing nothing else.
EOF
}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

LAYERS=4 D=128 HEADS=4 FFN=512 SEGMENT=64 EVAL_MEMORY=256 N=64 K=1024 LR=1e-3 WARMUP=400 BATCH=16
SAVE_EVERY=200 TIME_MARGIN=130
OUT=txl_compare_output SEEDS=3 UPDATES=4000 MODELS="projective define standard projective_eq" CORPUS="" TIMED=1
LONG=0 LONG_SEEDS=1 EXTRA=""
compare_option() {
    case $1 in u) UPDATES=$2 ;; T) TIMED=0 ;; L) LONG=$2 ;; n) LONG_SEEDS=$2 ;; i) SAVE_EVERY=$2 ;; x) EXTRA=$2 ;; esac
}
compare_options u:TL:n:i:x: "$@"
require_tools python fairseq-preprocess fairseq-eval-lm
declare -A MODEL=(
    [standard]="--txl-input standard --define-n $D"
    [projective]="--txl-input projective --define-n $N"
    [define]="--txl-input define --define-n $N --define-k $K --define-depth 3"
    [projective_eq]="--txl-input projective --define-n PROJECTIVE_EQ_N"
)
compare_check_models
compare_check_points

mkdir -p "$OUT"
lm_data "$OUT" "$CORPUS"
V=$(vocabulary_size "$OUT")
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
    equal_size "$OUT/projective_eq" "${MODEL[define]} $EXTRA" "--txl-input projective --define-n {} $EXTRA" \
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

compare_run_all
compare_report "test perplexity" "Vocabulary: $V symbols (words seen at least 3 times in train, plus fairseq's" \
    "specials). Every point comes from one run per model and seed (OUT/runs/train), checkpointed every $SAVE_EVERY" \
    "updates; equal time: the last checkpoint within the first model's time.${EXTRA:+ Every model with: $EXTRA.}"
