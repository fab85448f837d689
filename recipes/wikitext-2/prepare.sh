#!/usr/bin/env bash
# Download WikiText-2 (Merity et al. 2017, the tokenized "v1" release) and binarize it for fairseq.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# The release's archive (4.3 MB) and its MD5; WIKITEXT2_URL and WIKITEXT2_MD5 override them (lib_prepare_recipe).
CORPUS_URL=https://wikitext.smerity.com/wikitext-2-v1.zip CORPUS_MD5=542ccefacc6c27f945fb54453812b3cd
CORPUS_SIZE="4.3 MB" CORPUS_MEMBER_DIR=wikitext-2 CORPUS_SPLITS=(wiki.train.tokens wiki.valid.tokens wiki.test.tokens)
lib_prepare_recipe "$@"
