#!/usr/bin/env bash
# Download WikiText-103 (Merity et al. 2017, the tokenized "v1" release) and binarize it for fairseq.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# The release's archive (181 MB) and its MD5; WIKITEXT103_URL and WIKITEXT103_MD5 override them (lib_prepare_recipe).
CORPUS_URL=https://wikitext.smerity.com/wikitext-103-v1.zip CORPUS_MD5=9ddaacaf6af0710eda8c456decff7832
CORPUS_SIZE="181 MB" CORPUS_MEMBER_DIR=wikitext-103 CORPUS_SPLITS=(wiki.train.tokens wiki.valid.tokens wiki.test.tokens)
lib_prepare_recipe "$@"
