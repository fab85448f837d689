#!/usr/bin/env bash
# Train the WMT14 En-De Transformer base baseline or transformer_define with fairseq (see README.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

# 8 x 4096 tokens an update, whatever the number of GPUs (OpenNMT-py's recommendation: 4 GPUs x 4096 x 2)
TOKENS_PER_GPU_BATCH=4096
BATCHES_PER_UPDATE=8

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-n] [-d DATA_DIR] [-s SAVE_ROOT] [-g GPUS] [-p fp16|bf16|fp32] CONFIG [fairseq-train arguments...]

Train CONFIG on DATA_DIR/data-bin (made by prepare.sh) and write the checkpoints to SAVE_ROOT/CONFIG
(checkpoint_best.pt, checkpoint_last.pt, checkpoint_<epoch>_<updates>.pt every 2000 updates, the last 10 kept
for average.sh, and train.log). Arguments after CONFIG are appended to the fairseq-train command and win over
the recipe's (e.g. --max-update 1000).

CONFIG:
  transformer_wmt_en_de   fairseq's Transformer base (6+6 layers, d 512, FFN 2048, 8 heads), embeddings shared
                          between encoder, decoder and output (--share-all-embeddings): the paper's baseline.
                          Its checkpoints need TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 to load, which this script (for
                          resuming) and eval.sh set for it
  transformer_define      the same Transformer with DeFINE embeddings (n 128, k 1024, N 3, m 512), the table and
                          the DeFINE unit shared, the output tied to the V x 128 table through a 512 -> 128
                          projection: the paper's "Transformer + DeFINE"

Options:
  -g GPUS       GPUs to train on (default: the number visible); the update frequency is 8 / GPUS, so every
                update sees 8 batches of 4096 tokens (GPUS must divide 8, or give --update-freq yourself)
  -p PRECISION  fp16 (default: fairseq's mixed precision with loss scaling), bf16 (bfloat16, which fairseq-train
                itself cannot do off TPUs: see README.md), or fp32
  -n            print the training command and exit
  -d DATA_DIR   data directory of prepare.sh (default: \$DATA_DIR or data/wmt14-en-de)
  -s SAVE_ROOT  checkpoint root (default: \$SAVE_ROOT or checkpoints/wmt14-en-de)
  -h            this help

A finished training is skipped on a rerun (SAVE_ROOT/CONFIG/.done/train); an interrupted one resumes from
checkpoint_last.pt. For a run on the CPU (a test): -g 1 -p fp32 CONFIG --cpu ...
USAGE
}

DATA_DIR=${DATA_DIR:-data/wmt14-en-de}
SAVE_ROOT=${SAVE_ROOT:-checkpoints/wmt14-en-de}
DRY_RUN=0
GPUS=""
PRECISION=fp16
recipe_option() {
    case $1 in
        g) GPUS=$2 ;;
        p) PRECISION=$2 ;;
        *) return 1 ;;
    esac
}
lib_parse_options hnd:s:g:p: CONFIG "$@"
shift "$LIB_SHIFT"
CONFIG=$1
shift

case $CONFIG in
    transformer_wmt_en_de | transformer_define) ;;
    *) usage >&2; die "unknown CONFIG '$CONFIG' (transformer_wmt_en_de or transformer_define)" ;;
esac
[[ -n $GPUS ]] || GPUS=$(lib_gpu_count "-g 1 -p fp32 $CONFIG --cpu")
[[ $GPUS =~ ^[1-9][0-9]*$ ]] || die "-g $GPUS: give the number of GPUs as a positive whole number"
USER_UPDATE_FREQ=0
for arg in "$@"; do [[ $arg == --update-freq || $arg == --update-freq=* ]] && USER_UPDATE_FREQ=1; done
(( BATCHES_PER_UPDATE % GPUS == 0 || USER_UPDATE_FREQ )) || die "-g $GPUS does not divide $BATCHES_PER_UPDATE: the" \
    "update frequency $BATCHES_PER_UPDATE / $GPUS is not whole. Use 1, 2, 4 or 8 GPUs, or append --update-freq N" \
    "(each update then sees GPUS x N x $TOKENS_PER_GPU_BATCH tokens instead of" \
    "$((BATCHES_PER_UPDATE * TOKENS_PER_GPU_BATCH)))."
UPDATE_FREQ=$(( BATCHES_PER_UPDATE % GPUS == 0 ? BATCHES_PER_UPDATE / GPUS : 1 ))  # replaced by the user's then
case $PRECISION in
    fp16) PRECISION_ARGS=(--fp16) ;;
    bf16) PRECISION_ARGS=(--bf16) ;;
    fp32) PRECISION_ARGS=() ;;
    *) die "-p $PRECISION: give fp16, bf16 or fp32" ;;
esac

# The paper trained with OpenNMT-py's recommended Transformer-base settings (Sec. 4.2; it gives no values). They are,
# from OpenNMT-py's FAQ: Adam with beta2 0.998, the "noam" schedule with learning rate 2 and 8000 warm-up steps,
# batches of 4096 tokens accumulated twice on 4 GPUs, no gradient clipping, dropout 0.1, label smoothing 0.1,
# Glorot initialisation, 200k steps. In fairseq: the inverse square-root schedule from 0, peaking at
# 2 / sqrt(512 * 8000) = 0.000988 after 8000 updates, is noam's learning rate exactly; Adam's eps is OpenNMT-py's
# default 1e-9; fairseq's Transformer is already Glorot-initialised. --share-all-embeddings (one joint dictionary)
# is our choice: the FAQ command does not share, and the paper does not say.
ARGS=(
    --arch "$CONFIG" --share-all-embeddings
    --task translation --source-lang en --target-lang de
    --optimizer adam --adam-betas "(0.9, 0.998)" --adam-eps 1e-09 --clip-norm 0.0 --weight-decay 0.0
    --lr 0.000988 --lr-scheduler inverse_sqrt --warmup-updates 8000 --warmup-init-lr 0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1
    --max-tokens "$TOKENS_PER_GPU_BATCH" --update-freq "$UPDATE_FREQ" --distributed-world-size "$GPUS"
    --max-update 200000
    --save-interval-updates 2000 --keep-interval-updates 10 --no-epoch-checkpoints
    --seed 1 --log-format simple --log-interval 100
    "${PRECISION_ARGS[@]+"${PRECISION_ARGS[@]}"}"
)
if [[ $CONFIG == transformer_wmt_en_de ]]; then
    # fairseq's own Transformer keeps its settings as an argparse.Namespace in the checkpoint, which torch >= 2.6
    # refuses to load by default: resuming from checkpoint_last.pt needs the unrestricted loader. Only for the
    # checkpoints this recipe wrote itself.
    export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
fi

lib_train "$DRY_RUN" "$DATA_DIR/data-bin" "$SAVE_ROOT/$CONFIG" "${ARGS[@]}" "$@"
