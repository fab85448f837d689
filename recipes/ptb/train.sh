#!/usr/bin/env bash
# Train AWD-LSTM (with or without DeFINE), the Mogrifier LSTM or its LSTM baseline on the Penn Treebank with
# fairseq-train (see README.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-n] [-d DATA_DIR] [-s SAVE_ROOT] CONFIG [fairseq-train arguments...]

Train CONFIG on the binarized PTB in DATA_DIR/data-bin (made by prepare.sh) and write the checkpoints to
SAVE_ROOT/CONFIG (checkpoint_best.pt, checkpoint_last.pt, train.log). Arguments after CONFIG are appended to the
fairseq-train command and win over the recipe's (e.g. --max-epoch 1, --cpu).

CONFIG:
  awd_lstm_lm                     AWD-LSTM: 3 layers (1150, 1150, 400), 400-d embedding tied to the softmax
                                  (DeFINE paper, Table 1c; AWD-LSTM's PTB settings)
  awd_lstm_lm_define              the same with DeFINE (n=128, k=1024, N=7, m=400); last layer 128, tied to
                                  the V x 128 map
  mogrifier_lstm_lm_ptb           Mogrifier LSTM, 24M parameters: 2 layers of 912, r=5, k=84, tied (Melis et
                                  al., 2020; the official code's tuned PTB settings)
  mogrifier_lstm_lm_baseline_ptb  its LSTM baseline, 24M parameters: 2 layers of 951 (r=0), tuned settings of
                                  the same code

Options:
  -n            print the training command and exit
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/ptb)
  -s SAVE_ROOT  checkpoint root (default: \$SAVE_ROOT or checkpoints/ptb)
  -h            this help

One GPU (CUDA_VISIBLE_DEVICES=0): the batch is --batch-size streams per GPU. A finished training is skipped on a
rerun (SAVE_ROOT/CONFIG/.done/train); an interrupted one resumes from checkpoint_last.pt.
USAGE
}

DATA_DIR=${DATA_DIR:-data/ptb}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/ptb}
DRY_RUN=0
lib_parse_options hnd:s: CONFIG "$@"
shift "$LIB_SHIFT"
CONFIG=$1
shift

# AWD-LSTM's PTB command (awd-lstm-lm README: main.py --batch_size 20 --dropouti 0.4 --dropouth 0.25 --seed 141
# --epoch 500, the other values its defaults): SGD lr 30, gradient norm clipped at 0.25, weight decay 1.2e-6,
# BPTT 70 with its variable length, 20 streams (10 for validation), output dropout 0.4, input dropout 0.4,
# between-layer dropout 0.25, embedding (word) dropout 0.1, weight drop 0.5, AR 2, TAR 1. fairseq has no
# NT-ASGD: plain SGD, the lr divided by 10 after 5 epochs without a better validation loss (AWD-LSTM's
# non-monotone interval is 5 epochs too).
# Plain SGD is fairseq's `nag` optimizer with --momentum 0: its update is then exactly SGD's,
# p <- p * (1 - lr * weight_decay) - lr * grad. fairseq's own `sgd` would store its settings in the checkpoint as
# an argparse.Namespace, which torch >= 2.6 refuses to unpickle by default, so neither a resumed training nor
# fairseq-eval-lm could load the checkpoint.
AWD_PTB=(
    --task stateful_lm --tokens-per-sample 70 --variable-bptt --batch-size 20 --batch-size-valid 10
    --criterion lm_regularized_loss
    --optimizer nag --momentum 0 --lr 30 --clip-norm 0.25 --weight-decay 1.2e-6 --max-epoch 500
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.1 --lr-patience 5
    --awd-output-dropout 0.4 --awd-input-dropout 0.4 --awd-hidden-dropout 0.25
    --awd-embed-dropout 0.1 --awd-weight-drop 0.5 --awd-ar-alpha 2 --awd-tar-beta 1
    --seed 141 --no-epoch-checkpoints --log-format simple --log-interval 200
)

# The Mogrifier LSTM and its LSTM baseline as the official code (DeepMind's lamb) trains its tuned PTB configs
# (lamb/experiment/mogrifier/config/*_tune_ptb_24m_lstm{,_fm}_d2_arms): 64 streams, BPTT 70, state carried across
# batches (each stream's reset with probability 0.01: the archs' --mogrifier-drop-state-probability), Adam with
# beta1 = 0 (lamb's "rmsprop"), eps 1e-8, constant learning rate, gradient norm clipped at 10, 1000 turns of 200
# steps = 200k updates, seed 1. lamb's objective is the cross-entropy summed over the 70 steps and averaged over the
# streams, plus l2_penalty / 2 * sum(theta^2) over all parameters: --sentence-avg gives that normalisation (so the
# clipping threshold and eps act on the same gradient as lamb's), and --mogrifier-l2-penalty adds the L2 term
# through lm_regularized_loss. fairseq's --weight-decay is not the same thing (in fairseq's Adam it is decoupled:
# p <- p - lr * wd * p after the Adam step, never seen by the clipping or the second-moment estimate); it stays 0.
LAMB_PTB=(
    --task stateful_lm --tokens-per-sample 70 --batch-size 64 --batch-size-valid 64
    --criterion lm_regularized_loss --sentence-avg
    --optimizer adam --adam-betas "(0, 0.999)" --adam-eps 1e-08 --weight-decay 0 --clip-norm 10
    --lr-scheduler fixed --max-update 200000
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 200
)

case $CONFIG in
    awd_lstm_lm | awd_lstm_lm_define) ARGS=(--arch "$CONFIG" "${AWD_PTB[@]}") ;;
    # learning rate and L2 of lamb's best trials (trial_483 and trial_833)
    mogrifier_lstm_lm_ptb) ARGS=(--arch "$CONFIG" "${LAMB_PTB[@]}" --lr 0.0023 --mogrifier-l2-penalty 2.52e-4) ;;
    mogrifier_lstm_lm_baseline_ptb) ARGS=(--arch "$CONFIG" "${LAMB_PTB[@]}" --lr 0.00304 --mogrifier-l2-penalty 2.49e-4) ;;
    *) usage >&2
       die "unknown CONFIG '$CONFIG' (awd_lstm_lm, awd_lstm_lm_define, mogrifier_lstm_lm_ptb or" \
           "mogrifier_lstm_lm_baseline_ptb)" ;;
esac

lib_train "$DRY_RUN" "$DATA_DIR/data-bin" "$SAVE_ROOT/$CONFIG" "${ARGS[@]}" "$@"
