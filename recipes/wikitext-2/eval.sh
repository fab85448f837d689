#!/usr/bin/env bash
# Perplexity of a WikiText-2 model of this recipe on the valid and test splits (fairseq-eval-lm); the script is
# shared with the other LSTM recipe (../lstm_lm.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lstm_lm.sh"
lstm_eval wt2 "$@"
