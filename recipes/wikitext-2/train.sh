#!/usr/bin/env bash
# Train AWD-LSTM (with or without DeFINE), the Mogrifier LSTM or its LSTM baseline on WikiText-2 with
# fairseq-train (see README.md); the settings common to both LSTM recipes are in ../lstm_lm.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lstm_lm.sh"

# AWD-LSTM's WikiText-2 command (awd-lstm-lm README: main.py --epochs 750 --dropouth 0.2 --seed 1882, the other
# values its defaults): 80 streams, input dropout 0.65, between-layer dropout 0.2.
AWD_SETTINGS=(--batch-size 80 --awd-input-dropout 0.65 --awd-hidden-dropout 0.2 --seed 1882 --max-epoch 750)
AWD_SOURCE="AWD-LSTM's WikiText-2 settings; the DeFINE paper has no WikiText-2 experiment"
# The official Mogrifier code's tuned WikiText-2 configs
# (lamb/experiment/mogrifier/config/*_tune_wikitext-2_35m_lstm_mos2{,_fm}_d2_arms): the learning rate and L2
# penalty of their best trials (trial_747 and trial_763).
MOGRIFIER_HELP="\
  mogrifier_lstm_lm_wt2           Mogrifier LSTM, 35M parameters: 2 layers of 1366, r=6, k=48, 272-d
                                  embeddings, mixture of 2 softmaxes (Melis et al., 2020; the official code's tuned
                                  WikiText-2 settings)
  mogrifier_lstm_lm_baseline_wt2  its LSTM baseline, 35M parameters: 2 layers of 1211 (r=0), 428-d embeddings,
                                  MoS2"
MOGRIFIER_SETTINGS=(--lr 0.00329 --mogrifier-l2-penalty 1.90e-4)
BASELINE_SETTINGS=(--lr 0.00318 --mogrifier-l2-penalty 2.31e-4)
lstm_train WikiText-2 wt2 "$@"
