# shellcheck shell=bash
# The recipes' data helpers: download, unpack and prepare a corpus (sourced by recipes/lib.sh, not run).

# ---------------------------------------------------------------------------------------- download and unpack

# lib_md5 FILE: print FILE's MD5 digest.
lib_md5() {
    if command -v md5sum >/dev/null 2>&1; then
        md5sum "$1" | cut -d' ' -f1
    elif command -v md5 >/dev/null 2>&1; then
        md5 -q "$1"
    else
        python3 -c 'import hashlib,sys; print(hashlib.md5(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

# lib_download URL DEST MD5 URL_VAR MD5_VAR: fetch URL (http(s)://, ftp://, file:// or a local path) into DEST
# through DEST.part; when MD5 is not empty the file must have that digest. URL_VAR and MD5_VAR name the
# environment variables that override URL and MD5, for the error messages.
lib_download() {
    local url=$1 dest=$2 md5=$3 url_var=$4 md5_var=$5
    local part="$dest.part" errfile="$dest.part.err" what
    what=$(basename "$dest")
    lib_tmp "$part"
    lib_tmp "$errfile"
    rm -f -- "$part"
    local hint="Check the network connection, or set $url_var to a reachable copy of $what (an http(s):// or"
    hint+=" file:// URL, or a local path)."
    case $url in
        *://*)
            if command -v curl >/dev/null 2>&1; then
                local status=0 reason
                if [[ -t 2 ]]; then  # a terminal: show curl's progress bar and messages as they come
                    curl -fL --retry 2 --connect-timeout 30 --progress-bar -o "$part" "$url" || status=$?
                    reason="curl exit code $status, message above"
                else
                    curl -fL --retry 2 --connect-timeout 30 -sS -o "$part" "$url" 2> "$errfile" || status=$?
                    reason=$(grep -v '^[[:space:]]*$' "$errfile" | tail -n 1 | tr -d '\r') || true
                fi
                (( status == 0 )) || die "download of $url failed: ${reason:-curl exit code $status}. $hint"
            elif command -v wget >/dev/null 2>&1; then
                wget -q --tries 3 --timeout 30 -O "$part" "$url" 2> "$errfile" \
                    || die "download of $url failed (wget exit code $?: $(tail -n 1 "$errfile")). $hint"
            else
                die "neither curl nor wget is installed; install one, or download $url yourself and set $url_var" \
                    "to the local file"
            fi
            ;;
        *)
            [[ -f $url ]] || die "$url_var=$url is neither a URL nor an existing file. $hint"
            cp -- "$url" "$part" || die "cannot copy $url"
            ;;
    esac
    [[ -s $part ]] || die "the download of $url is empty. $hint"
    if [[ -n $md5 ]]; then
        local got
        got=$(lib_md5 "$part")
        [[ $got == "$md5" ]] || die "checksum mismatch for $url: MD5 $got, expected $md5. The file is truncated," \
            "damaged or another version; nothing was kept. To use a different file on purpose, set $md5_var to its" \
            "MD5 (or to an empty string to skip the check)."
    else
        log "no checksum to verify for $what ($md5_var is empty)"
    fi
    mv -f -- "$part" "$dest"
}

# lib_unpack ARCHIVE DIR: unpack a .zip, .tgz/.tar.gz or .tar into the new directory DIR.
lib_unpack() {
    local archive=$1 dir=$2 errfile="$2.err"
    lib_tmp "$errfile"
    rm -rf -- "$dir"
    mkdir -p "$dir"
    case $archive in
        *.zip)
            if command -v unzip >/dev/null 2>&1; then
                unzip -q -o "$archive" -d "$dir" > "$errfile" 2>&1
            else
                python3 -m zipfile -e "$archive" "$dir" > "$errfile" 2>&1
            fi ;;
        *.tgz | *.tar.gz) tar -xzf "$archive" -C "$dir" > "$errfile" 2>&1 ;;
        *.tar) tar -xf "$archive" -C "$dir" > "$errfile" 2>&1 ;;
        *) die "do not know how to unpack $archive (expected .zip, .tgz, .tar.gz or .tar)" ;;
    esac || { rm -rf -- "$dir"; return 1; }
}

# lib_listing DIR: up to 8 paths found in DIR, for error messages. (awk reads to the end where head would stop
# early and fail the pipeline, under pipefail, by the broken pipe of a long listing.)
lib_listing() {
    (cd "$1" && find . -mindepth 1 | sed 's|^\./||' | sort | awk 'NR <= 8' | paste -sd ' ' -)
}

# -------------------------------------------------------------------------------------- corpus preparation

# lib_prepare_recipe ARGS... : the whole of a language-model prepare.sh, "[-h] [DATA_DIR]" (default data/RECIPE):
# lib_prepare_corpus on the corpus that these variables and lib_prepare_corpus's optional ones describe:
#   CORPUS_URL   where the archive is by default (its file name is CORPUS_ARCHIVE); <NAME>_URL overrides it, where
#                NAME is the recipe's folder in capitals without dashes (e.g. WIKITEXT2 for wikitext-2)
#   CORPUS_MD5   the archive's MD5, or empty when no checksum is known; <NAME>_MD5 overrides it (empty: no check)
#   CORPUS_SIZE  the archive's size, for the usage
#   CORPUS_MEMBER_DIR, CORPUS_SPLITS  as lib_prepare_corpus's; the three files are kept in DATA_DIR/RECIPE
# A recipe whose splits are not three files of the archive gives its function `usage` (lib_prepare_usage TEXT).
lib_prepare_recipe() {
    local name=${RECIPE//-/}
    CORPUS_URL_VAR=${name^^}_URL CORPUS_MD5_VAR=${name^^}_MD5 CORPUS_ARCHIVE=$(basename "$CORPUS_URL")
    CORPUS_TEXT_DIR=$RECIPE
    declare -F usage > /dev/null || usage() { lib_prepare_usage; }
    [[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
    [[ ${1:-} == -* ]] && { usage >&2; die "unknown option $1"; }
    (( $# <= 1 )) || { usage >&2; die "too many arguments"; }
    local md5_default=$CORPUS_MD5
    CORPUS_URL=${!CORPUS_URL_VAR:-$CORPUS_URL}
    CORPUS_MD5=${!CORPUS_MD5_VAR-$md5_default}
    lib_prepare_corpus "${1:-data/$RECIPE}"
}

# lib_prepare_usage [TEXT]: the usage of lib_prepare_recipe's prepare.sh; TEXT says what it does and writes
# (default: the archive's three files binarized as they are).
lib_prepare_usage() {
    local first=${CORPUS_SPLITS[0]} files md5_help
    files="${first%%.*}.{train,valid,test}.${first#*.*.}"
    if [[ -n $CORPUS_MD5 ]]; then
        md5_help="(default: $CORPUS_MD5, the original release);
                      set it to an empty string to skip the check"
    else
        md5_help="(default: empty, no check: no published checksum is known
                      to this recipe)"
    fi
    cat <<USAGE
Usage: $(basename "$0") [-h] [DATA_DIR]

${1:-"Download $CORPUS_ARCHIVE, check that it holds $CORPUS_MEMBER_DIR/$files,
keep those three files and binarize them with 'fairseq-preprocess --only-source'. DATA_DIR
(default: data/$RECIPE) receives
  $(printf '%-26s' "$CORPUS_ARCHIVE") the archive ($CORPUS_SIZE)
  $(printf '%-26s' "$RECIPE/") ${CORPUS_SPLITS[0]}, ${CORPUS_SPLITS[1]}, ${CORPUS_SPLITS[2]}
  data-bin/                  dict.txt, {train,valid,test}.{bin,idx}: what train.sh and eval.sh read"}
Finished steps are skipped on a rerun (markers in DATA_DIR/.done/).

Environment:
  $(printf '%-19s' "$CORPUS_URL_VAR") where to download from (default: $CORPUS_URL);
                      an http(s):// or file:// URL, or a local path
  $(printf '%-19s' "$CORPUS_MD5_VAR") expected MD5 of the archive $md5_help
  PREPROCESS_WORKERS  fairseq-preprocess workers (default: the number of cores, at most 20)
USAGE
}

# lib_prepare_corpus DATA_DIR: download, unpack, check and binarize a language-modelling corpus described by
# these variables (set them before the call):
#   CORPUS_ARCHIVE     file name of the archive, e.g. wikitext-103-v1.zip (kept as DATA_DIR/CORPUS_ARCHIVE)
#   CORPUS_URL         where to fetch it from;   CORPUS_URL_VAR: the environment variable that overrides it
#   CORPUS_MD5         its MD5, or empty;        CORPUS_MD5_VAR: the environment variable that overrides it
#   CORPUS_MEMBER_DIR  the folder inside the archive that holds the splits, e.g. wikitext-103
#   CORPUS_SPLITS      array of the three file names (train, valid, test) inside CORPUS_MEMBER_DIR
#   CORPUS_TEXT_DIR    the folder under DATA_DIR the three files are kept in
# and, optionally (both empty unless the recipe sets them):
#   CORPUS_SPLIT_MEMBERS    for a corpus whose splits are several files each (e.g. shards): array of three
#                           space-separated lists of files inside CORPUS_MEMBER_DIR; each list is concatenated, in
#                           the order given, into the train, valid and test files that CORPUS_SPLITS names
#   CORPUS_PREPROCESS_ARGS  array of extra fairseq-preprocess arguments (e.g. --thresholdsrc 3)
# Steps (each skipped on a rerun once done): download -> DATA_DIR/CORPUS_ARCHIVE; unpack ->
# DATA_DIR/CORPUS_TEXT_DIR/<the three files>; binarize (fairseq-preprocess --only-source) -> DATA_DIR/data-bin.
CORPUS_SPLIT_MEMBERS=()
CORPUS_PREPROCESS_ARGS=()

# _lib_split_members INDEX: the files inside CORPUS_MEMBER_DIR that make split INDEX (0 train, 1 valid, 2 test),
# one a line: CORPUS_SPLIT_MEMBERS[INDEX] when the recipe gives members, else the split's own file name.
_lib_split_members() {
    if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
        local names
        read -r -a names <<< "${CORPUS_SPLIT_MEMBERS[$1]}"
        printf '%s\n' "${names[@]}"
    else
        printf '%s\n' "${CORPUS_SPLITS[$1]}"
    fi
}

lib_prepare_corpus() {
    local data_dir=$1
    local archive="$data_dir/$CORPUS_ARCHIVE" text_dir="$data_dir/$CORPUS_TEXT_DIR" bin_dir="$data_dir/data-bin"
    local train=${CORPUS_SPLITS[0]} valid=${CORPUS_SPLITS[1]} test=${CORPUS_SPLITS[2]}

    require_tool fairseq-preprocess
    require_tool tar
    lib_output_dir "$data_dir"

    # 1. download
    if lib_step_done "$data_dir" download "$archive"; then
        lib_skip "download" "$archive"
    else
        log "download $CORPUS_URL -> $archive"
        lib_download "$CORPUS_URL" "$archive" "$CORPUS_MD5" "$CORPUS_URL_VAR" "$CORPUS_MD5_VAR"
        lib_mark_done "$data_dir" download "$CORPUS_URL md5=${CORPUS_MD5:-unchecked}"
    fi

    # 2. unpack and check the layout; keep only the three split files
    if lib_step_done "$data_dir" unpack "$text_dir/$train" "$text_dir/$valid" "$text_dir/$test"; then
        lib_skip "unpack" "$text_dir"
    else
        log "unpack $archive -> $text_dir"
        local unpacked="$data_dir/unpack.tmp" staged="$text_dir.tmp" split
        lib_tmp "$unpacked"
        lib_tmp "$staged"
        if ! lib_unpack "$archive" "$unpacked"; then
            local reason
            reason=$(tail -n 2 "$unpacked.err" 2>/dev/null | tr -s ' \n\t' ' ' | sed 's/ $//') || true
            rm -f -- "$archive"
            lib_unmark "$data_dir" download
            die "cannot unpack $archive (${reason:-not a valid archive}); deleted it. Is $CORPUS_URL_VAR" \
                "($CORPUS_URL) the right file?"
        fi
        local index member members expected="$CORPUS_MEMBER_DIR/{$train,$valid,$test}"
        if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
            members=$(for index in 0 1 2; do _lib_split_members "$index"; done)
            expected="the $(wc -l <<< "$members" | tr -d ' ') files $CORPUS_MEMBER_DIR/{$(head -n 1 <<< "$members"),"
            expected+="...,$(tail -n 1 <<< "$members")}"
        fi
        for index in 0 1 2; do
            while IFS= read -r member; do
                if [[ ! -s $unpacked/$CORPUS_MEMBER_DIR/$member ]]; then
                    local found
                    found=$(lib_listing "$unpacked")
                    rm -f -- "$archive"
                    lib_unmark "$data_dir" download
                    die "unexpected layout of $CORPUS_ARCHIVE from $CORPUS_URL: $CORPUS_MEMBER_DIR/$member is missing" \
                        "or empty (the archive holds: ${found:-nothing}). Expected $expected; deleted the download." \
                        "Point $CORPUS_URL_VAR at the original $CORPUS_ARCHIVE."
                fi
            done < <(_lib_split_members "$index")
        done
        rm -rf -- "$staged" "$text_dir"
        mkdir -p "$staged"
        for index in 0 1 2; do
            split=${CORPUS_SPLITS[$index]}
            if (( ${#CORPUS_SPLIT_MEMBERS[@]} )); then
                local parts=()
                mapfile -t parts < <(_lib_split_members "$index")
                (cd "$unpacked/$CORPUS_MEMBER_DIR" && cat -- "${parts[@]}") > "$staged/$split" \
                    || die "cannot write $split (${#parts[@]} files of $CORPUS_ARCHIVE concatenated); is the disk full?"
            else
                mv -- "$unpacked/$CORPUS_MEMBER_DIR/$split" "$staged/$split"
            fi
        done
        mv -- "$staged" "$text_dir"
        rm -rf -- "$unpacked"  # now, not at exit: the rest of a large archive need not wait for the binarization
        lib_mark_done "$data_dir" unpack "$(wc -l < "$text_dir/$train") training lines"
    fi

    # 3. binarize with fairseq-preprocess into a temporary folder, renamed when complete
    if lib_step_done "$data_dir" binarize "$bin_dir/dict.txt" "$bin_dir/train.bin" "$bin_dir/test.bin"; then
        lib_skip "binarize" "$bin_dir"
    else
        local workers=${PREPROCESS_WORKERS:-$(nproc 2>/dev/null || echo 1)}
        (( workers > 20 )) && workers=20
        local extra=("${CORPUS_PREPROCESS_ARGS[@]+"${CORPUS_PREPROCESS_ARGS[@]}"}")
        log "fairseq-preprocess --only-source ${extra[*]+${extra[*]} }-> $bin_dir ($workers workers)"
        local staged_bin="$bin_dir.tmp" prep_log="$data_dir/preprocess.log.tmp"
        lib_tmp "$staged_bin"
        lib_tmp "$prep_log"
        rm -rf -- "$staged_bin" "$bin_dir"
        fairseq-preprocess --only-source --trainpref "$text_dir/$train" --validpref "$text_dir/$valid" \
            --testpref "$text_dir/$test" --destdir "$staged_bin" --workers "$workers" \
            "${extra[@]+"${extra[@]}"}" > "$prep_log" 2>&1 \
            || { tail -n 20 "$prep_log" >&2; die "fairseq-preprocess failed on $text_dir (its output is above)"; }
        grep -E "Dictionary|\[None\] .*sents" "$prep_log" | sed -E 's/^.*\[None\] /    /' | awk '!seen[$0]++' || true
        mv -- "$staged_bin" "$bin_dir"
        lib_mark_done "$data_dir" binarize "$(wc -l < "$bin_dir/dict.txt") dictionary entries${extra[*]+ (${extra[*]})}"
    fi
    log "done: binarized data in $bin_dir"
}
