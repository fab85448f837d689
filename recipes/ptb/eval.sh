#!/usr/bin/env bash
# Perplexity of a PTB model of this recipe on the valid and test splits (fairseq-eval-lm); the script is
# shared with the other LSTM recipe (../lstm_eval.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"
source "$HERE/../lstm_eval.sh"

lstm_eval ptb ptb "$@"
