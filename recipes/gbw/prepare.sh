#!/usr/bin/env bash
# Download the One Billion Word benchmark (Google Billion Word, Chelba et al. 2013) and binarize it for fairseq.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# The benchmark's official release (1.8 GB), of no published checksum; GBW_URL and GBW_MD5 override them
# (lib_prepare_recipe). Its 99 training shards make train, two held-out shards valid and test.
CORPUS_URL=https://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz
CORPUS_MD5="" CORPUS_SIZE="1.8 GB" CORPUS_MEMBER_DIR=1-billion-word-language-modeling-benchmark-r13output
CORPUS_SPLITS=(train.txt valid.txt test.txt)
CORPUS_SPLIT_MEMBERS=(
    "$(printf 'training-monolingual.tokenized.shuffled/news.en-%05d-of-00100 ' {1..99})"
    heldout-monolingual.tokenized.shuffled/news.en.heldout-00001-of-00050
    heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050
)
# The paper replaces the words occurring fewer than 3 times by a special symbol.
CORPUS_PREPROCESS_ARGS=(--thresholdsrc 3)

usage() {
    lib_prepare_usage "$(cat <<TEXT
Download $CORPUS_ARCHIVE
(the benchmark's official release, $CORPUS_SIZE), check that it holds the 99 training shards and the held-out shards,
and make the three splits:
  train   training-monolingual.tokenized.shuffled/news.en-000{01..99}-of-00100, concatenated in that order
          (30,301,028 sentences)
  valid   heldout-monolingual.tokenized.shuffled/news.en.heldout-00001-of-00050 (a common choice: the paper
          does not say which validation set it used)
  test    heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050 (the benchmark's test set)
Then binarize them with 'fairseq-preprocess --only-source --thresholdsrc 3': the dictionary keeps the words seen
at least 3 times in train and the others become <unk>, as the paper replaces the words occurring fewer than 3
times by a special symbol. DATA_DIR (default: data/gbw) receives
  $CORPUS_ARCHIVE
                  the archive
  gbw/            train.txt, valid.txt, test.txt (4.2 GB of text)
  data-bin/       dict.txt, {train,valid,test}.{bin,idx}: what train.sh and eval.sh read (about 3.5 GB)
While unpacking it needs about 11 GB free in DATA_DIR (the archive, the unpacked shards and the concatenated
training text); about 10 GB stay.
TEXT
)"
}
lib_prepare_recipe "$@"
