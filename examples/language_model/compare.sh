#!/usr/bin/env bash
# Real-text comparison on CPU: DeFINE language models against their baselines, several seeds, equal wall time.
set -euo pipefail
usage() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT] [-s SEEDS] [-t MINUTES] [-m MODELS] [-c CORPUS_DIR]

Text: the English side of the demo corpus (examples/demo/README.md) or CORPUS_DIR's {train,valid,test}.txt, word
level, words seen fewer than 3 times in train mapped to <unk>. Each model of MODELS (default: all four) is trained for MINUTES (default 4) of wall time
with each seed 1..SEEDS (default 3), validated every 100 updates, then scored on the test split with
fairseq-eval-lm:
  transformer_lm        vs transformer_lm_define   (language_modeling, 64-token blocks, context window 32)
  lstm_adaptive         vs lstm_adaptive_define    (stateful_lm: state carried, BPTT 35, batch 20)
Writes OUT/results.md (parameters, test perplexity mean, standard deviation and per-seed values, updates) and
OUT/curves.png (validation loss against updates and time; needs matplotlib). OUT defaults to
lm_compare_output. A rerun skips what is done. Time figures need a machine doing nothing else.
EOF
}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

OUT=lm_compare_output SEEDS=3 MINUTES=4 MODELS="transformer_lm transformer_lm_define lstm_adaptive lstm_adaptive_define"
CORPUS=""
compare_option() { [[ $1 == t ]] && MINUTES=$2; }
compare_options t: "$@"
require_tools python fairseq-preprocess fairseq-eval-lm

# --required-batch-size-multiple 1: fairseq's default 8 drops a split's last batch when it is smaller (examples/lib.sh)
COMMON=(--optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.001 --clip-norm 0.25 --dropout 0.1
        --required-batch-size-multiple 1 --cpu --num-workers 0 --max-epoch 1000 --ddp-backend legacy_ddp)
TRANSFORMER=(--task language_modeling --tokens-per-sample 64 --sample-break-mode none --max-tokens 2048
             --decoder-layers 2 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-attention-heads 4
             --criterion cross_entropy)
LSTM=(--task stateful_lm --tokens-per-sample 35 --batch-size 20 --batch-size-valid 10
      --decoder-embed-dim 256 --define-n 256 --decoder-hidden-size 512 --decoder-layers 2
      --adaptive-input-cutoff 2000,6000 --adaptive-softmax-cutoff 2000,6000 --criterion adaptive_loss)
declare -A MODEL=(
    [transformer_lm]="--arch transformer_lm --share-decoder-input-output-embed"
    [transformer_lm_define]="--arch transformer_lm_define --define-n 64 --define-k 512"
    [lstm_adaptive]="--arch lstm_lm_adaptive_wt103"
    [lstm_adaptive_define]="--arch lstm_lm_define_wt103_n3 --define-k 1024"
)
compare_check_models

mkdir -p "$OUT"
lm_data "$OUT" "$CORPUS"

for seed in $(seq 1 "$SEEDS"); do
    for name in $MODELS; do
        dir=$OUT/runs/time/$name.s$seed
        [[ -f $dir/score ]] && continue
        case $name in transformer*) family=("${TRANSFORMER[@]}");; *) family=("${LSTM[@]}");; esac
        # shellcheck disable=SC2206
        args=("$OUT/data-bin" --user-dir define_fairseq ${MODEL[$name]} "${family[@]}" "${COMMON[@]}" --seed "$seed")
        echo "==> $name, seed $seed: $MINUTES min"
        train_run "$dir" "${args[@]}" --validate-interval-updates 100 --no-epoch-checkpoints \
            --stop-time-hours "$(python -c "print($MINUTES / 60)")"
        python -m define_fairseq.tools.params "${args[@]}" > "$dir/params.txt" 2> "$dir/params.log"
        case $name in
            transformer*) eval_args=(--task language_modeling --tokens-per-sample 64 --context-window 32
                                     --max-tokens 2048);;
            *) eval_args=(--task stateful_lm --tokens-per-sample 35 --batch-size 1);;
        esac
        eval_lm_test "$OUT" "$dir" "${eval_args[@]}"
        test_perplexity "$dir" > "$dir/score.tmp"
        mv "$dir/score.tmp" "$dir/score"
    done
done

compare_report "test perplexity" "Vocabulary: $(vocabulary_size "$OUT") symbols (words seen at least 3 times in train," \
    "plus fairseq's specials); $MINUTES minutes of training per run."
