#!/usr/bin/env bash
# Perplexity of a Google Billion Word model of this recipe on the valid and test splits (fairseq-eval-lm).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

CONFIGS="gcnn_lm_13 gcnn_lm_14b gcnn_lm_8b"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-d DATA_DIR] [-s SAVE_ROOT] [-c CONFIG] CONFIG|CHECKPOINT [fairseq-eval-lm arguments...]

Evaluate SAVE_ROOT/CONFIG/checkpoint_best.pt (or the CHECKPOINT file given) on the valid and test splits of
DATA_DIR/data-bin and print the perplexities; they are also written to <checkpoint>.eval.txt (reused while the
checkpoint and the arguments are unchanged; FORCE=1 redoes it) with the full fairseq output in
<checkpoint>.eval.<split>.log. Arguments after the checkpoint are appended to every fairseq-eval-lm call
(e.g. --cpu).

As the paper scores GBW: one sentence at a time (--sample-break-mode eos), each starting from zero padding with
the end-of-sentence symbol as its first input, every word and the end of each sentence predicted and counted.
Every sentence is scored: fairseq-eval-lm would skip the samples longer than a model's positions (gcnn_lm has
no such limit), and this script stops if it did; a sentence longer than --max-tokens (4096 here) stops
fairseq-eval-lm ("Sentences lengths should not exceed max_tokens"): give a larger --max-tokens then. Batches of
up to 4096 tokens, the log-probabilities computed for 1024 tokens at a time (--softmax-batch).

Options:
  -c CONFIG     the config of a CHECKPOINT whose folder is not named after it
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/gbw)
  -s SAVE_ROOT  checkpoint root of train.sh (default: \$SAVE_ROOT or checkpoints/gbw)
  -h            this help
CONFIG is one of: $CONFIGS
USAGE
}

DATA_DIR=${DATA_DIR:-data/gbw}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/gbw}
CONFIG=""
lib_parse_options hc:d:s: "CONFIG or CHECKPOINT" "$@"
shift "$LIB_SHIFT"
TARGET=$1
shift

lib_eval_target "$TARGET" "$CONFIG" "$CONFIGS" "$SAVE_ROOT" "$HERE/train.sh"

# No --skip-invalid-size-inputs-valid-test here (fairseq-eval-lm has no such choice: it always skips what does
# not fit the model's positions, and EVAL_FORBID_SKIPPED=1 turns that into an error).
SENTENCES="--task language_modeling --sample-break-mode eos --tokens-per-sample 4096 --max-tokens 4096"
SENTENCES+=" --softmax-batch 1024"
SPECS=("valid|one sentence at a time|$SENTENCES" "test|one sentence at a time|$SENTENCES")
EVAL_FORBID_SKIPPED=1
lib_eval "$DATA_DIR/data-bin" "$CHECKPOINT" "${CHECKPOINT%.pt}.eval.txt" "${SPECS[@]}" -- "$@"
