#!/usr/bin/env bash
# Train one of the gated convolutional LMs of Dauphin et al. (2017) on Google Billion Word (see README.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
    lib_train_usage "Google Billion Word" "$(cat <<CONFIGS
CONFIG (= --arch; the gcnn_lm model, adaptive softmax with cutoffs 10000,50000,200000):
  gcnn_lm_13    GCNN-13: 13 x (1268 units, k=4), lookup 128       [paper: test 38.1]
  gcnn_lm_14b   GCNN-14 Bottleneck: (512, k=5) + 13 bottleneck blocks up to 4096 units, lookup 128
                                                                  [paper: 8 GPUs, 2 weeks]
  gcnn_lm_8b    GCNN-8 Bottleneck (the paper's speed model): (512, k=1) + 7 bottleneck blocks, lookup 128
Settings of all three: one sentence per sequence, starting from zero padding (--sample-break-mode eos), Nesterov
momentum 0.99, lr 1 (halved whenever the validation loss stalls), gradient norm clipped at 0.1, no dropout, no
weight decay; 4096 tokens per GPU per update (our choice: the paper gives no batch size), at most 35 epochs (our
choice: the paper gives no epoch count); validation and a checkpoint every 10,000 updates as well as at the end
of each epoch (an epoch is about 200,000 updates on one GPU).
CONFIGS
)" "fairseq-train uses every visible GPU, each with --max-tokens 4096 of its own."
}

# From the paper (Dauphin et al. 2017): each GBW sequence is one sentence whose convolutions start from zero
# padding, so no context crosses a sentence boundary (--sample-break-mode eos: one sentence per row, the row's
# first input is the end-of-sentence symbol that plays the paper's <S>); Nesterov momentum 0.99 (fairseq's nag);
# learning rate 1 (its random search drew it from [1, 2]); gradient norm clipped at 0.1; weight normalisation
# (inside the gcnn_lm model); no dropout or weight decay mentioned. Adaptive softmax, as the paper.
#
# Our choices, where the paper gives nothing:
# * --max-tokens 4096 per GPU: about 150 GBW sentences (about 27 tokens each on average, end of sentence
#   included: 0.8 billion words in 30.3 million sentences). The paper gives no batch size; it trained GCNN-14B on
#   8 GPUs, each computing 1/8 of the gradient (--update-freq 8 on one GPU gives 8 such batches per update). By
#   our arithmetic GCNN-14B then needs about 8 GB of GPU memory (430M parameters with their gradients and
#   momentum, plus the activations of 4096 tokens); not measured.
# * Sentence length. In eos mode fairseq cuts one row per sentence whatever --tokens-per-sample says, and
#   gcnn_lm takes any length, so the real limit is --max-tokens: fairseq-train drops the (very rare) training
#   sentences longer than 4096 tokens and logs how many; a longer validation sentence would stop it ("Sentences
#   lengths should not exceed max_tokens"; raise --max-tokens-valid then). --tokens-per-sample says the same
#   4096, and --skip-invalid-size-inputs-valid-test would skip the longer validation sentences of a model with a
#   position limit; it only concerns training (validation steers the learning rate and checkpoint_best.pt):
#   eval.sh scores every test sentence.
# * The schedule of fairseq's WikiText-103 conv recipe (README.conv.md, the only one fairseq has for these
#   models): --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5, and its 35 epochs as an upper bound.
# * Validation and a checkpoint also every 10,000 updates (--save-interval-updates 10000, the last one kept),
#   since one epoch is about 200,000 updates on one GPU: an interrupted run loses less, and checkpoint_best.pt
#   follows the validation loss within an epoch. The learning rate still changes at the end of an epoch only.
GBW_COMMON=(
    --task language_modeling --sample-break-mode eos --tokens-per-sample 4096 --max-tokens 4096
    --skip-invalid-size-inputs-valid-test
    --criterion adaptive_loss --ddp-backend legacy_ddp
    --optimizer nag --momentum 0.99 --lr 1.0 --clip-norm 0.1 --weight-decay 0
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --max-epoch 35
    --save-interval-updates 10000 --keep-interval-updates 1
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 100
)

recipe_args() {
    case $1 in
        gcnn_lm_13 | gcnn_lm_14b | gcnn_lm_8b) ARGS=(--arch "$1" "${GBW_COMMON[@]}") ;;
        *) lib_unknown_config ;;
    esac
}
lib_train_recipe "$@"
