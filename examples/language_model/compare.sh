#!/usr/bin/env bash
# The DeFINE paper's Table 1a at a small scale (the adaptive-input LSTM with and without DeFINE, R2 against R3), and
# transformer_lm_define against transformer_lm, on any word-level corpus, several seeds, equal updates and time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

SAVE_EVERY=200 TIME_MARGIN=200
OUT=lm_compare_output SEEDS=3 UPDATES=3000
MODELS="lstm_adaptive lstm_adaptive_define lstm_adaptive_define_eq lstm_adaptive_define_ln_eq transformer_lm"
MODELS+=" transformer_lm_define transformer_lm_define_eq"
declare -A MODEL=(
    [lstm_adaptive]="--arch lstm_lm_adaptive_wt103"
    [lstm_adaptive_define]="--arch lstm_lm_define_wt103_n3 --define-k 1024"
    [lstm_adaptive_define_eq]="--arch lstm_lm_define_wt103_n3 --define-k 1024 --define-n {}"
    [lstm_adaptive_define_ln_eq]="--arch lstm_lm_define_wt103_n3 --define-k 1024 --define-output-norm layer
                                  --define-n {}"
    [transformer_lm]="--arch transformer_lm --share-decoder-input-output-embed"
    [transformer_lm_define]="--arch transformer_lm_define --define-n 64 --define-k 512"
    [transformer_lm_define_eq]="--arch transformer_lm_define --define-n {} --define-k 512"
)
# time_reference NAME (compare_run's): each family's equal time is its baseline's.
time_reference() {
    case $1 in transformer*) echo transformer_lm ;; *) echo lstm_adaptive ;; esac
}
usage() {
    lm_compare_usage "$(cat <<EOF
Models (Adam at a constant lr 0.001, dropout 0.1, the gradient norm clipped at 0.25, for all):
  lstm_adaptive           Table 1a R2 at a small size: 2 LSTM layers (512, 256), adaptive input and softmax of
                          width 256, tied, clusters at a quarter and three quarters of the vocabulary
                          (--task stateful_lm, 20 streams x BPTT 35, scored with the state carried, batch 1)
  lstm_adaptive_define    R3: the same with DeFINE (N = 3, k = 1024, n = m = 256) on the adaptive input
  lstm_adaptive_define_eq R3 at R2's parameter count, as the paper's R3 nearly is (+1.3%): adaptive input and
                          softmax at the largest width n (a multiple of 4) whose model has no more parameters
                          than lstm_adaptive, DeFINE mapping n to 256; the last LSTM layer, which the tied
                          softmax reads, has width n too (lstm_lm_define's default)
  lstm_adaptive_define_ln_eq  the same with a LayerNorm over DeFINE's output (--define-output-norm layer), at
                          R2's parameter count too
  transformer_lm          2 layers, d 256, FFN 1024, 4 heads, softmax tied to the V x 256 table (64-token
                          blocks, scored with 32 tokens of context)
  transformer_lm_define   the same with a V x 64 table and DeFINE (N = 3, k = 512) to 256, softmax tied to it
  transformer_lm_define_eq  DeFINE at the largest n whose model has no more parameters than transformer_lm
EOF
)" "test perplexity" "its family's baseline"
}
lm_compare_start "$@"
# --required-batch-size-multiple 1: fairseq's default 8 drops a split's last batch when it is smaller (examples/lib.sh)
COMMON=(--user-dir define_fairseq --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.001 --clip-norm 0.25
        --dropout 0.1 --required-batch-size-multiple 1 --num-workers 0 --max-epoch 1000 --ddp-backend legacy_ddp)
# --decoder-input-dim / --decoder-output-dim: without them fairseq's transformer_lm keeps their default of 512 and
# builds a V x 512 table with projections to and from d 256.
TRANSFORMER=(--task language_modeling --tokens-per-sample 64 --sample-break-mode none --max-tokens 2048
             --decoder-layers 2 --decoder-embed-dim 256 --decoder-input-dim 256 --decoder-output-dim 256
             --decoder-ffn-embed-dim 1024 --decoder-attention-heads 4 --criterion cross_entropy)
LSTM=(--task stateful_lm --tokens-per-sample 35 --batch-size 20 --batch-size-valid 10
      --decoder-embed-dim 256 --define-n 256 --decoder-hidden-size 512 --decoder-layers 2
      --adaptive-input-cutoff "$((V / 4)),$((V * 3 / 4))" --adaptive-softmax-cutoff "$((V / 4)),$((V * 3 / 4))"
      --criterion adaptive_loss)

family() {  # family NAME: the arguments of NAME's family
    case $1 in transformer*) FAMILY=("${TRANSFORMER[@]}") ;; *) FAMILY=("${LSTM[@]}") ;; esac
}

# transformer_lm_define_eq's n: the largest multiple of the unit's 4 groups (up to k) within transformer_lm's count,
# -x's arguments included, kept in OUT/define_eq (lib.sh's equal_size).
if [[ " $MODELS " == *" transformer_lm_define_eq "* ]]; then
    equal_size "$OUT/define_eq" "${MODEL[transformer_lm]} $EXTRA" "${MODEL[transformer_lm_define_eq]} $EXTRA" \
        4 512 4 "$OUT/data-bin" "${COMMON[@]}" "${TRANSFORMER[@]}" --cpu
    MODEL[transformer_lm_define_eq]=${MODEL[transformer_lm_define_eq]//\{\}/$EQUAL_SIZE}
fi

# The n of lstm_adaptive_define_eq and lstm_adaptive_define_ln_eq: the largest multiple of the unit's 4 groups from
# 16 (the third adaptive band has n/16) to 256 within lstm_adaptive's count, -x's arguments included, kept in
# OUT/define_eq_lstm and OUT/define_ln_eq_lstm.
NOTE=""
for name in lstm_adaptive_define_eq lstm_adaptive_define_ln_eq; do
    [[ " $MODELS " == *" $name "* ]] || continue
    file=$OUT/define_eq_lstm
    [[ $name == lstm_adaptive_define_eq ]] || file=$OUT/define_ln_eq_lstm
    equal_size "$file" "${MODEL[lstm_adaptive]} $EXTRA" "${MODEL[$name]} $EXTRA" \
        16 256 4 "$OUT/data-bin" "${COMMON[@]}" "${LSTM[@]}" --cpu
    MODEL[$name]=${MODEL[$name]//\{\}/$EQUAL_SIZE}
    NOTE+="${NOTE:+ }$name: n = $EQUAL_SIZE."
done

# run_args NAME SEED (compare_run's): NAME's family and model, with -x's arguments.
run_args() {
    family "$1"
    # shellcheck disable=SC2206
    RUN_ARGS=("$OUT/data-bin" "${COMMON[@]}" "${FAMILY[@]}" ${MODEL[$1]} "${DEVICE_ARGS[@]}" --seed "$2" $EXTRA)
}

# score_checkpoint CHECKPOINT DIR (compare_run's): test perplexity.
score_checkpoint() {
    local dir=$2
    case $(basename "$dir") in
        transformer*) eval_lm_test "$OUT" "$dir" --task language_modeling --tokens-per-sample 64 \
                            --context-window 32 --max-tokens 2048 --path "$1" ;;
        *) eval_lm_test "$OUT" "$dir" --task stateful_lm --tokens-per-sample 35 --batch-size 1 --path "$1" ;;
    esac
    test_perplexity "$dir"
}

lm_compare_report "the family's baseline" "${NOTE:-}"
