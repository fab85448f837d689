#!/usr/bin/env bash
# DeFINE against its baselines on the demo corpus (or yours), on CPU: several seeds, equal updates and equal time.
set -euo pipefail
usage() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT] [-s SEEDS] [-u UPDATES] [-m MODELS] [-c CORPUS_DIR] [-T]

Trains each model of MODELS (default: "baseline define projective") with each seed 1..SEEDS (default 3) at the
demo's size and settings (examples/lib.sh), on the demo corpus or on CORPUS_DIR's {train,valid,test}.{en,de}:
  - equal updates: UPDATES updates (default 2000), validation loss every 200;
  - equal time (skipped with -T): each model trained again for the baseline's training time of the same seed.
Each run translates the test split (beam 5) and is scored with sacreBLEU against the raw references. Writes
OUT/results.md (parameters, BLEU mean, standard deviation and per-seed values, times, updates) and OUT/curves.png
(validation loss against updates and against time; needs matplotlib). OUT defaults to translation_compare_output.
A rerun skips what is done. Time figures need a machine doing nothing else.

Models: baseline (fairseq's transformer_iwslt_de_en, one shared V x 128 table), define (transformer_define:
DeFINE n=96, k=256, N=3 on a shared V x 96 table, output tied to it), projective (a V x 105 table and one linear
map 105 -> 128: as many parameters as define), define_untied (a separate V x 128 output layer), define_linear_init
(nn.Linear's initialisation), define_n64 and projective_n72 (the same pair at n=64), projective_n96 (projective at define's n), lt, glt, hgt, define_concat
(the paper's ablations, Table 6), delight (the authors' unit).
EOF
}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

OUT=translation_compare_output SEEDS=3 UPDATES=2000 MODELS="baseline define projective" CORPUS="" TIMED=1
compare_option() {
    case $1 in u) UPDATES=$2 ;; T) TIMED=0 ;; esac
}
compare_options u:T "$@"
require_tools python subword-nmt fairseq-preprocess fairseq-generate sacrebleu

# DeFINE at n = 96 has fewer parameters than the baseline's V x 128 table; projective at n = 105 has as many as
# DeFINE (the paper's Table 2 compares them at equal n; equal parameters is the stricter test).
DEFINE="--arch transformer_define_iwslt_de_en --define-k 256 --define-n"
declare -A MODEL=(
    [baseline]="--arch transformer_iwslt_de_en"
    [define]="$DEFINE 96"
    [projective]="$DEFINE 105 --define-variant projective"
    [define_untied]="$DEFINE 96 --define-untie-output"
    [define_linear_init]="$DEFINE 96 --define-init linear"
    [define_n64]="$DEFINE 64"
    [projective_n72]="$DEFINE 72 --define-variant projective"
    [projective_n96]="$DEFINE 96 --define-variant projective"
    [lt]="$DEFINE 96 --define-variant lt"
    [glt]="$DEFINE 96 --define-variant glt"
    [hgt]="$DEFINE 96 --define-variant hgt"
    [define_concat]="$DEFINE 96 --define-variant define_concat"
    [delight]="$DEFINE 96 --define-variant delight"
)
compare_check_models
if (( TIMED )) && [[ $MODELS != baseline* ]]; then
    echo "error: -m: the first model must be baseline (its training time is the equal time; or -T)" >&2; exit 2
fi

mkdir -p "$OUT"
demo_corpus "$OUT" "$CORPUS"
joint_bpe "$OUT"
binarize_translation "$OUT"

# run REGIME NAME SEED [fairseq-train arguments]: train, translate the test split, score it (OUT/runs/REGIME/...).
run() {
    local regime=$1 name=$2 seed=$3; shift 3
    local dir=$OUT/runs/$regime/$name.s$seed
    # shellcheck disable=SC2206
    local args=("$OUT/data-bin" --user-dir define_fairseq ${MODEL[$name]} "${DEMO_TRANSFORMER[@]}" --seed "$seed")
    [[ -f $dir/score ]] && return 0
    echo "==> $regime: $name, seed $seed"
    train_run "$dir" "${args[@]}" --validate-interval-updates 200 "$@"
    python -m define_fairseq.tools.params "${args[@]}" > "$dir/params.txt" 2> "$dir/params.log"
    # fairseq's own argparse-era checkpoints (the baseline's) need the unrestricted loader; these are ours.
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 fairseq-generate "$OUT/data-bin" --user-dir define_fairseq --cpu \
        --num-workers 0 --path "$dir/checkpoint_last.pt" --gen-subset test --beam 5 --batch-size 128 \
        --required-batch-size-multiple 1 --remove-bpe > "$dir/generate.txt" 2> "$dir/generate.log" \
        || { tail "$dir/generate.log" >&2; exit 1; }
    grep '^H-' "$dir/generate.txt" | sed 's/^H-//' | sort -n -s -k1,1 | cut -f3 > "$dir/test.hyp"
    sacrebleu "$OUT/corpus/test.de" -i "$dir/test.hyp" -m bleu -b -w 2 > "$dir/score.tmp"
    mv "$dir/score.tmp" "$dir/score"
}

for seed in $(seq 1 "$SEEDS"); do
    for name in $MODELS; do
        run updates "$name" "$seed" --max-update "$UPDATES"
    done
done
if (( TIMED )); then
    for seed in $(seq 1 "$SEEDS"); do
        budget=$(seconds_of "$OUT/runs/updates/baseline.s$seed")
        mkdir -p "$OUT/runs/time"
        ln -sfn "../updates/baseline.s$seed" "$OUT/runs/time/baseline.s$seed"
        for name in ${MODELS#baseline}; do
            run time "$name" "$seed" --max-update 1000000 --stop-time-hours "$(python -c "print($budget / 3600)")"
        done
    done
fi

compare_report BLEU
