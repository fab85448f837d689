#!/usr/bin/env bash
# Train one of the DeFINE paper's WikiText-103 language models with fairseq-train (see README.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() {
    lib_train_usage WikiText-103 "$(cat <<CONFIGS
CONFIG (Table 1a of the paper: LSTM LMs; SGD lr 20, BPTT 140, batch 60, 20 epochs, lr / 10 after epoch 15):
  lstm_lm_standard_wt103     R1: standard V x 256 input, full softmax (tied)  [paper: 2 GPUs]
  lstm_lm_adaptive_wt103     R2: adaptive input 256 + adaptive softmax (tied)
  lstm_lm_define_wt103_n3    R3: adaptive + DeFINE, N=3,  n=m=256, k=1024
  lstm_lm_define_wt103_n7    R4: adaptive + DeFINE, N=7,  n=m=384, k=1024
  lstm_lm_define_wt103_n11   R5: adaptive + DeFINE, N=11, n=m=512, k=1024
Transformer LMs (fairseq's adaptive-input recipe of Baevski & Auli 2019, made for 8 GPUs):
  transformer_lm_wiki103          fairseq's stock adaptive-input Transformer LM (the baseline)
  transformer_lm_define_wiki103   the same with DeFINE (n=256, N=3, k=4096) under the adaptive input
Gated convolutional LMs (Dauphin et al. 2017: Nesterov momentum 0.99, lr 1, clip 0.1, weight norm; the batch,
blocks and epochs, which the paper does not give, are fairseq's README.conv.md: 1024-token blocks, 1024 tokens
per GPU, lr halved when the validation loss stalls, 35 epochs):
  gcnn_lm_8                       --arch gcnn_lm_8: GCNN-8, 8 x (800 units, k=4), no dropout, no weight decay
  gcnn_lm_14                      --arch gcnn_lm_14: GCNN-14, fairseq's layer table, no dropout, no weight decay
  fconv_lm_dauphin_wikitext103    fairseq's own GCNN-14 (the baseline), README.conv.md's command as it is
                                  (dropout 0.2, weight decay 5e-6); its checkpoints need
                                  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, which this script sets for it
CONFIGS
)" "fairseq-train uses every visible GPU: the LSTM rows are single-GPU settings (CUDA_VISIBLE_DEVICES=0), except
lstm_lm_standard_wt103 (the paper used 2 GPUs: add --batch-size 30 to keep 60 streams in all)."
}

# Table 9: SGD, lr 20 for epochs 1-15 and 2 for epochs 16-20 (fairseq's `fixed` scheduler reads one lr per
# epoch from the --lr list and keeps the last one), BPTT 140, 60 streams, no weight decay. Where the paper
# says "as Merity et al. (2018a)" or nothing, the values are those of Merity et al.'s WikiText-103 command in
# the awd-lstm-lm README: locked dropout 0.1 on the LSTM input, between layers and on the output, no
# embedding dropout, no AR/TAR, gradient norm clipped at 0.25 (its default), AWD-LSTM's variable-length BPTT.
# That command's weight drop (0.5) acts on the QRNN's convolution weights, which an LSTM does not have: weight
# drop stays off. Validation during training: 10 streams.
# Plain SGD is fairseq's `nag` optimizer with --momentum 0 (../lstm_lm.sh says why not fairseq's `sgd`).
LSTM_LR="$(printf '20,%.0s' {1..15})2"
LSTM_COMMON=(
    --task stateful_lm --tokens-per-sample 140 --variable-bptt --batch-size 60 --batch-size-valid 10
    --optimizer nag --momentum 0 --lr "$LSTM_LR" --lr-scheduler fixed --max-epoch 20 --weight-decay 0 --clip-norm 0.25
    --dropout 0.1 --awd-embed-dropout 0 --awd-weight-drop 0 --awd-ar-alpha 0 --awd-tar-beta 0
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 100
)
LSTM_ADAPTIVE=(--criterion adaptive_loss --ddp-backend legacy_ddp)

# fairseq's README.adaptive_inputs.md command (8 GPUs x --update-freq 3 x 3072 tokens per batch).
TRANSFORMER_COMMON=(
    --task language_modeling --criterion adaptive_loss --ddp-backend legacy_ddp
    --max-update 286000 --lr 1.0 --t-mult 2 --lr-period-updates 270000 --lr-scheduler cosine --lr-shrink 0.75
    --warmup-updates 16000 --warmup-init-lr 1e-07 --stop-min-lr 1e-09 --optimizer nag --min-lr 0.0001
    --clip-norm 0.1 --max-tokens 3072 --update-freq 3 --tokens-per-sample 3072 --seed 1
    --sample-break-mode none --skip-invalid-size-inputs-valid-test
    --no-epoch-checkpoints --log-format simple --log-interval 100
)

# Gated convolutional LMs. From the paper (Dauphin et al. 2017, section 4.3): Nesterov momentum 0.99
# (fairseq's nag), learning rate 1 (its random search drew it from [1, 2]), gradient norm clipped at 0.1, and
# weight normalisation (inside the gcnn_lm model); it mentions no dropout and no weight decay. It gives no batch
# size, sequence length, learning-rate schedule or epoch count; those are the values of fairseq's README.conv.md
# command for fconv_lm_dauphin_wikitext103: contiguous 1024-token blocks (--sample-break-mode none), one block
# (1024 tokens) per GPU per update, the learning rate halved whenever the validation loss does not improve,
# 35 epochs.
GCNN_COMMON=(
    --task language_modeling --sample-break-mode none --tokens-per-sample 1024 --max-tokens 1024
    --criterion adaptive_loss --ddp-backend legacy_ddp
    --optimizer nag --momentum 0.99 --lr 1.0 --clip-norm 0.1 --weight-decay 0
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --max-epoch 35
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 100
)
# fairseq's own GCNN-14, trained with README.conv.md's command as it is (nag's momentum is 0.99 by default; its
# --ddp-backend no_c10d is called legacy_ddp since fairseq 0.10): it adds dropout 0.2 and weight decay 5e-6.
FCONV_COMMON=(
    --task language_modeling --sample-break-mode none --tokens-per-sample 1024 --max-tokens 1024
    --adaptive-softmax-cutoff 10000,20000,200000 --dropout 0.2 --criterion adaptive_loss --ddp-backend legacy_ddp
    --optimizer nag --clip-norm 0.1 --weight-decay 5e-06
    --lr 1.0 --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --max-epoch 35
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 100
)

recipe_args() {
    case $1 in
        lstm_lm_standard_wt103) ARGS=(--arch "$1" "${LSTM_COMMON[@]}" --criterion cross_entropy) ;;
        lstm_lm_adaptive_wt103 | lstm_lm_define_wt103_n3 | lstm_lm_define_wt103_n7 | lstm_lm_define_wt103_n11)
            ARGS=(--arch "$1" "${LSTM_COMMON[@]}" "${LSTM_ADAPTIVE[@]}") ;;
        transformer_lm_wiki103 | transformer_lm_define_wiki103) ARGS=(--arch "$1" "${TRANSFORMER_COMMON[@]}") ;;
        gcnn_lm_8 | gcnn_lm_14) ARGS=(--arch "$1" "${GCNN_COMMON[@]}") ;;
        fconv_lm_dauphin_wikitext103)
            ARGS=(--arch "$1" "${FCONV_COMMON[@]}")
            # fairseq's fconv_lm keeps its settings as an argparse.Namespace in the checkpoint, which torch >= 2.6
            # refuses to load by default: resuming from checkpoint_last.pt needs the unrestricted loader. Only for
            # the checkpoints this recipe wrote itself.
            export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 ;;
        *) lib_unknown_config ;;
    esac
}
lib_train_recipe "$@"
