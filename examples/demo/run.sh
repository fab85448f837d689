#!/usr/bin/env bash
# The define-fairseq demo, run by `make demo` (which puts .venv/bin first on PATH): build an English->German
# corpus from the German gettext catalogs installed on this machine, learn a joint BPE, train a small
# transformer_define on the CPU, translate the test split and score it with sacreBLEU, then print the
# model's parameter breakdown. See examples/demo/README.md.
#
# Everything goes under demo_output/. Each step is skipped when its final output exists; each step writes to a
# temporary name and renames it into place when done, so an interrupted run never leaves a half-written
# output that a rerun would trust (training resumes from its last complete checkpoint). Delete demo_output/
# (or one step's output and everything after it) to redo it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh
require_tools python subword-nmt fairseq-preprocess fairseq-train fairseq-generate sacrebleu

# One process, one OpenMP/MKL thread per core (2 on the reference machine; at most 8, beyond which this small
# model gains nothing), no extra data-loading workers. On a busy machine OMP_NUM_THREADS=1 is faster.
threads=$(nproc 2>/dev/null || echo 2); (( threads > 8 )) && threads=8
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$OMP_NUM_THREADS}"

OUT=demo_output
mkdir -p "$OUT"

# The model and training arguments, shared by fairseq-train and the parameter breakdown: the demo's Transformer
# (examples/lib.sh: d_model 128, 3+3 pre-norm layers; about 11 minutes of training on two CPU cores, README.md)
# with DeFINE n=96, k=256 on the shared V x 96 table (fewer parameters than the baseline's V x 128 table, level
# with it in BLEU: examples/translation/README.md). --max-update fixes the amount of training.
TRAIN_ARGS=("$OUT/data-bin" --user-dir define_fairseq --arch transformer_define_iwslt_de_en --define-n 96 --define-k 256
            "${DEMO_TRANSFORMER[@]}" --cpu --max-update 2000 --seed 1)

step_start() { STEP_T0=$SECONDS; echo; echo "==> $*"; }
step_done() { echo "    done in $((SECONDS - STEP_T0)) s"; }
skip() { echo; echo "==> $1: $2 exists, reusing it"; }

# 1-3. Corpus, joint BPE, binarised data (examples/lib.sh).
if [[ -d $OUT/corpus ]]; then
    skip "1/6 corpus" "$OUT/corpus"
else
    step_start "1/6 corpus: English-German pairs from the German gettext catalogs -> $OUT/corpus"
    demo_corpus "$OUT"
    step_done
fi
if [[ -d $OUT/bpe ]]; then
    skip "2/6 BPE" "$OUT/bpe"
else
    step_start "2/6 joint BPE, $DEMO_BPE_MERGES merges (subword-nmt) -> $OUT/bpe"
    joint_bpe "$OUT"
    step_done
fi
if [[ -d $OUT/data-bin ]]; then
    skip "3/6 fairseq-preprocess" "$OUT/data-bin"
else
    step_start "3/6 fairseq-preprocess --joined-dictionary -> $OUT/data-bin"
    binarize_translation "$OUT"
    grep -E "Dictionary|sents" "$OUT/preprocess.log" | sed 's/^.*| //; s/^INFO:[^:]*://' | awk '!seen[$0]++' | sed 's/^/    /'
    step_done
fi

# 4. Train. Checkpoints go to checkpoints.partial (fairseq saves each one atomically and resumes from
# checkpoint_last.pt there), renamed to checkpoints when --max-update is reached. fairseq's whole log goes to the
# log file; the terminal gets one line per 100 updates and each validation (progress_lines).
progress_lines() {
    sed -unE 's/.*\| train_inner \|.*"loss": "([0-9.]+)".*"num_updates": "([0-9]+)".*"wall": "([0-9]+)".*/    update \2: training loss \1 (base 2, label-smoothed), \3 s/p
              s/.*\| valid \|.*"valid_loss": "([0-9.]+)".*"valid_num_updates": "([0-9]+)".*/    update \2: validation loss \1/p
              s/.*(Traceback|Error).*/    &/p'
}
if [[ -d $OUT/checkpoints ]]; then
    skip "4/6 training" "$OUT/checkpoints"
else
    step_start "4/6 fairseq-train transformer_define (CPU, $OMP_NUM_THREADS threads, 2,000 updates) -> $OUT/checkpoints"
    echo "    fairseq's log: $OUT/train.log.partial"
    PYTHONUNBUFFERED=1 fairseq-train "${TRAIN_ARGS[@]}" --save-dir "$OUT/checkpoints.partial" \
        --no-epoch-checkpoints --log-format json --log-interval 100 2>&1 | tee -a "$OUT/train.log.partial" \
        | progress_lines
    grep -q "done training" "$OUT/train.log.partial" \
        || { tail -n 20 "$OUT/train.log.partial" >&2; echo "error: training did not finish; the log: $OUT/train.log.partial" >&2; exit 1; }
    mv "$OUT/train.log.partial" "$OUT/checkpoints.partial/train.log"
    mv "$OUT/checkpoints.partial" "$OUT/checkpoints"
    step_done
fi

# 5. Translate the test split, undo the BPE, score against the raw German references.
# --required-batch-size-multiple 1: with the default 8, fairseq drops the last batch when its size is not a
# multiple of 8, i.e. the last test sentences (facebookresearch/fairseq#5036).
if [[ -f $OUT/test.bleu ]]; then
    skip "5/6 translation and BLEU" "$OUT/test.bleu"
else
    step_start "5/6 fairseq-generate on the test split (beam 5) and sacreBLEU -> $OUT/test.bleu"
    fairseq-generate "$OUT/data-bin" --user-dir define_fairseq --cpu --num-workers 0 \
        --path "$OUT/checkpoints/checkpoint_last.pt" --gen-subset test \
        --beam 5 --batch-size 128 --required-batch-size-multiple 1 --remove-bpe > "$OUT/generate-test.txt.tmp" 2> "$OUT/generate-test.log" \
        || { cat "$OUT/generate-test.log" >&2; exit 1; }
    grep -h "Translated" "$OUT/generate-test.log" | sed 's/^.*generate[:| ]*//; s/^/    /' || true
    grep '^H-' "$OUT/generate-test.txt.tmp" | sed 's/^H-//' | sort -n -s -k1,1 | cut -f3 > "$OUT/test.hyp.de.tmp"
    refs=$(wc -l < "$OUT/corpus/test.de"); hyps=$(wc -l < "$OUT/test.hyp.de.tmp")
    [[ $refs == "$hyps" ]] || { echo "error: $hyps hypotheses for $refs test sentences" >&2; exit 1; }
    sacrebleu "$OUT/corpus/test.de" -i "$OUT/test.hyp.de.tmp" -m bleu chrf -f text > "$OUT/test.bleu.tmp"
    mv "$OUT/generate-test.txt.tmp" "$OUT/generate-test.txt"
    mv "$OUT/test.hyp.de.tmp" "$OUT/test.hyp.de"
    mv "$OUT/test.bleu.tmp" "$OUT/test.bleu"
    step_done
fi
echo
echo "==> test BLEU (sacreBLEU; the hypotheses, BPE removed, against the raw German references):"
sed 's/^ */    /' "$OUT/test.bleu"

# 6. Where the parameters are (in millions).
step_start "6/6 parameter breakdown (millions)"
python -m define_fairseq.tools.params "${TRAIN_ARGS[@]}" > "$OUT/params.txt.tmp" 2> "$OUT/params.log" \
    || { cat "$OUT/params.log" >&2; exit 1; }
mv "$OUT/params.txt.tmp" "$OUT/params.txt"
sed 's/^/    /' "$OUT/params.txt"
step_done

echo
echo "==> done. Checkpoint: $OUT/checkpoints/checkpoint_last.pt; hypotheses: $OUT/test.hyp.de" \
     "(fairseq output: $OUT/generate-test.txt); BLEU: $OUT/test.bleu"
