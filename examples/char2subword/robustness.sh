#!/usr/bin/env bash
# Robustness to misspelled input on CPU: transformer (subword table) against transformer_c2s (Char2Subword source
# embeddings trained with character noise), BLEU on the clean test set and on noised copies of its source, for
# one or more seeds. See examples/char2subword/README.md.
set -euo pipefail
usage() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT] [-s SEEDS] [-u UPDATES] [-U MORE_UPDATES] [-c CORPUS_DIR]

Data: the demo corpus (English-German gettext messages, examples/demo/README.md) or CORPUS_DIR's
{train,valid,test}.{en,de}, with the demo's joint BPE (subword-nmt, 8000 merges). The models have the demo's CPU
size (3+3 layers, d 128, FFN 512, pre-norm). For each seed of SEEDS (a count N: seeds 1..N, default 1; or a range
A-B), the paper's route in two stages:
  1. transformer trains for UPDATES updates (default 2000) with the demo's optimiser.
  2. From that checkpoint, MORE_UPDATES more updates (default 2000; Adam restarted, lr 1e-3, 100 warm-up
     updates) for each of:
     - transformer_continued: the same model on the same clean data (the baseline at equal updates);
     - transformer_c2s: its encoder table distilled into a Char2Subword module (distill_c2s, 40 epochs),
       swapped in (c2s_checkpoint), then trained with a new character noise on the training source every
       epoch (--c2s-noise-rate 0.05).
The seed is every training's and the distillation's --seed; the test sets are the same for every seed.
Test sets, all read as text (--dataset-impl raw): the clean test set, and its English source with 5% and 10% of
the characters edited (noise_text, seed 1) in two ways that make the same edits:
  - before BPE ("noise"): the BPE segments each misspelled word afresh, into pieces the dictionary has;
  - after BPE ("segmented", noise_text --segmented): the segmentation is kept, as in the training noise, and an
    edited piece is usually missing from the dictionary: <unk> for the baseline, its letters for transformer_c2s.
BLEU: sacreBLEU of the output with the BPE removed against the clean German references.
Results: OUT/results.md (default OUT: c2s_robustness_output): a table per seed, then each score's mean and
standard deviation over the seeds; OUT/results.json: every score as data (docs/results.md), merged with what it
holds. Seed S's runs are in OUT/seedS/. Finished steps are skipped on a rerun, so
seeds can be added later (-s 3-4).
EOF
}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

OUT=c2s_robustness_output SEEDS=1 UPDATES=2000 MORE_UPDATES=2000 CORPUS=""
COMMAND="bash $0${*:+ $(printf '%q ' "$@")}"  # kept with every score in OUT/results.json
while getopts "o:s:u:U:c:h" opt; do
    case $opt in
        o) OUT=$OPTARG ;; s) SEEDS=$OPTARG ;; u) UPDATES=$OPTARG ;; U) MORE_UPDATES=$OPTARG ;; c) CORPUS=$OPTARG ;;
        h) usage; exit 0 ;; *) usage >&2; exit 2 ;;
    esac
done
(( OPTIND > $# )) || { echo "error: unexpected argument '${!OPTIND}' (the options are flags: -h)" >&2; exit 2; }
parse_seeds "$SEEDS"
for value in "$UPDATES" "$MORE_UPDATES"; do
    [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "error: -u/-U $value: a number of updates, at least 1" >&2; exit 2; }
done
require_tools python subword-nmt fairseq-preprocess fairseq-train fairseq-generate sacrebleu
RATES=(0.05 0.10)
TRAIN_NOISE=0.05
C2S_SIZE=(--c2s-char-dim 256 --c2s-ffn-dim 1024)

# 1. Corpus, joint BPE, binarised data (examples/lib.sh).
mkdir -p "$OUT"
demo_corpus "$OUT" "$CORPUS"
joint_bpe "$OUT"
binarize_translation "$OUT"

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
        subword-nmt apply-bpe -c "$OUT/bpe/codes" --vocabulary "$OUT/bpe/vocab.en" \
            --vocabulary-threshold "$DEMO_BPE_THRESHOLD" < "$dir.tmp/source.en" > "$dir.tmp/test.en-de.en"
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
NAMES=(transformer transformer_continued transformer_c2s)

# 3. Train.
SIZE=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128 --decoder-embed-dim 128
      --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4
      --encoder-normalize-before --decoder-normalize-before --dropout 0.0)
TRAINING=(--optimizer adam --adam-betas '(0.9, 0.98)' --lr-scheduler inverse_sqrt
          --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 1024
          --cpu --num-workers 0 --no-epoch-checkpoints --disable-validation --log-format simple --log-interval 100)
FIRST=(--lr 3e-3 --warmup-updates 150 --max-update "$UPDATES")
SECOND=(--lr 1e-3 --warmup-updates 100 --max-update "$MORE_UPDATES")
BASELINE=(--task translation --arch transformer_iwslt_de_en --share-all-embeddings)
C2S=(--task translation_c2s --arch transformer_c2s_iwslt_de_en --share-decoder-input-output-embed "${C2S_SIZE[@]}")
# fairseq's own transformer keeps an argparse.Namespace in its checkpoint (torch >= 2.6 needs this to load it)
TRUST=(env TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1)

model_args() {  # NAME -> MODEL_ARGS: the task and arch of NAME
    MODEL_ARGS=("${BASELINE[@]}")
    [[ $1 == transformer_c2s ]] && MODEL_ARGS=("${C2S[@]}")
    return 0
}

train() {  # DIR SEED FLAGS... : fairseq-train into DIR unless it finished before
    local dir=$1 seed=$2 start
    shift 2
    [[ -f $dir/train_seconds.txt ]] && return 0  # written last: an interrupted training starts over
    rm -rf "$dir" && mkdir -p "$dir"
    echo "==> training $dir"
    start=$(date +%s)
    "${TRUST[@]}" fairseq-train "$OUT/data-bin" --user-dir define_fairseq "$@" "${SIZE[@]}" "${TRAINING[@]}" \
        --seed "$seed" --save-dir "$dir" > "$dir/train.log" 2>&1 || { tail -20 "$dir/train.log" >&2; exit 1; }
    echo $(( $(date +%s) - start )) > "$dir/train_seconds.txt"
}

distil() {  # SEED_DIR SEED: the first model's source table distilled into Char2Subword and swapped in
    local dir=$1/distill first=$1/transformer/checkpoint_last.pt start
    [[ -f $dir/start.pt ]] && return 0
    rm -rf "$dir" && mkdir -p "$dir"
    echo "==> distilling the source table of $1/transformer into Char2Subword"
    start=$(date +%s)
    "${TRUST[@]}" python -m define_fairseq.tools.distill_c2s --checkpoint "$first" --side encoder \
        --output "$dir/c2s_encoder.pt" "${C2S_SIZE[@]}" --neighbours 10 --noise-rate 0.5 --epochs 40 \
        --lr 2e-3 --seed "$2" > "$dir/distill.log" 2>&1 || { tail -20 "$dir/distill.log" >&2; exit 1; }
    "${TRUST[@]}" python -m define_fairseq.tools.c2s_checkpoint --checkpoint "$first" \
        --c2s "$dir/c2s_encoder.pt" --output "$dir/start.pt.tmp" >> "$dir/distill.log" 2>&1 \
        || { tail -20 "$dir/distill.log" >&2; exit 1; }
    echo $(( $(date +%s) - start )) > "$dir/seconds.txt"
    mv "$dir/start.pt.tmp" "$dir/start.pt"
}

# 4. Translate each test set with a model and score it.
bleu() {  # RUN_DIR NAME TEST -> RUN_DIR/TEST.bleu, the BLEU score
    local dir=$1 name=$2 test=$3 task=translation
    local result=$dir/$test.bleu
    [[ -f $result ]] && return 0
    [[ $name == transformer_c2s ]] && task=translation_c2s
    "${TRUST[@]}" fairseq-generate "$OUT/test-$test" --user-dir define_fairseq --task "$task" --dataset-impl raw \
        --path "$dir/checkpoint_last.pt" --gen-subset test --beam 5 --batch-size 128 \
        --required-batch-size-multiple 1 --remove-bpe --cpu > "$dir/$test.gen.tmp" 2> "$dir/$test.gen.log" \
        || { tail -20 "$dir/$test.gen.log" >&2; exit 1; }
    grep '^H-' "$dir/$test.gen.tmp" | sed 's/^H-//' | sort -n -s -k1,1 | cut -f3 > "$dir/$test.hyp.tmp"
    [[ $(wc -l < "$dir/$test.hyp.tmp") == $(wc -l < "$OUT/corpus/test.de") ]] \
        || { echo "error: $dir on $test: not one hypothesis per test sentence" >&2; exit 1; }
    sacrebleu "$OUT/corpus/test.de" -i "$dir/$test.hyp.tmp" -m bleu -b -w 2 > "$result.tmp"
    mv "$dir/$test.gen.tmp" "$dir/$test.gen.txt"
    mv "$dir/$test.hyp.tmp" "$dir/$test.hyp"
    mv "$result.tmp" "$result"
}

for (( seed = FIRST_SEED; seed <= LAST_SEED; seed++ )); do
    run=$OUT/seed$seed
    train "$run/transformer" "$seed" "${BASELINE[@]}" "${FIRST[@]}"
    train "$run/transformer_continued" "$seed" "${BASELINE[@]}" "${SECOND[@]}" \
        --finetune-from-model "$run/transformer/checkpoint_last.pt"
    distil "$run" "$seed"
    train "$run/transformer_c2s" "$seed" "${C2S[@]}" "${SECOND[@]}" --c2s-noise-rate "$TRAIN_NOISE" \
        --finetune-from-model "$run/distill/start.pt"
    for name in "${NAMES[@]}"; do
        for test in "${TESTS[@]}"; do bleu "$run/$name" "$name" "$test"; done
    done
done
for name in transformer transformer_c2s; do
    [[ -s $OUT/params-$name.txt ]] && continue
    model_args "$name"
    python -m define_fairseq.tools.params "$OUT/data-bin" --user-dir define_fairseq "${MODEL_ARGS[@]}" "${SIZE[@]}" \
        "${TRAINING[@]}" > "$OUT/params-$name.txt.tmp" 2> /dev/null
    mv "$OUT/params-$name.txt.tmp" "$OUT/params-$name.txt"
done

# 5. The tables: every seed of OUT that has all its scores (those of earlier runs included), then the means.
unknown_share() {  # TEST -> the share of source tokens that dict.en.txt lacks
    python - "$OUT/data-bin/dict.en.txt" "$OUT/test-$1/test.en-de.en" <<'PY'
import sys
vocab = {line.split()[0] for line in open(sys.argv[1], encoding="utf-8")}
tokens = [t for line in open(sys.argv[2], encoding="utf-8") for t in line.split()]
print(f"{100 * sum(t not in vocab for t in tokens) / len(tokens):.1f}%")
PY
}
{
    python - "$OUT" "$UPDATES" "$MORE_UPDATES" "${NAMES[*]}" "${TESTS[*]}" "${COMMAND% }" <<'PY'
import statistics, sys
from pathlib import Path
from scripts.compare_runs import machine, revision, save_data
from scripts.render_results import locked

out, updates, more, names, tests = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
seeds = sorted(int(d.name[4:]) for d in out.glob("seed*") if d.name[4:].isdigit()
               and all((d / n / f"{t}.bleu").is_file() for n in names for t in tests))
header = ("| model | updates | parameters | of which input/output | training time | BLEU clean | noise 5% | noise 10% "
          "| segmented 5% | segmented 10% |\n|---|---|---|---|---|---|---|---|---|---|")

def params(name):
    lines = dict(line.split()[:2] for line in (out / f"params-{name.replace('_continued', '')}.txt").open() if line.strip())
    return lines["total"], lines["input/output"]

def seconds(seed, name):  # the training time of each stage: first model, [distillation,] second stage
    parts = ["transformer"] + {"transformer": [], "transformer_continued": [name]}.get(name, ["distill", name])
    return [float((out / f"seed{seed}" / part / ("seconds.txt" if part == "distill" else "train_seconds.txt"))
                  .read_text()) for part in parts]

def time(parts, suffix=""):
    text = [f"{x:.0f}" + (" (distil)" if i == 1 and len(parts) == 3 else "") for i, x in enumerate(parts)]
    return " + ".join(text) + " s" + suffix

def cells(name, score, change, time):
    total, io = params(name)
    steps = updates if name == "transformer" else f"{updates} + {more}"
    return f"| `{name}` | {steps} | {total} | {io} | {time} | " + " | ".join(
        score(t) if t == "clean" else f"{score(t)} ({change(t):+.2f})" for t in tests) + " |"

bleu = {(s, n, t): float((out / f"seed{s}" / n / f"{t}.bleu").read_text()) for s in seeds for n in names for t in tests}
data_path = out / "results.json"  # every scored seed, as data, merged with what the file holds (other seeds)
with locked(data_path):
    where = {"command": sys.argv[6], "revision": revision(), "machine": machine("cpu, fp32")}
    new = [{"group": "", "model": n, "point": t, "seed": s, "value": bleu[s, n, t],
            "parameters": {"total": float(params(n)[0].rstrip("M")), "input/output": float(params(n)[1].rstrip("M"))},
            "updates": int(updates) + (0 if n == "transformer" else int(more)), "seconds": sum(seconds(s, n)), **where}
           for s in seeds for n in names for t in tests]
    save_data(data_path, "BLEU", "higher", new, points=[{"key": t, "label": f"BLEU, {t}"} for t in tests])
for s in seeds:
    print(f"Seed {s}:\n\n{header}")
    for n in names:
        print(cells(n, lambda t: f"{bleu[s, n, t]:.2f}", lambda t: bleu[s, n, t] - bleu[s, n, "clean"],
                    time(seconds(s, n))))
    print()
if len(seeds) > 1:
    print(f"Mean ± standard deviation over seeds {', '.join(map(str, seeds))}; in brackets, the mean change from clean:\n")
    print(header)
    for n in names:
        values = lambda t: [bleu[s, n, t] for s in seeds]
        mean_time = time([statistics.fmean(x) for x in zip(*(seconds(s, n) for s in seeds))], " (mean)")
        print(cells(n, lambda t: f"{statistics.fmean(values(t)):.2f} ± {statistics.stdev(values(t)):.2f}",
                    lambda t: statistics.fmean(a - b for a, b in zip(values(t), values("clean"))), mean_time))
    print()
PY
    for test in "${TESTS[@]:1}"; do
        echo "$test: $(grep -i 'rate' "$OUT/test-$test/noise.log" | head -1); source tokens not in the dictionary: $(unknown_share "$test")"
    done
    echo "clean: source tokens not in the dictionary: $(unknown_share clean)"
    echo
    for log in $(find "$OUT" -path "$OUT/seed*/distill/distill.log" | sort -V); do
        seed=${log#"$OUT"/seed} seed=${seed%%/*}
        echo "seed $seed, distillation (clean entries, after $(grep -c '^epoch' "$log") epochs): $(grep '^after' "$log")"
    done
} > "$OUT/results.md.tmp$$"
mv "$OUT/results.md.tmp$$" "$OUT/results.md"
cat "$OUT/results.md"
