#!/usr/bin/env bash
# Robustness to misspelled input on CPU: transformer (subword table) against transformer_c2s (Char2Subword source
# embeddings trained with character noise), BLEU on the clean test set and on noised copies of its source.
#
#   bash examples/char2subword/robustness.sh [OUT_DIR] [UPDATES]
#
# Data: the demo corpus (English-German gettext messages, see examples/demo/README.md) with the demo's joint BPE
# (subword-nmt, 8000 merges). Both models have the demo's CPU size (3+3 layers, d 128, FFN 512, pre-norm) and
# train for UPDATES updates (default 2000) with the demo's optimiser; transformer_c2s sees a new character noise
# on its training source every epoch (--c2s-noise-rate 0.05). The test source is noised before BPE with
# `python -m define_fairseq.tools.noise_text` at 5% and 10% of the characters (seed 1), then segmented with the
# same BPE codes; every test set is read as text (--dataset-impl raw), so transformer_c2s sees the characters of
# subwords the dictionary lacks while the baseline sees <unk>. BLEU: sacreBLEU of the detokenized-by-BPE-removal
# output against the clean German references. Results: OUT_DIR/results.md (default: c2s_robustness_output/).
# Finished steps are skipped on a rerun.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-c2s_robustness_output}
UPDATES=${2:-2000}
for tool in python subword-nmt fairseq-preprocess fairseq-train fairseq-generate sacrebleu; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found on PATH; activate .venv (make install)" >&2; exit 1; }
done
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
mkdir -p "$OUT"
RATES=(0.05 0.10)
TRAIN_NOISE=0.05

# 1. Corpus and joint BPE (as the demo).
if [[ ! -d $OUT/bpe ]]; then
    rm -rf "$OUT/corpus.tmp" "$OUT/bpe.tmp"
    python -m define_fairseq.tools.demo_corpus "$OUT/corpus.tmp" > /dev/null
    mkdir "$OUT/bpe.tmp"
    subword-nmt learn-joint-bpe-and-vocab --input "$OUT/corpus.tmp/train.en" "$OUT/corpus.tmp/train.de" -s 8000 \
        -o "$OUT/bpe.tmp/codes" --write-vocabulary "$OUT/bpe.tmp/vocab.en" "$OUT/bpe.tmp/vocab.de" 2> /dev/null
    for split in train valid test; do
        for lang in en de; do
            subword-nmt apply-bpe -c "$OUT/bpe.tmp/codes" --vocabulary "$OUT/bpe.tmp/vocab.$lang" \
                --vocabulary-threshold 10 < "$OUT/corpus.tmp/$split.$lang" > "$OUT/bpe.tmp/$split.$lang"
        done
    done
    rm -rf "$OUT/corpus"
    mv "$OUT/corpus.tmp" "$OUT/corpus"
    mv "$OUT/bpe.tmp" "$OUT/bpe"
fi
if [[ ! -d $OUT/data-bin ]]; then
    rm -rf "$OUT/data-bin.tmp"
    fairseq-preprocess --source-lang en --target-lang de --trainpref "$OUT/bpe/train" --validpref "$OUT/bpe/valid" \
        --destdir "$OUT/data-bin.tmp" --joined-dictionary --workers 2 > "$OUT/preprocess.log" 2>&1
    mv "$OUT/data-bin.tmp" "$OUT/data-bin"
fi

# 2. Test sets as text: clean, and the source noised at each rate before BPE.
make_test_set() {  # NAME RATE
    local dir=$OUT/test-$1
    [[ -d $dir ]] && return 0
    rm -rf "$dir.tmp" && mkdir "$dir.tmp"
    cp "$OUT/data-bin/dict.en.txt" "$OUT/data-bin/dict.de.txt" "$dir.tmp/"
    if [[ $2 == 0 ]]; then
        cp "$OUT/corpus/test.en" "$dir.tmp/source.en"
    else
        python -m define_fairseq.tools.noise_text --rate "$2" --seed 1 "$OUT/corpus/test.en" "$dir.tmp/source.en" \
            > "$dir.tmp/noise.log"
    fi
    subword-nmt apply-bpe -c "$OUT/bpe/codes" --vocabulary "$OUT/bpe/vocab.en" --vocabulary-threshold 10 \
        < "$dir.tmp/source.en" > "$dir.tmp/test.en-de.en"
    cp "$OUT/bpe/test.de" "$dir.tmp/test.en-de.de"
    mv "$dir.tmp" "$dir"
}
make_test_set clean 0
for rate in "${RATES[@]}"; do make_test_set "noise$rate" "$rate"; done

# 3. Train.
COMMON=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128 --decoder-embed-dim 128
        --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4
        --encoder-normalize-before --decoder-normalize-before --dropout 0.0
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 150
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 1024 --max-update "$UPDATES"
        --seed 1 --cpu --num-workers 0 --no-epoch-checkpoints --disable-validation --log-format simple
        --log-interval 100)
declare -A MODEL=(
    [transformer]="--task translation --arch transformer_iwslt_de_en --share-all-embeddings"
    [transformer_c2s]="--task translation_c2s --arch transformer_c2s_iwslt_de_en --share-decoder-input-output-embed --c2s-char-dim 128 --c2s-ffn-dim 256 --c2s-noise-rate $TRAIN_NOISE"
)
ORDER=(transformer transformer_c2s)
for name in "${ORDER[@]}"; do
    # shellcheck disable=SC2206
    model=(${MODEL[$name]})
    dir=$OUT/$name
    if [[ ! -f $dir/train_seconds.txt ]]; then  # written last: an interrupted training starts over
        rm -rf "$dir" && mkdir -p "$dir"
        echo "==> training $name for $UPDATES updates"
        start=$(date +%s)
        fairseq-train "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" "${COMMON[@]}" --save-dir "$dir" \
            > "$dir/train.log" 2>&1 || { tail -20 "$dir/train.log" >&2; exit 1; }
        echo $(( $(date +%s) - start )) > "$dir/train_seconds.txt"
    fi
    python -m define_fairseq.tools.params "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" "${COMMON[@]}" \
        > "$dir/params.txt" 2> /dev/null
done

# 4. Translate each test set with each model and score it.
bleu() {  # MODEL TEST -> prints the BLEU score
    local name=$1 test=$2 dir=$OUT/$1 task=translation trust=()
    local result=$dir/$test.bleu
    if [[ ! -f $result ]]; then
        [[ $name == transformer_c2s ]] && task=translation_c2s
        # fairseq's own transformer keeps an argparse.Namespace in its checkpoint (torch >= 2.6 needs this to load it)
        [[ $name == transformer ]] && trust=(env TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1)
        "${trust[@]}" fairseq-generate "$OUT/test-$test" --user-dir define_fairseq --task "$task" --dataset-impl raw \
            --path "$dir/checkpoint_last.pt" --gen-subset test --beam 5 --batch-size 128 \
            --required-batch-size-multiple 1 --remove-bpe --cpu > "$dir/$test.gen.tmp" 2> "$dir/$test.gen.log" \
            || { tail -20 "$dir/$test.gen.log" >&2; exit 1; }
        grep '^H-' "$dir/$test.gen.tmp" | sed 's/^H-//' | sort -n -s -k1,1 | cut -f3 > "$dir/$test.hyp.tmp"
        [[ $(wc -l < "$dir/$test.hyp.tmp") == $(wc -l < "$OUT/corpus/test.de") ]] \
            || { echo "error: $name on $test: not one hypothesis per test sentence" >&2; exit 1; }
        sacrebleu "$OUT/corpus/test.de" -i "$dir/$test.hyp.tmp" -m bleu -b -w 2 > "$result.tmp"
        mv "$dir/$test.gen.tmp" "$dir/$test.gen.txt"
        mv "$dir/$test.hyp.tmp" "$dir/$test.hyp"
        mv "$result.tmp" "$result"
    fi
    cat "$result"
}

{
    echo "| model | parameters | of which input/output | training time | BLEU clean | BLEU 5% noise | BLEU 10% noise | loss at 5% | loss at 10% |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for name in "${ORDER[@]}"; do
        dir=$OUT/$name
        clean=$(bleu "$name" clean)
        n5=$(bleu "$name" noise0.05)
        n10=$(bleu "$name" noise0.10)
        total=$(awk '/^total/ {print $2}' "$dir/params.txt")
        io=$(awk '/^input\/output/ {print $2}' "$dir/params.txt")
        loss5=$(python -c "print(f'{$clean - $n5:.2f}')")
        loss10=$(python -c "print(f'{$clean - $n10:.2f}')")
        echo "| \`$name\` | $total | $io | $(cat "$dir/train_seconds.txt") s | $clean | $n5 | $n10 | $loss5 | $loss10 |"
    done
    echo
    for rate in "${RATES[@]}"; do
        echo "noise $rate on the test source: $(grep -i 'rate' "$OUT/test-noise$rate/noise.log" | head -1)"
    done
} > "$OUT/results.md"
cat "$OUT/results.md"
