#!/usr/bin/env bash
# Train AWD-LSTM (with or without DeFINE), the Mogrifier LSTM or its LSTM baseline on the Penn Treebank with
# fairseq-train (see README.md); the settings common to both LSTM recipes are in ../lstm_lm.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lstm_lm.sh"

# AWD-LSTM's PTB command (awd-lstm-lm README: main.py --batch_size 20 --dropouti 0.4 --dropouth 0.25 --seed 141
# --epoch 500, the other values its defaults): 20 streams, input dropout 0.4, between-layer dropout 0.25.
AWD_SETTINGS=(--batch-size 20 --awd-input-dropout 0.4 --awd-hidden-dropout 0.25 --seed 141 --max-epoch 500)
AWD_SOURCE="DeFINE paper, Table 1c; AWD-LSTM's PTB settings"
# The official Mogrifier code's tuned PTB configs (lamb/experiment/mogrifier/config/*_tune_ptb_24m_lstm{,_fm}_d2_arms):
# the learning rate and L2 penalty of their best trials (trial_483 and trial_833).
MOGRIFIER_HELP="\
  mogrifier_lstm_lm_ptb           Mogrifier LSTM, 24M parameters: 2 layers of 912, r=5, k=84, tied (Melis et
                                  al., 2020; the official code's tuned PTB settings)
  mogrifier_lstm_lm_baseline_ptb  its LSTM baseline, 24M parameters: 2 layers of 951 (r=0), tuned settings of
                                  the same code"
MOGRIFIER_SETTINGS=(--lr 0.0023 --mogrifier-l2-penalty 2.52e-4)
BASELINE_SETTINGS=(--lr 0.00304 --mogrifier-l2-penalty 2.49e-4)
lstm_train PTB ptb "$@"
