#!/usr/bin/env bash
# Perplexity of a WikiText-2 model of this recipe on the valid and test splits (fairseq-eval-lm).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

CONFIGS="awd_lstm_lm awd_lstm_lm_define"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-d DATA_DIR] [-s SAVE_ROOT] [-c CONFIG] CONFIG|CHECKPOINT [fairseq-eval-lm arguments...]

Evaluate SAVE_ROOT/CONFIG/checkpoint_best.pt (or the CHECKPOINT file given) on the valid and test splits of
DATA_DIR/data-bin and print the perplexities; they are also written to <checkpoint>.eval.txt (reused while the
checkpoint and the arguments are unchanged; FORCE=1 redoes it) with the full fairseq output in
<checkpoint>.eval.<split>.log. Arguments after the checkpoint are appended to every fairseq-eval-lm call
(e.g. --cpu).

As AWD-LSTM evaluates: --task stateful_lm, BPTT 70, the state carried through the whole split, valid with 10
parallel streams, test with 1.

Options:
  -c CONFIG     the config of a CHECKPOINT whose folder is not named after it
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/wikitext-2)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/wikitext-2)
  -h            this help
CONFIG is one of: $CONFIGS
USAGE
}

DATA_DIR=${DATA_DIR:-data/wikitext-2}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/wikitext-2}
CONFIG=""
while getopts ":hc:d:s:" opt; do
    case $opt in
        h) usage; exit 0 ;;
        c) CONFIG=$OPTARG ;;
        d) DATA_DIR=$OPTARG ;;
        s) SAVE_ROOT=$OPTARG ;;
        :) usage >&2; die "option -$OPTARG needs a value" ;;
        *) usage >&2; die "unknown option -$OPTARG" ;;
    esac
done
shift $((OPTIND - 1))
(( $# >= 1 )) || { usage >&2; die "missing CONFIG or CHECKPOINT"; }
TARGET=$1
shift

is_config() { [[ " $CONFIGS " == *" $1 "* ]]; }
if [[ -f $TARGET ]]; then
    CHECKPOINT=$TARGET
    [[ -n $CONFIG ]] || CONFIG=$(basename "$(dirname "$TARGET")")
    is_config "$CONFIG" || die "cannot tell which config $TARGET belongs to (its folder is not named after one);" \
        "give it with -c CONFIG ($CONFIGS)"
elif is_config "$TARGET"; then
    [[ -z $CONFIG || $CONFIG == "$TARGET" ]] || die "-c $CONFIG contradicts CONFIG $TARGET"
    CONFIG=$TARGET
    CHECKPOINT="$SAVE_ROOT/$CONFIG/checkpoint_best.pt"
    [[ -f $CHECKPOINT ]] || die "$CHECKPOINT not found; train it first: $HERE/train.sh $CONFIG" \
        "(or give -s SAVE_ROOT / a checkpoint file)"
else
    die "'$TARGET' is neither a checkpoint file nor a config ($CONFIGS)"
fi

SPECS=("valid|stateful, BPTT 70, 10 streams|--task stateful_lm --tokens-per-sample 70 --batch-size 10"
       "test|stateful, BPTT 70, 1 stream|--task stateful_lm --tokens-per-sample 70 --batch-size 1")

lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "${CHECKPOINT%.pt}.eval.txt" "${SPECS[@]}" -- "$@"
