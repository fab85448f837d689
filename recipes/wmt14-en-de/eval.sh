#!/usr/bin/env bash
# BLEU of a WMT14 En-De model on newstest2014 and newstest2017: sacreBLEU, and the tokenised compound-split BLEU
# that fairseq and the DeFINE/DeLighT papers report (see README.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

CONFIGS="transformer_wmt_en_de transformer_define"
declare -A SUBSET=([newstest2013]=valid [newstest2014]=test [newstest2017]=test1)

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-d DATA_DIR] [-s SAVE_ROOT] [-c CONFIG] [-a N] [-b BEAM] [-l LENPEN] [-B BATCH]
       [-t "TESTSET..."] CONFIG|CHECKPOINT [fairseq-generate arguments...]

Translate each test set with fairseq-generate and score it two ways:
  sacreBLEU         the detokenised output against the original reference (raw/<testset>.de of prepare.sh),
                    sacreBLEU's default 13a tokenisation; its signature is printed with the score
  tokenised BLEU    fairseq-score (BLEU4, as multi-bleu.perl) on Moses-tokenised (-a) output and reference with
                    compounds split as fairseq's compound_split_bleu.sh does (perl's s{(\S)-(\S)}{\$1 ##AT##-##AT## \$2}g,
                    so the tokenised "x @-@ y" becomes "x @ ##AT##-##AT## @ y"): the number fairseq's and the
                    DeFINE/DeLighT papers' WMT14 tables report
The checkpoint is SAVE_ROOT/CONFIG/checkpoint_best.pt, checkpoint_avgN.pt with -a N (made by average.sh), or the
CHECKPOINT file given. Results go to <checkpoint folder>/bleu.<checkpoint name>.beamBEAM.lenpenLENPEN/: bleu.txt
(one line per test set) and, per test set, the fairseq-generate log, the hypotheses (tokenised and
detokenised), the sacreBLEU JSON and the fairseq-score output. They are reused while the checkpoint and the
arguments are unchanged and the data were not binarized again (FORCE=1 redoes them). Arguments after the
checkpoint are appended to every fairseq-generate call (e.g. --cpu, --fp16; not --nbest or --quiet).

Options:
  -a N          evaluate checkpoint_avgN.pt instead of checkpoint_best.pt
  -b BEAM       beam size (default 4)
  -l LENPEN     length penalty (default 0.6); beam 4 and 0.6 are Vaswani et al.'s, the paper gives neither
  -B BATCH      sentences a batch (default 128)
  -t TESTSETS   test sets, separated by spaces (default "newstest2014 newstest2017"; newstest2013 is valid)
  -c CONFIG     the config of a CHECKPOINT whose folder is not named after it
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/wmt14-en-de)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/wmt14-en-de)
  -h            this help
CONFIG is one of: $CONFIGS
USAGE
}

DATA_DIR=${DATA_DIR:-data/wmt14-en-de}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/wmt14-en-de}
CONFIG="" AVERAGE="" BEAM=4 LENPEN=0.6 BATCH=128 TESTSETS="newstest2014 newstest2017"
recipe_option() {
    case $1 in
        a) AVERAGE=$2 ;;
        b) BEAM=$2 ;;
        l) LENPEN=$2 ;;
        B) BATCH=$2 ;;
        t) TESTSETS=$2 ;;
        *) return 1 ;;
    esac
}
lib_parse_options hd:s:c:a:b:l:B:t: "CONFIG or CHECKPOINT" "$@"
shift "$LIB_SHIFT"
TARGET=$1
shift
EXTRA=("$@")

for arg in "${EXTRA[@]+"${EXTRA[@]}"}"; do
    case $arg in
        --nbest* | --quiet) die "eval.sh scores the best translation of every sentence from fairseq-generate's log;" \
            "do not pass $arg" ;;
    esac
done
[[ $BEAM =~ ^[1-9][0-9]*$ ]] || die "-b $BEAM: give the beam size as a positive whole number"
[[ $BATCH =~ ^[1-9][0-9]*$ ]] || die "-B $BATCH: give the batch size as a positive whole number"
[[ $LENPEN =~ ^-?[0-9]*\.?[0-9]+$ ]] || die "-l $LENPEN: give the length penalty as a number"
read -r -a TESTSET_LIST <<< "$TESTSETS"
(( ${#TESTSET_LIST[@]} )) || die "-t gives no test set"
for testset in "${TESTSET_LIST[@]}"; do
    [[ -n ${SUBSET[$testset]:-} ]] || die "-t: unknown test set '$testset' (newstest2013, newstest2014, newstest2017)"
done
if [[ -n $AVERAGE ]]; then
    [[ $AVERAGE =~ ^[1-9][0-9]*$ ]] || die "-a $AVERAGE: give the number of averaged checkpoints"
    [[ ! -f $TARGET ]] || die "-a N takes a CONFIG, not a checkpoint file"
    [[ " $CONFIGS " == *" $TARGET "* ]] || die "'$TARGET' is not a config ($CONFIGS)"
    CONFIG=$TARGET
    CHECKPOINT="$SAVE_ROOT/$CONFIG/checkpoint_avg$AVERAGE.pt"
    [[ -f $CHECKPOINT ]] || die "$CHECKPOINT not found; make it first: $HERE/average.sh -n $AVERAGE $CONFIG"
else
    lib_eval_target "$TARGET" "$CONFIG" "$CONFIGS" "$SAVE_ROOT" "$HERE/train.sh"
fi

if [[ $CONFIG == transformer_wmt_en_de ]]; then
    # fairseq's own Transformer keeps an argparse.Namespace in its checkpoints (see train.sh)
    export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
fi

require_tool fairseq-generate
require_tool fairseq-score
require_tool sacrebleu "It comes with this project's requirements (pip install sacrebleu)."
require_plugin
PYTHON=$(lib_python)
BIN="$DATA_DIR/data-bin" RAW="$DATA_DIR/raw"
[[ -f $BIN/dict.en.txt ]] || die "no binarized data in $BIN; run $HERE/prepare.sh first"
if [[ -f $DATA_DIR/bpe/code ]]; then
    BPE=subword-nmt REMOVE_BPE=(--remove-bpe)
elif [[ -f $DATA_DIR/bpe/spm.model ]]; then
    BPE=sentencepiece REMOVE_BPE=(--remove-bpe sentencepiece)
else
    die "neither $DATA_DIR/bpe/code nor $DATA_DIR/bpe/spm.model exists; was $DATA_DIR prepared by $HERE/prepare.sh?"
fi

checkpoint_name=$(basename "$CHECKPOINT" .pt)
RESULTS="$(dirname "$CHECKPOINT")/bleu.$checkpoint_name.beam$BEAM.lenpen$LENPEN"
SIGNATURE="# BLEU of $CHECKPOINT on $DATA_DIR ($BPE): beam $BEAM, lenpen $LENPEN, batch $BATCH; test sets ${TESTSET_LIST[*]};"
SIGNATURE+=" extra fairseq-generate arguments: ${EXTRA[*]-}"
if [[ ${FORCE:-0} != 1 && -f $RESULTS/bleu.txt && $RESULTS/bleu.txt -nt $CHECKPOINT \
      && $RESULTS/bleu.txt -nt $BIN/dict.en.txt ]] \
    && [[ $(head -n 1 "$RESULTS/bleu.txt") == "$SIGNATURE" ]]; then
    lib_skip "evaluation" "$RESULTS/bleu.txt; FORCE=1 redoes it"
    tail -n +2 "$RESULTS/bleu.txt"
    exit 0
fi

STAGED="$RESULTS.tmp"
lib_tmp "$STAGED"
rm -rf -- "$STAGED"
mkdir -p "$STAGED"
printf '%s\n' "$SIGNATURE" > "$STAGED/bleu.txt"
for testset in "${TESTSET_LIST[@]}"; do
    subset=${SUBSET[$testset]} out="$STAGED/$testset"
    ref="$RAW/$testset.de"
    [[ $testset != newstest2013 ]] || ref="$RAW/valid.de"
    [[ -s $ref ]] || die "the reference $ref is missing; rerun $HERE/prepare.sh $DATA_DIR"
    log "fairseq-generate on $testset (--gen-subset $subset, beam $BEAM, lenpen $LENPEN)"
    # --required-batch-size-multiple 1: fairseq's default of 8 would drop the last sentences of a test set whose
    # size is not a multiple of 8 from a batch rounded down
    PYTHONUNBUFFERED=1 fairseq-generate "$BIN" --user-dir "$LIB_USER_DIR" --path "$CHECKPOINT" \
        --task translation --source-lang en --target-lang de --gen-subset "$subset" \
        --beam "$BEAM" --lenpen "$LENPEN" --batch-size "$BATCH" --required-batch-size-multiple 1 \
        "${REMOVE_BPE[@]}" "${EXTRA[@]+"${EXTRA[@]}"}" > "$out.generate.log" 2>&1 \
        || { tail -n 20 "$out.generate.log" >&2; die "fairseq-generate failed on $testset (its output is above)"; }
    # the hypotheses in the order of the test set (H-<id> <score> <text>; the text may be empty)
    grep -E '^H-[0-9]+'$'\t' "$out.generate.log" | sed -E 's/^H-//' | sort -n -k1,1 -s \
        | cut -f3- > "$out.hyp" || true
    expected=$(lib_lines "$ref")
    found=$(lib_lines "$out.hyp")
    (( found == expected )) || die "fairseq-generate translated $found of the $expected sentences of $testset" \
        "(see $out.generate.log); a sentence longer than the model's --max-source-positions is skipped"
    if [[ $BPE == subword-nmt ]]; then  # the output is Moses-tokenised text (as the training data)
        mv -- "$out.hyp" "$out.hyp.tok"
        lib_tool moses_text detokenize -l de "$out.hyp.tok" "$out.hyp.detok"
    else                                 # SentencePiece gives back plain text
        mv -- "$out.hyp" "$out.hyp.detok"
        lib_tool moses_text tokenize -l de "$out.hyp.detok" "$out.hyp.tok"
    fi
    lib_tool moses_text tokenize -l de "$ref" "$out.ref.tok"
    lib_tool moses_text split-compounds "$out.hyp.tok" "$out.hyp.tok.split"
    lib_tool moses_text split-compounds "$out.ref.tok" "$out.ref.tok.split"
    fairseq-score --sys "$out.hyp.tok.split" --ref "$out.ref.tok.split" > "$out.fairseq-score.txt" 2>&1 \
        || { cat "$out.fairseq-score.txt" >&2; die "fairseq-score failed on $testset"; }
    tokenized=$(grep -Eo 'BLEU4 = [0-9.]+' "$out.fairseq-score.txt" | tail -n 1 | cut -d' ' -f3) || true
    [[ -n $tokenized ]] || { cat "$out.fairseq-score.txt" >&2; die "no BLEU4 in the fairseq-score output"; }
    sacrebleu "$ref" -i "$out.hyp.detok" -m bleu -w 2 > "$out.sacrebleu.json" 2> "$out.sacrebleu.err" \
        || { cat "$out.sacrebleu.err" >&2; die "sacrebleu failed on $testset"; }
    read -r sacre signature < <("$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1]));
print(r["score"], r["signature"])' "$out.sacrebleu.json") || die "cannot read $out.sacrebleu.json"
    rm -f -- "$out.sacrebleu.err"
    printf '%-13s sacreBLEU %6.2f  tokenized compound-split BLEU %6.2f  (%s sentences; %s)\n' "$testset" \
        "$sacre" "$tokenized" "$expected" "$signature" >> "$STAGED/bleu.txt"
    printf '    sacreBLEU %s, tokenized compound-split BLEU %s\n' "$sacre" "$tokenized"
done
rm -rf -- "$RESULTS"
mv -- "$STAGED" "$RESULTS"
log "done: $RESULTS/bleu.txt"
tail -n +2 "$RESULTS/bleu.txt"
