#!/usr/bin/env bash
# The English-German corpora beside the demo's, from Debian packages: the Ding dictionary's example sentences and
# LibreOffice's help (scripts.package_corpus). Downloaded and unpacked, not installed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
usage() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT]

Downloads the Debian packages trans-de-en, libreoffice-help-en-us and libreoffice-help-de (apt-get download; run
'apt-get update' once first), unpacks them under OUT/packages (dpkg-deb -x) and writes OUT/ding and
OUT/libreoffice-help, each {train,valid,test}.{en,de}, for examples/translation/compare.sh -c. OUT defaults to
translation_corpora. OUT/packages/versions.txt names the package versions read. A rerun skips what is done.
EOF
}
debian_corpus_options translation_corpora "$@"

debian_packages "$OUT/packages" trans-de-en libreoffice-help-en-us libreoffice-help-de
root=$OUT/packages/root
for source in ding libreoffice-help; do
    [[ -d $OUT/$source ]] && continue
    rm -rf "$OUT/$source.tmp"
    python -m scripts.package_corpus "$source" "$OUT/$source.tmp" \
        --dictionary "$root/usr/share/trans/de-en" --help-dir "$root/usr/share/libreoffice/help"
    mv "$OUT/$source.tmp" "$OUT/$source"
done
cat "$OUT/packages/versions.txt"
