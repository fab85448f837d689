#!/usr/bin/env bash
# Perplexity of a Google Billion Word model of this recipe on the valid and test splits (fairseq-eval-lm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

CONFIGS="gcnn_lm_13 gcnn_lm_14b gcnn_lm_8b"

usage() {
    lib_eval_usage gbw "$CONFIGS" "$(cat <<HOW
As the paper scores GBW: one sentence at a time (--sample-break-mode eos), each starting from zero padding with
the end-of-sentence symbol as its first input, every word and the end of each sentence predicted and counted.
Every sentence is scored: fairseq-eval-lm would skip the samples longer than a model's positions (gcnn_lm has
no such limit), and this script stops if it did; a sentence longer than --max-tokens (4096 here) stops
fairseq-eval-lm ("Sentences lengths should not exceed max_tokens"): give a larger --max-tokens then. Batches of
up to 4096 tokens, the log-probabilities computed for 1024 tokens at a time (--softmax-batch).
HOW
)"
}

# No --skip-invalid-size-inputs-valid-test here (fairseq-eval-lm has no such choice: it always skips what does
# not fit the model's positions, and EVAL_FORBID_SKIPPED=1 turns that into an error).
recipe_specs() {
    local sentences="--task language_modeling --sample-break-mode eos --tokens-per-sample 4096 --max-tokens 4096"
    sentences+=" --softmax-batch 1024"
    SPECS=("valid|one sentence at a time|$sentences" "test|one sentence at a time|$sentences")
    EVAL_FORBID_SKIPPED=1
}
lib_eval_recipe "$@"
