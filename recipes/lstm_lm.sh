# shellcheck shell=bash disable=SC2034
# The train.sh and eval.sh of the PTB and WikiText-2 recipes (sourced, not run; it sources lib.sh): both train and
# evaluate AWD-LSTM and the Mogrifier LSTM the same way and differ only in the corpus, its settings (which the
# recipe's script gives) and the names of its Mogrifier configs (mogrifier_lstm_lm_SUFFIX and
# mogrifier_lstm_lm_baseline_SUFFIX).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# AWD-LSTM's command (awd-lstm-lm README; the recipe's AWD_SETTINGS give its streams, epochs, input and
# between-layer dropouts and seed): SGD lr 30, gradient norm clipped at 0.25, weight decay 1.2e-6, BPTT 70 with its
# variable length, 10 streams for validation, output dropout 0.4, embedding (word) dropout 0.1, weight drop 0.5,
# AR 2, TAR 1. fairseq has no NT-ASGD: plain SGD, the lr divided by 10 after 5 epochs without a better validation
# loss (AWD-LSTM's non-monotone interval is 5 epochs too).
# Plain SGD is fairseq's `nag` optimizer with --momentum 0: its update is then exactly SGD's,
# p <- p * (1 - lr * weight_decay) - lr * grad. fairseq's own `sgd` would store its settings in the checkpoint as
# an argparse.Namespace, which torch >= 2.6 refuses to unpickle by default, so neither a resumed training nor
# fairseq-eval-lm could load the checkpoint.
LSTM_AWD=(
    --task stateful_lm --tokens-per-sample 70 --variable-bptt --batch-size-valid 10
    --criterion lm_regularized_loss
    --optimizer nag --momentum 0 --lr 30 --clip-norm 0.25 --weight-decay 1.2e-6
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.1 --lr-patience 5
    --awd-output-dropout 0.4 --awd-embed-dropout 0.1 --awd-weight-drop 0.5 --awd-ar-alpha 2 --awd-tar-beta 1
    --no-epoch-checkpoints --log-format simple --log-interval 200
)

# The Mogrifier LSTM and its LSTM baseline as the official code (DeepMind's lamb) trains its tuned configs (the
# recipe's MOGRIFIER_SETTINGS and BASELINE_SETTINGS give the learning rate and L2 penalty of their best trials):
# 64 streams, BPTT 70, state carried across batches (each stream's reset with probability 0.01: the archs'
# --mogrifier-drop-state-probability), Adam with beta1 = 0 (lamb's "rmsprop"), eps 1e-8, constant learning rate,
# gradient norm clipped at 10, 1000 turns of 200 steps = 200k updates, seed 1. lamb's objective is the
# cross-entropy summed over the 70 steps and averaged over the streams, plus l2_penalty / 2 * sum(theta^2) over all
# parameters: --sentence-avg gives that normalisation (so the clipping threshold and eps act on the same gradient
# as lamb's), and --mogrifier-l2-penalty adds the L2 term through lm_regularized_loss. fairseq's --weight-decay is
# not the same thing (in fairseq's Adam it is decoupled: p <- p - lr * wd * p after the Adam step, never seen by
# the clipping or the second-moment estimate); it stays 0.
LSTM_LAMB=(
    --task stateful_lm --tokens-per-sample 70 --batch-size 64 --batch-size-valid 64
    --criterion lm_regularized_loss --sentence-avg
    --optimizer adam --adam-betas "(0, 0.999)" --adam-eps 1e-08 --weight-decay 0 --clip-norm 10
    --lr-scheduler fixed --max-update 200000
    --seed 1 --no-epoch-checkpoints --log-format simple --log-interval 200
)

# lstm_train CORPUS SUFFIX ARGS... : run train.sh with the command line ARGS (lib_train_recipe's) on CORPUS (its
# name in words). The recipe sets AWD_SETTINGS, MOGRIFIER_SETTINGS and BASELINE_SETTINGS (fairseq-train arguments),
# AWD_SOURCE (where AWD-LSTM's settings come from) and MOGRIFIER_HELP (the usage's lines of the Mogrifier configs).
lstm_train() {
    local corpus=$1 suffix=$2
    shift 2
    usage() {
        lib_train_usage "$corpus" "CONFIG:
  awd_lstm_lm                     AWD-LSTM: 3 layers (1150, 1150, 400), 400-d embedding tied to the softmax
                                  ($AWD_SOURCE)
  awd_lstm_lm_define              the same with DeFINE (n=128, k=1024, N=7, m=400); last layer 128, tied to
                                  the V x 128 map
$MOGRIFIER_HELP" "One GPU (CUDA_VISIBLE_DEVICES=0): the batch is --batch-size streams per GPU."
    }
    recipe_args() {
        case $1 in
            awd_lstm_lm | awd_lstm_lm_define) ARGS=(--arch "$1" "${LSTM_AWD[@]}" "${AWD_SETTINGS[@]}") ;;
            "mogrifier_lstm_lm_$suffix") ARGS=(--arch "$1" "${LSTM_LAMB[@]}" "${MOGRIFIER_SETTINGS[@]}") ;;
            "mogrifier_lstm_lm_baseline_$suffix") ARGS=(--arch "$1" "${LSTM_LAMB[@]}" "${BASELINE_SETTINGS[@]}") ;;
            *) lib_unknown_config ;;
        esac
    }
    lib_train_recipe "$@"
}

# lstm_eval SUFFIX ARGS... : run eval.sh with the command line ARGS (lib_eval_recipe's).
lstm_eval() {
    TEMPERATURE_CONFIGS="mogrifier_lstm_lm_$1 mogrifier_lstm_lm_baseline_$1"
    CONFIGS="awd_lstm_lm awd_lstm_lm_define $TEMPERATURE_CONFIGS"
    shift
    usage() {
        lib_eval_usage "$RECIPE" "$CONFIGS" "$(cat <<HOW
As AWD-LSTM evaluates: --task stateful_lm, BPTT 70, the state carried through the whole split, valid with 10
parallel streams, test with 1.

For the Mogrifier configs (${TEMPERATURE_CONFIGS// /, }) the perplexities are given twice: as they are
(softmax temperature T = 1), and as the Mogrifier paper reports them, with the softmax temperature T tuned on the
valid split (the lowest valid perplexity) and then applied to test; written to <checkpoint>.eval.temperature.txt
(logs <checkpoint>.eval.temperature.<split>.T<T>.log). T divides the logits (--model-overrides
"{'mogrifier_softmax_temperature': T}"). The grid is the official code's: it multiplies the logits by
t = 1.06, 1.04, ..., 0.80, i.e. T = 1/t from 0.9434 to 1.2500; TEMPERATURES="T1 T2 ..." sets another grid.
HOW
)"
    }
    recipe_specs() {
        SPECS=("valid|stateful, BPTT 70, 10 streams|--task stateful_lm --tokens-per-sample 70 --batch-size 10"
               "test|stateful, BPTT 70, 1 stream|--task stateful_lm --tokens-per-sample 70 --batch-size 1")
        [[ " $TEMPERATURE_CONFIGS " != *" $1 "* ]] || EVAL_TEMPERATURE=1
    }
    lib_eval_recipe "$@"
}
