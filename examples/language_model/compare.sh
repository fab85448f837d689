#!/usr/bin/env bash
# Real-text comparison on CPU: DeFINE against its baseline, each pair trained for the same wall time.
#
#   bash examples/language_model/compare.sh [OUT_DIR] [MINUTES_PER_MODEL]
#
# Text: the English side of the demo corpus (English gettext messages installed on this machine, see
# examples/demo/README.md), word level, split as the demo splits it; words seen fewer than 3 times in train
# become <unk>. Four small models, each trained for MINUTES_PER_MODEL (default 4) of wall time with
# --stop-time-hours, then scored on the test split with fairseq-eval-lm:
#   transformer_lm         vs transformer_lm_define    (language_modeling, 64-token blocks, context window 32)
#   lstm (adaptive only)   vs lstm (adaptive + DeFINE) (stateful_lm: state carried, BPTT 35, batch 20)
# The results land in OUT_DIR/results.md (default: lm_compare_output/). Steps whose output exists are skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-lm_compare_output}
MINUTES=${2:-4}
for tool in python fairseq-preprocess fairseq-train fairseq-eval-lm; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found on PATH; activate .venv (make install)" >&2; exit 1; }
done
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
HOURS=$(python -c "print($MINUTES / 60)")
mkdir -p "$OUT"

# 1. Text: the English side of the demo corpus.
if [[ ! -d $OUT/text ]]; then
    rm -rf "$OUT/corpus.tmp" "$OUT/text.tmp"
    python -m define_fairseq.tools.demo_corpus "$OUT/corpus.tmp"
    mkdir "$OUT/text.tmp"
    for split in train valid test; do cp "$OUT/corpus.tmp/$split.en" "$OUT/text.tmp/$split.txt"; done
    rm -rf "$OUT/corpus.tmp"
    mv "$OUT/text.tmp" "$OUT/text"
fi

# 2. Binarize.
if [[ ! -d $OUT/data-bin ]]; then
    rm -rf "$OUT/data-bin.tmp"
    fairseq-preprocess --only-source --thresholdsrc 3 --trainpref "$OUT/text/train.txt" \
        --validpref "$OUT/text/valid.txt" --testpref "$OUT/text/test.txt" --destdir "$OUT/data-bin.tmp" \
        --workers 2 > "$OUT/preprocess.log"
    mv "$OUT/data-bin.tmp" "$OUT/data-bin"
fi
VOCAB=$(( $(wc -l < "$OUT/data-bin/dict.txt") + 4 ))

COMMON=(--optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.001 --clip-norm 0.25 --dropout 0.1 --seed 1
        --cpu --num-workers 0 --no-progress-bar --log-format simple --log-interval 50
        --stop-time-hours "$HOURS" --max-epoch 1000 --disable-validation --no-epoch-checkpoints
        --ddp-backend legacy_ddp)
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
ORDER=(transformer_lm transformer_lm_define lstm_adaptive lstm_adaptive_define)

for name in "${ORDER[@]}"; do
    case $name in transformer*) family=("${TRANSFORMER[@]}");; *) family=("${LSTM[@]}");; esac
    # shellcheck disable=SC2206
    model=(${MODEL[$name]})
    dir=$OUT/$name
    if [[ ! -f $dir/checkpoint_last.pt ]]; then
        mkdir -p "$dir"
        echo "==> training $name for $MINUTES min"
        fairseq-train "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" "${family[@]}" "${COMMON[@]}" \
            --save-dir "$dir" > "$dir/train.log" 2>&1 || { tail -20 "$dir/train.log" >&2; exit 1; }
    fi
    python -m define_fairseq.tools.params "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" \
        "${family[@]}" --optimizer adam --lr 0.001 --cpu --ddp-backend legacy_ddp > "$dir/params.txt"
    case $name in
        transformer*) eval_args=(--task language_modeling --tokens-per-sample 64 --context-window 32
                                 --max-tokens 2048);;
        *) eval_args=(--task stateful_lm --tokens-per-sample 35 --batch-size 1);;
    esac
    fairseq-eval-lm "$OUT/data-bin" --user-dir define_fairseq --path "$dir/checkpoint_last.pt" --cpu \
        --gen-subset test "${eval_args[@]}" > "$dir/eval.log" 2>&1 || { tail -20 "$dir/eval.log" >&2; exit 1; }
done

{
    echo "| model | parameters (total) | of which input/output | DeFINE | updates in $MINUTES min | test perplexity |"
    echo "|---|---|---|---|---|---|"
    for name in "${ORDER[@]}"; do
        dir=$OUT/$name
        total=$(awk '/^total/ {print $2}' "$dir/params.txt")
        io=$(awk '/^input\/output/ {print $2}' "$dir/params.txt")
        define=$(awk '/^DeFINE/ {print $2}' "$dir/params.txt")
        updates=$(grep -o 'num_updates": "[0-9]*\|num_updates [0-9]*\|num_updates=[0-9]*' "$dir/train.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
        ppl=$(grep -o 'Perplexity: [0-9.]*' "$dir/eval.log" | tail -1 | awk '{print $2}')
        echo "| \`$name\` | $total | $io | $define | $updates | $ppl |"
    done
    echo
    echo "Vocabulary: $VOCAB symbols (words seen at least 3 times in train, plus fairseq's specials)."
} > "$OUT/results.md"
cat "$OUT/results.md"
