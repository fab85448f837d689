#!/usr/bin/env bash
# An English language-modelling corpus from the HTML manuals of Debian packages (scripts.doc_corpus):
# Python's, PostgreSQL's, Git's and the Debian Administrator's Handbook. Downloaded and unpacked, not installed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PACKAGES="python3.11-doc postgresql-doc-15 git-doc debian-handbook"
usage() {
    cat <<EOF2
Usage: $(basename "$0") [-o OUT]

Downloads the Debian packages $PACKAGES (apt-get download; run
'apt-get update' once first), unpacks them under OUT/packages (dpkg-deb -x) and writes OUT/docs/{train,valid,test}.txt
(one paragraph a line, tokenised; about 2.7M training tokens) for the language-model comparisons' -c. OUT defaults to
lm_corpora. OUT/packages/versions.txt names the package versions read. A rerun skips what is done.
EOF2
}
debian_corpus_options lm_corpora "$@"

# shellcheck disable=SC2086
debian_packages "$OUT/packages" $PACKAGES
if [[ ! -d $OUT/docs ]]; then
    rm -rf "$OUT/docs.tmp"
    python -m scripts.doc_corpus "$OUT/packages/root" "$OUT/docs.tmp"
    mv "$OUT/docs.tmp" "$OUT/docs"
fi
cat "$OUT/packages/versions.txt"
