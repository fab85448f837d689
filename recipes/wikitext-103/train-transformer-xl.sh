#!/usr/bin/env bash
# Train the DeFINE paper's Transformer-XL models on WikiText-103 (Table 2) with fairseq-train (see README.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

STREAMS=60  # Transformer-XL's batch: 60 streams over the paper's 4 GPUs
GPUS=""
RECIPE_OPTIONS=g:
recipe_option() { [[ $1 == g ]] && GPUS=$2; }
TRAIN_OPTIONS="[-g GPUS]
  -g GPUS       GPUs to train on (default: the number visible); the $STREAMS streams are split over them
                (--batch-size $STREAMS/GPUS, so GPUS must divide $STREAMS)"
usage() {
    lib_train_usage WikiText-103 "$(cat <<CONFIGS
CONFIG (the --arch of the same name; Table 2 of the DeFINE paper, trained with Transformer-XL's published
WikiText-103 settings; 16 layers, 10 heads x 41, projected adaptive softmax with cutoffs 20000,40000,200000 tied
to the input table):
  transformer_xl_wt103                   the Transformer-XL reference: d 410, d_inner 2100, standard V x 410 input
  transformer_xl_wt103_d384              standard, d 384, d_inner 1920
  transformer_xl_projective_wt103_nN     d 384 with a V x N table projected to 384 (N = 256, 128, 64)
  transformer_xl_define_wt103_nN         d 384 with DeFINE on a V x N table (N = 384, 256, 128, 64; DeFINE N = 3,
                                         k = 4096, m = 384)
CONFIGS
)" "A resumed run goes on exactly: the checkpoint holds the memory carried from batch to batch.
eval.sh CONFIG then scores valid and test with Transformer-XL's evaluation settings."
}

recipe_args() {
    case $1 in
        transformer_xl_wt103 | transformer_xl_wt103_d384 | transformer_xl_projective_wt103_n256 \
            | transformer_xl_projective_wt103_n128 | transformer_xl_projective_wt103_n64 \
            | transformer_xl_define_wt103_n384 | transformer_xl_define_wt103_n256 | transformer_xl_define_wt103_n128 \
            | transformer_xl_define_wt103_n64) ;;
        *) lib_unknown_config ;;
    esac
    [[ -n $GPUS ]] || GPUS=$(lib_gpu_count "-g 1 $1 --cpu")
    [[ $GPUS =~ ^[1-9][0-9]*$ ]] || die "-g $GPUS: give the number of GPUs as a positive whole number"
    (( STREAMS % GPUS == 0 )) || die "-g $GPUS does not divide the $STREAMS streams; use 1, 2, 3, 4, 5, 6, 10, 12, 15," \
        "20, 30 or 60 GPUs, or append --batch-size N (N streams per GPU)"

    # Transformer-XL's WikiText-103 base command (its run_wt103_base.sh, as fairseq's examples/truncated_bptt also runs
    # it): Adam (betas 0.9, 0.999) with lr 2.5e-4 annealed to 0 by a cosine over 200k steps without warm-up, gradient
    # norm clipped at 0.25, dropout 0.1, no attention dropout, segments (tgt_len) of 150 with a memory of 150, batch 60,
    # post-norm; evaluated every 4000 steps. The DeFINE paper trains every Table 2 row "as recommended by the authors"
    # of Transformer-XL and gives no other value. The state carried across batches needs the stateful task (contiguous
    # streams, memory reset at each epoch and evaluation pass); lm_regularized_loss scores every target word of the
    # adaptive softmax. --batch-size-valid is per GPU: validation (which picks checkpoint_best.pt) runs 10 streams on
    # each GPU; eval.sh scores with 10 streams in all.
    ARGS=(
        --arch "$1" --task stateful_lm --tokens-per-sample 150 --txl-mem-len 150
        --batch-size $((STREAMS / GPUS)) --batch-size-valid 10 --distributed-world-size "$GPUS"
        --criterion lm_regularized_loss --ddp-backend legacy_ddp
        --optimizer adam --adam-betas "(0.9, 0.999)" --adam-eps 1e-08 --weight-decay 0.0 --clip-norm 0.25
        --lr 0.00025 --lr-scheduler cosine --min-lr 0.0 --warmup-updates 0 --max-update 200000
        --dropout 0.1 --attention-dropout 0.0
        --validate-interval-updates 4000 --save-interval-updates 4000 --keep-interval-updates 1 --no-epoch-checkpoints
        --seed 1111 --log-format simple --log-interval 200
    )
}
lib_train_recipe "$@"
