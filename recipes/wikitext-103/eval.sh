#!/usr/bin/env bash
# Perplexity of a WikiText-103 model of this recipe on the valid and test splits (fairseq-eval-lm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

CONFIGS="lstm_lm_standard_wt103 lstm_lm_adaptive_wt103 lstm_lm_define_wt103_n3 lstm_lm_define_wt103_n7"
CONFIGS+=" lstm_lm_define_wt103_n11 transformer_lm_wiki103 transformer_lm_define_wiki103 gcnn_lm_8 gcnn_lm_14"
CONFIGS+=" fconv_lm_dauphin_wikitext103 transformer_xl_wt103 transformer_xl_wt103_d384"
CONFIGS+=" transformer_xl_projective_wt103_n256 transformer_xl_projective_wt103_n128 transformer_xl_projective_wt103_n64"
CONFIGS+=" transformer_xl_define_wt103_n384 transformer_xl_define_wt103_n256 transformer_xl_define_wt103_n128"
CONFIGS+=" transformer_xl_define_wt103_n64"

usage() {
    lib_eval_usage wikitext-103 "$CONFIGS" "$(cat <<HOW
How each CONFIG is evaluated:
  lstm_lm_*    --task stateful_lm, BPTT 140, the state carried through the whole split: valid with 10 parallel
               streams, test with 1 (Merity et al.'s evaluation; the paper does not say which it used)
  transformer_lm_wiki103, transformer_lm_define_wiki103
               --task language_modeling as fairseq's adaptive-input README: complete sentences, blocks of 3072
               tokens of which the last 512 are scored with a 2560-token context, 3072 tokens a batch
  transformer_xl_*
               --task stateful_lm as Transformer-XL evaluates: segments of 64 tokens of 10 streams, the memory of 640
               states carried through the split, clamp_len 400, same_length (--model-overrides)
  gcnn_lm_8, gcnn_lm_14, fconv_lm_dauphin_wikitext103
               --task language_modeling, the split as one stream cut into rows of 960 scored tokens, each row
               preceded by the 64 tokens before it as context (--tokens-per-sample 1024 --context-window 64).
               The models see at most 47 tokens (their receptive field), so every token gets its full context:
               the perplexity of the whole split scored as one sequence (the paper started each paragraph or
               article from zero padding instead; see README.md). Stops if fairseq skips any row. For
               fconv_lm_dauphin_wikitext103 it sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: fairseq's fconv_lm
               checkpoints hold an argparse.Namespace, which torch >= 2.6 does not load otherwise (use it only on
               checkpoints you trust).
HOW
)"
}

recipe_specs() {
    case $1 in
        gcnn_lm_8 | gcnn_lm_14 | fconv_lm_dauphin_wikitext103)
            # fairseq-eval-lm's --context-window C cuts rows of --tokens-per-sample minus C new tokens and puts the C
            # tokens before each row in front of it as context (scored once, in order). C = 64 covers the receptive
            # field of every one of these models (47 tokens at most, GCNN-14), so each token is scored exactly as in
            # one pass over the whole split; 4 rows a batch, the log-probabilities of 1024 tokens at a time.
            CONV="--task language_modeling --sample-break-mode none --tokens-per-sample 1024 --context-window 64"
            CONV+=" --max-tokens 4096 --softmax-batch 1024"
            SPECS=("valid|one stream, rows of 960 tokens after a 64-token context|$CONV"
                   "test|one stream, rows of 960 tokens after a 64-token context|$CONV")
            EVAL_FORBID_SKIPPED=1
            if [[ $1 == fconv_lm_* ]]; then
                # fconv_lm's checkpoints hold an argparse.Namespace, which torch >= 2.6 refuses to load by default; the
                # unrestricted loader is for checkpoints you trust (e.g. those of train.sh)
                export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
            fi ;;
        transformer_xl_*)
            # Transformer-XL's evaluation (its run_wt103_base.sh eval): segments of 64 with a memory of 640 states,
            # relative distances clamped at 400, every position attending to the same number of states, batch 10
            TXL="--task stateful_lm --tokens-per-sample 64 --batch-size 10"
            TXL+=" --model-overrides {'txl_mem_len':640,'txl_clamp_len':400,'txl_same_length':True}"
            SPECS=("valid|stateful, segments of 64, memory 640, clamp_len 400, same_length, 10 streams|$TXL"
                   "test|stateful, segments of 64, memory 640, clamp_len 400, same_length, 10 streams|$TXL") ;;
        lstm_lm_*)
            SPECS=("valid|stateful, BPTT 140, 10 streams|--task stateful_lm --tokens-per-sample 140 --batch-size 10"
                   "test|stateful, BPTT 140, 1 stream|--task stateful_lm --tokens-per-sample 140 --batch-size 1") ;;
        *)
            LM="--task language_modeling --sample-break-mode complete --tokens-per-sample 3072 --max-tokens 3072"
            LM+=" --context-window 2560 --softmax-batch 1024"
            SPECS=("valid|blocks of 3072, context 2560|$LM" "test|blocks of 3072, context 2560|$LM") ;;
    esac
}
lib_eval_recipe "$@"
