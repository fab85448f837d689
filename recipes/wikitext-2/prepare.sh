#!/usr/bin/env bash
# Download WikiText-2 (Merity et al. 2017, the tokenized "v1" release) and binarize it for fairseq.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [DATA_DIR]

Download wikitext-2-v1.zip, check that it holds wikitext-2/wiki.{train,valid,test}.tokens, and binarize the
three files with 'fairseq-preprocess --only-source'. DATA_DIR (default: data/wikitext-2) receives
  wikitext-2-v1.zip          the archive (4.3 MB)
  wikitext-2/                wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens
  data-bin/                  dict.txt, {train,valid,test}.{bin,idx}: what train.sh and eval.sh read
Finished steps are skipped on a rerun (markers in DATA_DIR/.done/).

Environment:
  WIKITEXT2_URL       where to download from (default: $WT2_DEFAULT_URL);
                      an http(s):// or file:// URL, or a local path
  WIKITEXT2_MD5       expected MD5 of the archive (default: $WT2_DEFAULT_MD5, the original release);
                      set it to an empty string to skip the check
  PREPROCESS_WORKERS  fairseq-preprocess workers (default: the number of cores, at most 20)
USAGE
}

WT2_DEFAULT_URL=https://wikitext.smerity.com/wikitext-2-v1.zip
WT2_DEFAULT_MD5=542ccefacc6c27f945fb54453812b3cd

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ ${1:-} == -* ]] && { usage >&2; die "unknown option $1"; }
(( $# <= 1 )) || { usage >&2; die "too many arguments"; }

CORPUS_ARCHIVE=wikitext-2-v1.zip
CORPUS_URL=${WIKITEXT2_URL:-$WT2_DEFAULT_URL}
CORPUS_URL_VAR=WIKITEXT2_URL
CORPUS_MD5=${WIKITEXT2_MD5-$WT2_DEFAULT_MD5}
CORPUS_MD5_VAR=WIKITEXT2_MD5
CORPUS_MEMBER_DIR=wikitext-2
CORPUS_SPLITS=(wiki.train.tokens wiki.valid.tokens wiki.test.tokens)
CORPUS_TEXT_DIR=wikitext-2
lib_prepare_corpus "${1:-data/wikitext-2}"
