#!/usr/bin/env bash
# Robustness to misspelled input on CPU: transformer (subword table) against transformer_c2s (Char2Subword source
# embeddings trained with character noise), BLEU on the clean test set and on noised copies of its source.
#
#   bash examples/char2subword/robustness.sh [OUT_DIR] [UPDATES] [MORE_UPDATES]
#
# Data: the demo corpus (English-German gettext messages, see examples/demo/README.md) with the demo's joint BPE
# (subword-nmt, 8000 merges). The models have the demo's CPU size (3+3 layers, d 128, FFN 512, pre-norm).
# The paper's route, in two stages:
#   1. `transformer` trains for UPDATES updates (default 2000) with the demo's optimiser.
#   2. From that checkpoint, MORE_UPDATES more updates (default 2000; Adam restarted, lr 1e-3, 100 warm-up
#      updates) for each of:
#      - `transformer_continued`: the same model on the same clean data (the baseline at equal updates);
#      - `transformer_c2s`: its encoder table distilled into a Char2Subword module (distill_c2s, 40 epochs),
#        swapped in (c2s_checkpoint), then trained with a new character noise on the training source every
#        epoch (--c2s-noise-rate 0.05).
# Test sets, all read as text (--dataset-impl raw): the clean test set, and its English source with 5% and 10%
# of the characters edited (noise_text, seed 1) in two ways that make the same edits:
#   - before BPE ("noise"): the BPE segments each misspelled word afresh, into pieces the dictionary has;
#   - after BPE ("segmented", noise_text --segmented): the segmentation is kept, as in the training noise, and
#     an edited piece is usually missing from the dictionary: `<unk>` for the baseline, its letters for
#     transformer_c2s.
# BLEU: sacreBLEU of the output with the BPE removed against the clean German references.
# Results: OUT_DIR/results.md (default: c2s_robustness_output/). Finished steps are skipped on a rerun.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-c2s_robustness_output}
UPDATES=${2:-2000}
MORE_UPDATES=${3:-2000}
for tool in python subword-nmt fairseq-preprocess fairseq-train fairseq-generate sacrebleu; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found on PATH; activate .venv (make install)" >&2; exit 1; }
done
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
mkdir -p "$OUT"
RATES=(0.05 0.10)
TRAIN_NOISE=0.05
C2S_SIZE=(--c2s-char-dim 256 --c2s-ffn-dim 1024)

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

# 2. Test sets as text: clean, and the source noised at each rate before BPE and after it.
make_test_set() {  # NAME RATE WHEN(before|after)
    local dir=$OUT/test-$1
    [[ -d $dir ]] && return 0
    rm -rf "$dir.tmp" && mkdir "$dir.tmp"
    cp "$OUT/data-bin/dict.en.txt" "$OUT/data-bin/dict.de.txt" "$dir.tmp/"
    if [[ $2 == 0 ]]; then
        cp "$OUT/bpe/test.en" "$dir.tmp/test.en-de.en"
    elif [[ $3 == before ]]; then
        python -m define_fairseq.tools.noise_text --rate "$2" --seed 1 "$OUT/corpus/test.en" "$dir.tmp/source.en" \
            > "$dir.tmp/noise.log"
        subword-nmt apply-bpe -c "$OUT/bpe/codes" --vocabulary "$OUT/bpe/vocab.en" --vocabulary-threshold 10 \
            < "$dir.tmp/source.en" > "$dir.tmp/test.en-de.en"
    else
        python -m define_fairseq.tools.noise_text --segmented --rate "$2" --seed 1 "$OUT/bpe/test.en" \
            "$dir.tmp/test.en-de.en" > "$dir.tmp/noise.log"
    fi
    cp "$OUT/bpe/test.de" "$dir.tmp/test.en-de.de"
    mv "$dir.tmp" "$dir"
}
make_test_set clean 0
for rate in "${RATES[@]}"; do
    make_test_set "noise$rate" "$rate" before
    make_test_set "segmented$rate" "$rate" after
done
TESTS=(clean noise0.05 noise0.10 segmented0.05 segmented0.10)

# 3. Train.
SIZE=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128 --decoder-embed-dim 128
      --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4
      --encoder-normalize-before --decoder-normalize-before --dropout 0.0)
TRAINING=(--optimizer adam --adam-betas '(0.9, 0.98)' --lr-scheduler inverse_sqrt
          --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 1024
          --seed 1 --cpu --num-workers 0 --no-epoch-checkpoints --disable-validation --log-format simple
          --log-interval 100)
FIRST=(--lr 3e-3 --warmup-updates 150 --max-update "$UPDATES")
SECOND=(--lr 1e-3 --warmup-updates 100 --max-update "$MORE_UPDATES")
BASELINE=(--task translation --arch transformer_iwslt_de_en --share-all-embeddings)
C2S=(--task translation_c2s --arch transformer_c2s_iwslt_de_en --share-decoder-input-output-embed "${C2S_SIZE[@]}")
# fairseq's own transformer keeps an argparse.Namespace in its checkpoint (torch >= 2.6 needs this to load it)
TRUST=(env TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1)

train() {  # NAME FLAGS... : fairseq-train into OUT/NAME unless it finished before
    local name=$1 dir=$OUT/$1
    shift
    [[ -f $dir/train_seconds.txt ]] && return 0  # written last: an interrupted training starts over
    rm -rf "$dir" && mkdir -p "$dir"
    echo "==> training $name"
    local start
    start=$(date +%s)
    "${TRUST[@]}" fairseq-train "$OUT/data-bin" --user-dir define_fairseq "$@" "${SIZE[@]}" "${TRAINING[@]}" \
        --save-dir "$dir" > "$dir/train.log" 2>&1 || { tail -20 "$dir/train.log" >&2; exit 1; }
    echo $(( $(date +%s) - start )) > "$dir/train_seconds.txt"
}

FIRST_CKPT=$OUT/transformer/checkpoint_last.pt
train transformer "${BASELINE[@]}" "${FIRST[@]}"
train transformer_continued "${BASELINE[@]}" "${SECOND[@]}" --finetune-from-model "$FIRST_CKPT"
if [[ ! -f $OUT/distill/start.pt ]]; then
    rm -rf "$OUT/distill" && mkdir -p "$OUT/distill"
    echo "==> distilling the source table of transformer into Char2Subword"
    start=$(date +%s)
    "${TRUST[@]}" python -m define_fairseq.tools.distill_c2s --checkpoint "$FIRST_CKPT" --side encoder \
        --output "$OUT/distill/c2s_encoder.pt" "${C2S_SIZE[@]}" --neighbours 10 --noise-rate 0.5 --epochs 40 \
        --lr 2e-3 > "$OUT/distill/distill.log" 2>&1 || { tail -20 "$OUT/distill/distill.log" >&2; exit 1; }
    "${TRUST[@]}" python -m define_fairseq.tools.c2s_checkpoint --checkpoint "$FIRST_CKPT" \
        --c2s "$OUT/distill/c2s_encoder.pt" --output "$OUT/distill/start.pt" >> "$OUT/distill/distill.log" 2>&1 \
        || { tail -20 "$OUT/distill/distill.log" >&2; exit 1; }
    echo $(( $(date +%s) - start )) > "$OUT/distill/seconds.txt"
fi
train transformer_c2s "${C2S[@]}" "${SECOND[@]}" --c2s-noise-rate "$TRAIN_NOISE" \
    --finetune-from-model "$OUT/distill/start.pt"
for name in transformer transformer_c2s; do
    model=("${BASELINE[@]}")
    [[ $name == transformer_c2s ]] && model=("${C2S[@]}")
    python -m define_fairseq.tools.params "$OUT/data-bin" --user-dir define_fairseq "${model[@]}" "${SIZE[@]}" \
        "${TRAINING[@]}" > "$OUT/$name/params.txt" 2> /dev/null
done

# 4. Translate each test set with each model and score it.
bleu() {  # MODEL TEST -> prints the BLEU score
    local name=$1 test=$2 dir=$OUT/$1 task=translation
    local result=$dir/$test.bleu
    if [[ ! -f $result ]]; then
        [[ $name == transformer_c2s ]] && task=translation_c2s
        "${TRUST[@]}" fairseq-generate "$OUT/test-$test" --user-dir define_fairseq --task "$task" --dataset-impl raw \
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

unknown_share() {  # TEST -> the share of source tokens that dict.en.txt lacks
    python - "$OUT/data-bin/dict.en.txt" "$OUT/test-$1/test.en-de.en" <<'PY'
import sys
vocab = {line.split()[0] for line in open(sys.argv[1], encoding="utf-8")}
tokens = [t for line in open(sys.argv[2], encoding="utf-8") for t in line.split()]
print(f"{100 * sum(t not in vocab for t in tokens) / len(tokens):.1f}%")
PY
}

{
    echo "| model | updates | parameters | of which input/output | training time | BLEU clean | noise 5% | noise 10% | segmented 5% | segmented 10% |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for name in transformer transformer_continued transformer_c2s; do
        dir=$OUT/$name
        params=$name
        [[ $name == transformer_continued ]] && params=transformer
        total=$(awk '/^total/ {print $2}' "$OUT/$params/params.txt")
        io=$(awk '/^input\/output/ {print $2}' "$OUT/$params/params.txt")
        updates=$UPDATES
        seconds=$(cat "$dir/train_seconds.txt")
        if [[ $name != transformer ]]; then
            updates="$UPDATES + $MORE_UPDATES"
            seconds="$(cat "$OUT/transformer/train_seconds.txt") + $seconds"
            [[ $name == transformer_c2s ]] && seconds="$seconds + $(cat "$OUT/distill/seconds.txt")"
        fi
        row="| \`$name\` | $updates | $total | $io | $seconds s"
        clean=$(bleu "$name" clean)
        for test in "${TESTS[@]}"; do
            score=$(bleu "$name" "$test")
            if [[ $test == clean ]]; then
                row="$row | $score"
            else
                row="$row | $score ($(python -c "print(f'{$score - $clean:+.2f}')"))"
            fi
        done
        echo "$row |"
    done
    echo
    for test in "${TESTS[@]:1}"; do
        echo "$test: $(grep -i 'rate' "$OUT/test-$test/noise.log" | head -1); source tokens not in the dictionary: $(unknown_share "$test")"
    done
    echo "clean: source tokens not in the dictionary: $(unknown_share clean)"
    echo
    echo "distillation (clean entries, after $(grep -c '^epoch' "$OUT/distill/distill.log") epochs): $(grep '^after' "$OUT/distill/distill.log")"
} > "$OUT/results.md"
cat "$OUT/results.md"
