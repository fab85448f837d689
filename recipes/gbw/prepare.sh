#!/usr/bin/env bash
# Download the One Billion Word benchmark (Google Billion Word, Chelba et al. 2013) and binarize it for fairseq.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [DATA_DIR]

Download $GBW_ARCHIVE
(the benchmark's official release, 1.8 GB), check that it holds the 99 training shards and the held-out shards,
and make the three splits:
  train   training-monolingual.tokenized.shuffled/news.en-000{01..99}-of-00100, concatenated in that order
          (30,301,028 sentences)
  valid   heldout-monolingual.tokenized.shuffled/news.en.heldout-00001-of-00050 (a common choice: the paper
          does not say which validation set it used)
  test    heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050 (the benchmark's test set)
Then binarize them with 'fairseq-preprocess --only-source --thresholdsrc 3': the dictionary keeps the words seen
at least 3 times in train and the others become <unk>, as the paper replaces the words occurring fewer than 3
times by a special symbol. DATA_DIR (default: data/gbw) receives
  $GBW_ARCHIVE
                  the archive
  gbw/            train.txt, valid.txt, test.txt (4.2 GB of text)
  data-bin/       dict.txt, {train,valid,test}.{bin,idx}: what train.sh and eval.sh read (about 3.5 GB)
While unpacking it needs about 11 GB free in DATA_DIR (the archive, the unpacked shards and the concatenated
training text); about 10 GB stay. Finished steps are skipped on a rerun (markers in DATA_DIR/.done/).

Environment:
  GBW_URL             where to download from (default: $GBW_DEFAULT_URL);
                      an http(s):// or file:// URL, or a local path
  GBW_MD5             expected MD5 of the archive (default: empty, no check: no published checksum is known to
                      this recipe)
  PREPROCESS_WORKERS  fairseq-preprocess workers (default: the number of cores, at most 20)
USAGE
}

GBW_ARCHIVE=1-billion-word-language-modeling-benchmark-r13output.tar.gz
GBW_DEFAULT_URL=https://www.statmt.org/lm-benchmark/$GBW_ARCHIVE

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ ${1:-} == -* ]] && { usage >&2; die "unknown option $1"; }
(( $# <= 1 )) || { usage >&2; die "too many arguments"; }

CORPUS_ARCHIVE=$GBW_ARCHIVE
CORPUS_URL=${GBW_URL:-$GBW_DEFAULT_URL}
CORPUS_URL_VAR=GBW_URL
CORPUS_MD5=${GBW_MD5:-}
CORPUS_MD5_VAR=GBW_MD5
CORPUS_MEMBER_DIR=1-billion-word-language-modeling-benchmark-r13output
CORPUS_SPLITS=(train.txt valid.txt test.txt)
CORPUS_TEXT_DIR=gbw
CORPUS_SPLIT_MEMBERS=(
    "$(printf 'training-monolingual.tokenized.shuffled/news.en-%05d-of-00100 ' {1..99})"
    heldout-monolingual.tokenized.shuffled/news.en.heldout-00001-of-00050
    heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050
)
CORPUS_PREPROCESS_ARGS=(--thresholdsrc 3)
lib_prepare_corpus "${1:-data/gbw}"
