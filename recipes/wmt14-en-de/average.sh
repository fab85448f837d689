#!/usr/bin/env bash
# Average the last checkpoints of a WMT14 En-De training (checkpoint averaging, Vaswani et al., 2017).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

CONFIGS="transformer_wmt_en_de transformer_define"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-s SAVE_ROOT] [-n N] CONFIG|SAVE_DIR

Average the parameters of the N newest update checkpoints (checkpoint_<epoch>_<updates>.pt, which train.sh
writes every 2000 updates and keeps 10 of) of SAVE_ROOT/CONFIG (or of the folder SAVE_DIR) into
checkpoint_avgN.pt in the same folder; eval.sh -a N evaluates it. The average is made again only when a newer
checkpoint exists (FORCE=1 redoes it).

Options:
  -n N          how many checkpoints (default 5: the base models of Vaswani et al. averaged their last 5)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/wmt14-en-de)
  -h            this help
CONFIG is one of: $CONFIGS
USAGE
}

SAVE_ROOT=${SAVE_ROOT:-checkpoints/wmt14-en-de}
COUNT=5
recipe_option() { [[ $1 == n ]] && COUNT=$2; }  # -n N here: how many checkpoints, not a dry run
lib_parse_options hs:n: "" "$@"
shift "$LIB_SHIFT"
(( $# == 1 )) || { usage >&2; die "give one CONFIG or SAVE_DIR"; }
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || die "-n $COUNT: give the number of checkpoints as a positive whole number"
if [[ -d $1 ]]; then
    SAVE_DIR=$1
elif [[ " $CONFIGS " == *" $1 "* ]]; then
    SAVE_DIR=$SAVE_ROOT/$1
    [[ -d $SAVE_DIR ]] || die "$SAVE_DIR not found; train it first: $HERE/train.sh $1 (or give -s SAVE_ROOT)"
else
    die "'$1' is neither a checkpoint folder nor a config ($CONFIGS)"
fi

OUTPUT="$SAVE_DIR/checkpoint_avg$COUNT.pt"
newest=$(find "$SAVE_DIR" -maxdepth 1 -name 'checkpoint_*_*.pt' -newer "$OUTPUT" 2>/dev/null | head -n 1) || true
if [[ ${FORCE:-0} != 1 && -f $OUTPUT && -z $newest ]]; then
    lib_skip "averaging" "$OUTPUT is newer than every checkpoint; FORCE=1 redoes it"
    exit 0
fi
lib_tmp "$OUTPUT.tmp"
log "average the last $COUNT update checkpoints of $SAVE_DIR -> $OUTPUT"
lib_tool average_checkpoints --dir "$SAVE_DIR" --last "$COUNT" --output "$OUTPUT" \
    || die "averaging failed (the message is above)"
