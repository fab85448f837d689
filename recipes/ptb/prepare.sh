#!/usr/bin/env bash
# Download Mikolov's pre-processed Penn Treebank (simple-examples.tgz) and binarize it for fairseq.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [DATA_DIR]

Download simple-examples.tgz (Mikolov et al. 2010), check that it holds simple-examples/data/ptb.{train,valid,
test}.txt, keep those three files and binarize them with 'fairseq-preprocess --only-source'. DATA_DIR
(default: data/ptb) receives
  simple-examples.tgz        the archive (34 MB)
  ptb/                       ptb.train.txt, ptb.valid.txt, ptb.test.txt
  data-bin/                  dict.txt, {train,valid,test}.{bin,idx}: what train.sh and eval.sh read
Finished steps are skipped on a rerun (markers in DATA_DIR/.done/).

Environment:
  PTB_URL             where to download from (default: $PTB_DEFAULT_URL);
                      an http(s):// or file:// URL, or a local path
  PTB_MD5             expected MD5 of the archive (default: empty, no check: no published checksum is known
                      to this recipe)
  PREPROCESS_WORKERS  fairseq-preprocess workers (default: the number of cores, at most 20)
USAGE
}

PTB_DEFAULT_URL=http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ ${1:-} == -* ]] && { usage >&2; die "unknown option $1"; }
(( $# <= 1 )) || { usage >&2; die "too many arguments"; }

CORPUS_ARCHIVE=simple-examples.tgz
CORPUS_URL=${PTB_URL:-$PTB_DEFAULT_URL}
CORPUS_URL_VAR=PTB_URL
CORPUS_MD5=${PTB_MD5:-}
CORPUS_MD5_VAR=PTB_MD5
CORPUS_MEMBER_DIR=simple-examples/data
CORPUS_SPLITS=(ptb.train.txt ptb.valid.txt ptb.test.txt)
CORPUS_TEXT_DIR=ptb
lib_prepare_corpus "${1:-data/ptb}"
