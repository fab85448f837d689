#!/usr/bin/env bash
# Download Mikolov's pre-processed Penn Treebank (simple-examples.tgz, Mikolov et al. 2010) and binarize it for
# fairseq.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# The archive (34 MB), of no published checksum; PTB_URL and PTB_MD5 override them (lib_prepare_recipe).
CORPUS_URL=http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz CORPUS_MD5=""
CORPUS_SIZE="34 MB" CORPUS_MEMBER_DIR=simple-examples/data CORPUS_SPLITS=(ptb.train.txt ptb.valid.txt ptb.test.txt)
lib_prepare_recipe "$@"
