#!/usr/bin/env bash
# DeFINE against its baselines on the demo corpus (or yours), on CPU: several seeds, equal updates, equal time and
# longer training, all from one training run per model and seed.
set -euo pipefail
usage() {
    compare_usage_line
    cat <<EOF

Trains at the demo's size and settings (examples/lib.sh) but with 500 warm-up updates, on the demo corpus or on
CORPUS_DIR's {train,valid,test}.{en,de}. fairseq's inverse-sqrt schedule (-S fixed) and data order do not
depend on --max-update, so each point is the checkpoint of a run stopped there.
EOF
    compare_usage_points "the test split translated with beam 5, sacreBLEU against the raw references" \
        "the baseline"
    cat <<EOF

Models: baseline (fairseq's transformer_iwslt_de_en, one shared V x 128 table), define (transformer_define:
DeFINE n=96, k=256, N=3 on a shared V x 96 table, output tied to it), projective (a V x 105 table and one linear
map 105 -> 128: as many parameters as define), define_untied (a separate V x 128 output layer), define_linear_init
(nn.Linear's initialisation), define_n64 and projective_n72, define_n128 and projective_n137 (the same pair at
n=64 and n=128), projective_n96 (projective at define's n), define_k512 (k=512), define_no_norm and
define_no_activation (the unit without its normalisation or its activation), lt, glt, hgt, define_concat (the
paper's ablations, Table 6), delight (the authors' unit), define_separate and delight_separate (a unit per side, one
shared table, as the authors' code shares it).
EOF
}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/lib.sh

SAVE_EVERY=100 TIME_MARGIN=110
OUT=translation_compare_output SEEDS=3 UPDATES=2000 MODELS="baseline define projective"
compare_options "$@"
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
    [define_n128]="$DEFINE 128"
    [projective_n137]="$DEFINE 137 --define-variant projective"
    [projective_n96]="$DEFINE 96 --define-variant projective"
    [define_k512]="$DEFINE 96 --define-k 512"
    [define_no_norm]="$DEFINE 96 --define-norm none"
    [define_no_activation]="$DEFINE 96 --define-activation none"
    [lt]="$DEFINE 96 --define-variant lt"
    [glt]="$DEFINE 96 --define-variant glt"
    [hgt]="$DEFINE 96 --define-variant hgt"
    [define_concat]="$DEFINE 96 --define-variant define_concat"
    [delight]="$DEFINE 96 --define-variant delight"
    [define_separate]="$DEFINE 96 --define-separate-units"
    [delight_separate]="$DEFINE 96 --define-variant delight --define-separate-units"
)
compare_check_models
if (( TIMED )) && [[ $MODELS != baseline* ]]; then
    echo "error: -m: the first model must be baseline (its training time is the equal time; or -T)" >&2; exit 2
fi
compare_check_points

mkdir -p "$OUT"
demo_corpus "$OUT" "$CORPUS"
joint_bpe "$OUT"
binarize_translation "$OUT"

# run_args NAME SEED (compare_run's): the demo's model and training with 500 warm-up updates (better than the
# demo's 150 for every model on every corpus measured, the baseline most: examples/translation/README.md), NAME's
# arguments and -x's (which come last, so -x "--warmup-updates 150" gives the demo's).
run_args() {
    # shellcheck disable=SC2206
    RUN_ARGS=("$OUT/data-bin" --user-dir define_fairseq ${MODEL[$1]} "${DEMO_TRANSFORMER[@]}" --warmup-updates 500
              "${DEVICE_ARGS[@]}" --seed "$2" $EXTRA)
}

# score_checkpoint CHECKPOINT DIR (compare_run's): translate the test split (beam 5) into DIR and print its BLEU.
score_checkpoint() {
    local checkpoint=$1 dir=$2
    # fairseq's own argparse-era checkpoints (the baseline's) need the unrestricted loader; these are ours.
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 fairseq-generate "$OUT/data-bin" --user-dir define_fairseq \
        "${EVAL_DEVICE_ARGS[@]}" --num-workers 0 --path "$checkpoint" --gen-subset test --beam 5 --batch-size 128 \
        --required-batch-size-multiple 1 --remove-bpe > "$dir/generate.txt" 2> "$dir/generate.log" \
        || { tail "$dir/generate.log" >&2; exit 1; }
    grep '^H-' "$dir/generate.txt" | sed 's/^H-//' | sort -n -s -k1,1 | cut -f3 > "$dir/test.hyp"
    sacrebleu "$OUT/corpus/test.de" -i "$dir/test.hyp" -m bleu -b -w 2
}

compare_run_all
compare_report BLEU "$(compare_runs_note "the baseline")" "${EXTRA:+Every model with: $EXTRA.}"
