#!/usr/bin/env bash
# Download WMT14 English-German, normalise and tokenise it with sacremoses, clean it, learn and apply a joint BPE,
# and binarize it for fairseq (see README.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"

# name | file | default URL | default MD5 (empty: not checked) | members used (paths inside the archive)
ARCHIVES=(
    "europarl|training-parallel-europarl-v7.tgz|https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz||training/europarl-v7.de-en.en training/europarl-v7.de-en.de"
    "commoncrawl|training-parallel-commoncrawl.tgz|https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz||commoncrawl.de-en.en commoncrawl.de-en.de"
    "news_commentary|training-parallel-nc-v9.tgz|https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz||training/news-commentary-v9.de-en.en training/news-commentary-v9.de-en.de"
    "dev|dev.tgz|https://www.statmt.org/wmt14/dev.tgz||dev/newstest2013.en dev/newstest2013.de"
    "test|test-full.tgz|https://statmt.org/wmt14/test-full.tgz|a8cd784e006feb32ac6f3d9ec7eb389a|test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm"
    "test17|test.tgz|https://data.statmt.org/wmt17/translation-task/test.tgz|86a1724c276004aa25455ae2a04cef26|test/newstest2017-ende-src.en.sgm test/newstest2017-ende-ref.de.sgm"
)
# the sentence pairs of the original releases (informational: printed beside the counts found)
declare -A RELEASE_LINES=([europarl]=1920209 [commoncrawl]=2399123 [news_commentary]=201288 [valid]=3000
                          [newstest2014]=3003 [newstest2017]=3004)
SPLITS=(train valid newstest2014 newstest2017)

usage() {
    cat <<USAGE
Usage: $(basename "$0") [-h] [-b subword-nmt|sentencepiece] [-v SIZE] [-j WORKERS] [DATA_DIR]

Prepare WMT14 English-German for fairseq in DATA_DIR (default: data/wmt14-en-de):
  orig/       the six archives: Europarl v7, Common Crawl, News Commentary v9 (the WMT14 training corpora),
              dev.tgz (newstest2013), test-full.tgz (newstest2014), and WMT17's test.tgz (newstest2017)
  raw/        train.{en,de} (the three corpora concatenated), valid.{en,de} (newstest2013),
              newstest2014.{en,de} and newstest2017.{en,de} (the segments of the .sgm files, as sacreBLEU reads
              them): the references eval.sh scores against
  tok/        the same after Moses punctuation normalisation and tokenisation (sacremoses; tokenizer.perl -a);
              with -b sentencepiece, normalisation only
  tok/train.clean.{en,de}
              the training pairs with 1 to 250 words a side and a length ratio of at most 1.5
  bpe/        code (subword-nmt) or spm.model (sentencepiece), and every split segmented with it
  data-bin/   fairseq-preprocess --joined-dictionary: train, valid (newstest2013), test (newstest2014),
              test1 (newstest2017); what train.sh and eval.sh read
Each step writes under a temporary name and renames when complete, and leaves a marker in DATA_DIR/.done/, so a
rerun (after a failure or an interruption) skips what is finished.

Options:
  -b BPE       subword-nmt (default: a joint BPE learned on both languages, as fairseq's WMT14 script) or
               sentencepiece (a joint SentencePiece BPE model trained on the normalised, untokenised text)
  -v SIZE      BPE merges (subword-nmt) or vocabulary size (sentencepiece); default 40000
  -j WORKERS   parallel workers for tokenising, BPE and fairseq-preprocess (default: the number of cores)
  -h           this help

Environment:
  WMT14_MIRROR             a base URL (or folder) holding all six archives under their own names; default: the
                           statmt.org addresses
  WMT14_<NAME>_URL         one archive's URL or local path (wins over WMT14_MIRROR); NAME is EUROPARL,
                           COMMONCRAWL, NEWS_COMMENTARY, DEV, TEST (newstest2014) or TEST17 (newstest2017)
  WMT14_<NAME>_MD5         its expected MD5; TEST and TEST17 default to the digests sacreBLEU records for the
                           same files, the others are not checked unless set
USAGE
}

BPE=subword-nmt
BPE_SIZE=40000
WORKERS=${PREPROCESS_WORKERS:-$(nproc 2>/dev/null || echo 1)}
recipe_option() {
    case $1 in
        b) BPE=$2 ;;
        v) BPE_SIZE=$2 ;;
        j) WORKERS=$2 ;;
        *) return 1 ;;
    esac
}
lib_parse_options hb:v:j: "" "$@"
shift "$LIB_SHIFT"
(( $# <= 1 )) || { usage >&2; die "too many arguments"; }
DATA_DIR=${1:-data/wmt14-en-de}
[[ $DATA_DIR != *,* ]] || die "DATA_DIR $DATA_DIR contains a comma, which fairseq-preprocess's --testpref and" \
    "SentencePiece's input list take as a separator; choose a path without commas"
[[ $BPE == subword-nmt || $BPE == sentencepiece ]] || die "-b $BPE: give subword-nmt or sentencepiece"
[[ $BPE_SIZE =~ ^[1-9][0-9]*$ ]] || die "-v $BPE_SIZE: give the BPE size as a positive whole number"
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "-j $WORKERS: give the number of workers as a positive whole number"

require_tool fairseq-preprocess
require_tool tar
require_plugin
PYTHON=$(lib_python)
if [[ $BPE == subword-nmt ]]; then
    require_tool subword-nmt "It comes with this project's requirements (pip install subword-nmt)."
else
    "$PYTHON" -c "import sentencepiece" 2>/dev/null \
        || die "-b sentencepiece needs the sentencepiece package in $PYTHON (pip install sentencepiece)"
fi
"$PYTHON" -c "import sacremoses" 2>/dev/null \
    || die "the sacremoses package is missing in $PYTHON (pip install sacremoses; it is in requirements.txt)"

ORIG="$DATA_DIR/orig" RAW="$DATA_DIR/raw" TOK="$DATA_DIR/tok" BPE_DIR="$DATA_DIR/bpe" BIN="$DATA_DIR/data-bin"

# The temporary names a run killed outright (SIGKILL, a power cut) left behind, where no exit handler could remove
# them: this script's own, and only in its own folders. (Only one run may use DATA_DIR at a time.)
remove_stale() {
    local name
    for name in raw.tmp extract.tmp extract.tmp.err data-bin.tmp preprocess.log.tmp settings.tmp; do
        rm -rf -- "${DATA_DIR:?}/$name"
    done
    [[ -d $ORIG ]] && find "$ORIG" -maxdepth 1 \( -name '*.part' -o -name '*.part.err' \) -exec rm -f -- {} +
    [[ -d $TOK ]] && find "$TOK" -maxdepth 1 -name '*.tmp' -exec rm -f -- {} +
    [[ -d $BPE_DIR ]] && find "$BPE_DIR" -maxdepth 1 -name '*.tmp' -exec rm -rf -- {} +
    [[ -d $DATA_DIR/.done ]] && find "$DATA_DIR/.done" -maxdepth 1 -name '*.tmp' -exec rm -f -- {} +
    return 0
}
remove_stale
lib_output_dir "$DATA_DIR"

# One DATA_DIR holds one preparation: a rerun with other BPE settings would mix two. The settings are recorded when
# the first step that depends on them starts (tokenize), so a run that failed before leaves them open.
SETTINGS="bpe=$BPE size=$BPE_SIZE"
if [[ -f $DATA_DIR/settings && $(cat "$DATA_DIR/settings") != "$SETTINGS" ]]; then
    die "$DATA_DIR was prepared with $(cat "$DATA_DIR/settings"), not $SETTINGS. Give another DATA_DIR (the" \
        "downloads can be shared by pointing WMT14_MIRROR at $ORIG), or remove $DATA_DIR/{settings,tok,bpe,data-bin}" \
        "and the markers in $DATA_DIR/.done/ after 'extract'."
fi
record_settings() {
    [[ -f $DATA_DIR/settings ]] && return 0
    printf '%s\n' "$SETTINGS" > "$DATA_DIR/settings.tmp"
    mv -f -- "$DATA_DIR/settings.tmp" "$DATA_DIR/settings"
}

# produce OUT COMMAND...: run COMMAND with its standard output going to OUT.tmp, renamed to OUT when it succeeds.
produce() {
    local out=$1
    shift
    lib_tmp "$out.tmp"
    rm -f -- "$out.tmp"
    "$@" > "$out.tmp" || die "could not write $out (exit code $? of: $*)"
    mv -f -- "$out.tmp" "$out"
}

# invalidate STEP...: a step that runs again makes the later ones stale
invalidate() {
    local step
    for step in "$@"; do
        lib_unmark "$DATA_DIR" "$step"
    done
}

# ----------------------------------------------------------------------------------------------- 1. download
mkdir -p "$ORIG"
for spec in "${ARCHIVES[@]}"; do
    IFS='|' read -r name file default_url default_md5 members <<< "$spec"
    var=WMT14_${name^^}
    url_var="${var}_URL" md5_var="${var}_MD5"
    url=${!url_var:-${WMT14_MIRROR:+$WMT14_MIRROR/$file}}
    url=${url:-$default_url}
    md5=${!md5_var-$default_md5}
    if lib_step_done "$DATA_DIR" "download-$name" "$ORIG/$file"; then
        lib_skip "download $file" "$ORIG/$file"
    else
        log "download $url -> $ORIG/$file"
        lib_download "$url" "$ORIG/$file" "$md5" "$url_var" "$md5_var"
        lib_mark_done "$DATA_DIR" "download-$name" "$url md5=${md5:-unchecked}"
        invalidate extract
    fi
done

# ------------------------------------------------------------------------------------------------ 2. extract
# The members each archive must hold; the archive is deleted (and its download redone on a rerun) when one is
# missing, since it is then not the original file.
extract_members() {
    local name=$1 file=$2 members=$3 dest=$4
    local url_var="WMT14_${name^^}_URL" errfile="$dest.err"
    lib_tmp "$errfile"
    read -r -a list <<< "$members"
    if ! tar -xzf "$ORIG/$file" -C "$dest" "${list[@]}" 2> "$errfile"; then
        local reason
        reason=$(grep -v '^[[:space:]]*$' "$errfile" | head -n 3 | tr -s ' \n\t' ' ') || true
        rm -f -- "$ORIG/$file"
        lib_unmark "$DATA_DIR" "download-$name"
        die "$file does not hold the expected ${list[*]} (tar: ${reason:-not a gzipped tar}); deleted it." \
            "Is $url_var the right file?"
    fi
}

# check_pair NAME SRC TGT: the two sides of a corpus have the same number of lines (and at least one)
check_pair() {
    local name=$1 src=$2 tgt=$3 n_src n_tgt
    n_src=$(lib_lines "$src")
    n_tgt=$(lib_lines "$tgt")
    (( n_src == n_tgt && n_src > 0 )) || die "$name: $(basename "$src") has $n_src lines but $(basename "$tgt")" \
        "has $n_tgt; the archive is damaged or not the original (delete it from $ORIG and rerun)"
    log "    $name: $n_src sentence pairs${RELEASE_LINES[$name]:+ (the original release: ${RELEASE_LINES[$name]})}"
}

if lib_step_done "$DATA_DIR" extract "$RAW/train.en" "$RAW/newstest2017.de"; then
    lib_skip "extract" "$RAW"
else
    log "extract the corpora -> $RAW"
    invalidate tokenize clean bpe-learn bpe-apply binarize
    staged="$RAW.tmp" unpacked="$DATA_DIR/extract.tmp"
    lib_tmp "$staged"
    lib_tmp "$unpacked"
    rm -rf -- "$staged" "$unpacked"
    mkdir -p "$staged" "$unpacked"
    for spec in "${ARCHIVES[@]}"; do
        IFS='|' read -r name file _ _ members <<< "$spec"
        extract_members "$name" "$file" "$members" "$unpacked"
    done
    for lang in en de; do  # the order of fairseq's prepare-wmt14en2de.sh: Europarl, Common Crawl, News Commentary
        cat "$unpacked/training/europarl-v7.de-en.$lang" "$unpacked/commoncrawl.de-en.$lang" \
            "$unpacked/training/news-commentary-v9.de-en.$lang" > "$staged/train.$lang"
        cp -- "$unpacked/dev/newstest2013.$lang" "$staged/valid.$lang"
    done
    check_pair europarl "$unpacked/training/europarl-v7.de-en.en" "$unpacked/training/europarl-v7.de-en.de"
    check_pair commoncrawl "$unpacked/commoncrawl.de-en.en" "$unpacked/commoncrawl.de-en.de"
    check_pair news_commentary "$unpacked/training/news-commentary-v9.de-en.en" \
        "$unpacked/training/news-commentary-v9.de-en.de"
    check_pair valid "$staged/valid.en" "$staged/valid.de"
    lib_tool sgm_text "$unpacked/test-full/newstest2014-deen-src.en.sgm" "$staged/newstest2014.en"
    lib_tool sgm_text "$unpacked/test-full/newstest2014-deen-ref.de.sgm" "$staged/newstest2014.de"
    lib_tool sgm_text "$unpacked/test/newstest2017-ende-src.en.sgm" "$staged/newstest2017.en"
    lib_tool sgm_text "$unpacked/test/newstest2017-ende-ref.de.sgm" "$staged/newstest2017.de"
    check_pair newstest2014 "$staged/newstest2014.en" "$staged/newstest2014.de"
    check_pair newstest2017 "$staged/newstest2017.en" "$staged/newstest2017.de"
    rm -rf -- "$RAW" "$unpacked" "$TOK"  # the tokenised files were made from the text this step replaces
    mv -- "$staged" "$RAW"
    lib_mark_done "$DATA_DIR" extract "$(lib_lines "$RAW/train.en") training pairs"
fi

# ---------------------------------------------------------------------------------------------- 3. tokenize
# Moses' normalize-punctuation.perl | remove-non-printing-char.perl | tokenizer.perl -a, as sacremoses does them
# (fairseq's prepare-wmt14en2de.sh runs the Perl scripts); for SentencePiece only the normalisation, since
# SentencePiece segments raw text itself. Each file is renamed into place when complete, so an interrupted step
# redoes only the files it had not finished.
if [[ $BPE == subword-nmt ]]; then MOSES=(tokenize) TOKENIZED="normalised and tokenised"
else MOSES=(normalize) TOKENIZED="normalised"; fi
if lib_step_done "$DATA_DIR" tokenize "$TOK/train.en" "$TOK/newstest2017.de"; then
    lib_skip "tokenize" "$TOK"
else
    log "sacremoses ${MOSES[*]} ($WORKERS workers) -> $TOK"
    invalidate clean bpe-learn bpe-apply binarize
    record_settings
    mkdir -p "$TOK"
    for split in "${SPLITS[@]}"; do
        for lang in en de; do
            if [[ -f $TOK/$split.$lang ]]; then
                log "    $split.$lang: already done"
                continue
            fi
            produce "$TOK/$split.$lang" lib_tool moses_text "${MOSES[@]}" -l "$lang" -j "$WORKERS" "$RAW/$split.$lang"
            log "    $split.$lang: $(lib_lines "$TOK/$split.$lang") lines"
        done
    done
    lib_mark_done "$DATA_DIR" tokenize "$TOKENIZED"
fi

# ------------------------------------------------------------------------------------------------- 4. clean
# clean-corpus-n.perl's rule on the training pairs: 1 to 250 words a side, lengths within a ratio of 1.5. (fairseq's
# script applies it after BPE, to subwords; here it comes before, so that the BPE is learned on the cleaned text.)
if lib_step_done "$DATA_DIR" clean "$TOK/train.clean.en" "$TOK/train.clean.de"; then
    lib_skip "clean" "$TOK/train.clean.{en,de}"
else
    log "clean the training pairs -> $TOK/train.clean.{en,de}"
    invalidate bpe-learn bpe-apply binarize
    for lang in en de; do lib_tmp "$TOK/train.clean.$lang.tmp"; done
    lib_tool clean_parallel "$TOK/train.en" "$TOK/train.de" "$TOK/train.clean.en" "$TOK/train.clean.de" \
        --min-len 1 --max-len 250 --ratio 1.5
    lib_mark_done "$DATA_DIR" clean "$(lib_lines "$TOK/train.clean.en") of $(lib_lines "$TOK/train.en") pairs kept"
fi

# -------------------------------------------------------------------------------------------- 5. learn BPE
if lib_step_done "$DATA_DIR" bpe-learn "$BPE_DIR/$([[ $BPE == subword-nmt ]] && echo code || echo spm.model)"; then
    lib_skip "learn BPE" "$BPE_DIR"
else
    invalidate bpe-apply binarize
    mkdir -p "$BPE_DIR"
    if [[ $BPE == subword-nmt ]]; then
        # one code for both languages, learned on the English then the German side (fairseq's script does the same)
        log "subword-nmt learn-bpe -s $BPE_SIZE on train.clean.{en,de} -> $BPE_DIR/code"
        joint="$BPE_DIR/train.joint.tmp"
        produce "$joint" cat "$TOK/train.clean.en" "$TOK/train.clean.de"
        produce "$BPE_DIR/code" subword-nmt learn-bpe -s "$BPE_SIZE" --input "$joint"
        rm -f -- "$joint"
    else
        # a BPE model over both languages; every training line is read (no sampling), so the model is the same
        # on every run
        log "SentencePiece BPE, vocabulary $BPE_SIZE, on train.clean.{en,de} -> $BPE_DIR/spm.model"
        spm_dir="$BPE_DIR/spm.tmp"
        lib_tmp "$spm_dir"
        rm -rf -- "$spm_dir"
        mkdir -p "$spm_dir"
        "$PYTHON" - "$TOK/train.clean.en" "$TOK/train.clean.de" "$spm_dir/spm" "$BPE_SIZE" "$WORKERS" \
            > "$spm_dir/train.log" 2>&1 <<'PY' || { tail -n 20 "$spm_dir/train.log" >&2; die "SentencePiece training failed (its output is above)"; }
import sys
import sentencepiece as spm
en, de, prefix, size, workers = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=[en, de], model_prefix=prefix, vocab_size=int(size), model_type="bpe", character_coverage=1.0,
    input_sentence_size=0, shuffle_input_sentence=False, num_threads=int(workers), bos_id=-1, eos_id=-1)
PY
        mv -f -- "$spm_dir/spm.vocab" "$BPE_DIR/spm.vocab"
        mv -f -- "$spm_dir/spm.model" "$BPE_DIR/spm.model"
    fi
    lib_mark_done "$DATA_DIR" bpe-learn "$SETTINGS"
fi

# -------------------------------------------------------------------------------------------- 6. apply BPE
if lib_step_done "$DATA_DIR" bpe-apply "$BPE_DIR/train.en" "$BPE_DIR/newstest2017.de"; then
    lib_skip "apply BPE" "$BPE_DIR"
else
    log "apply the BPE to every split -> $BPE_DIR"
    invalidate binarize
    for split in "${SPLITS[@]}"; do
        source_name=$split
        [[ $split == train ]] && source_name=train.clean
        for lang in en de; do
            if [[ $BPE == subword-nmt ]]; then
                produce "$BPE_DIR/$split.$lang" subword-nmt apply-bpe -c "$BPE_DIR/code" --num-workers "$WORKERS" \
                    --input "$TOK/$source_name.$lang"
            else
                produce "$BPE_DIR/$split.$lang" "$PYTHON" -c '
import sys
import sentencepiece as spm
model = spm.SentencePieceProcessor(model_file=sys.argv[1])
with open(sys.argv[2], encoding="utf-8", newline="\n") as lines:
    for line in lines:
        print(" ".join(model.encode(line.rstrip("\n"), out_type=str)))
' "$BPE_DIR/spm.model" "$TOK/$source_name.$lang"
            fi
        done
        for lang in en de; do  # (subword-nmt's parallel apply-bpe exits 0 even when a worker failed)
            [[ $(lib_lines "$BPE_DIR/$split.$lang") == "$(lib_lines "$TOK/$source_name.$lang")" ]] || die "applying the BPE" \
                "to $TOK/$source_name.$lang gave $(lib_lines "$BPE_DIR/$split.$lang") lines instead of" \
                "$(lib_lines "$TOK/$source_name.$lang"); is the disk (or \$TMPDIR) full? Rerun to try again."
        done
    done
    lib_mark_done "$DATA_DIR" bpe-apply "$SETTINGS"
fi

# ---------------------------------------------------------------------------------------------- 7. binarize
if lib_step_done "$DATA_DIR" binarize "$BIN/dict.en.txt" "$BIN/train.en-de.en.bin" "$BIN/test1.en-de.de.bin"; then
    lib_skip "binarize" "$BIN"
else
    log "fairseq-preprocess --joined-dictionary ($WORKERS workers) -> $BIN"
    staged_bin="$BIN.tmp" prep_log="$DATA_DIR/preprocess.log.tmp"
    lib_tmp "$staged_bin"
    lib_tmp "$prep_log"
    rm -rf -- "$staged_bin" "$BIN"
    fairseq-preprocess --source-lang en --target-lang de --joined-dictionary \
        --trainpref "$BPE_DIR/train" --validpref "$BPE_DIR/valid" \
        --testpref "$BPE_DIR/newstest2014,$BPE_DIR/newstest2017" \
        --destdir "$staged_bin" --workers "$WORKERS" > "$prep_log" 2>&1 \
        || { tail -n 20 "$prep_log" >&2; die "fairseq-preprocess failed on $BPE_DIR (its output is above)"; }
    grep -E "\[(en|de)\] Dictionary|\[(en|de)\] .*sents" "$prep_log" | sed -E 's/^.*(\[(en|de)\] )/    \1/' | awk '!seen[$0]++' || true
    cp -- "$prep_log" "$staged_bin/preprocess.log"
    mv -- "$staged_bin" "$BIN"
    lib_mark_done "$DATA_DIR" binarize "$(lib_lines "$BIN/dict.en.txt") dictionary entries"
fi
log "done: binarized data in $BIN (valid = newstest2013, test = newstest2014, test1 = newstest2017)"
