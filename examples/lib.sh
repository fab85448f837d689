# shellcheck shell=bash disable=SC2034
# Shell functions shared by the examples' scripts (sourced, not run). Every step writes its output under a
# temporary name and renames it into place when done, so an interrupted script never leaves a half-written output
# that a rerun would trust; a step whose output exists is skipped.

# torch's deprecation warnings about fairseq's own calls would drown the logs; PYTHONWARNINGS=default shows them.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"

# The demo's model: fairseq's IWSLT Transformer size shrunk for two CPU cores (d_model 128, FFN 512, 4 heads, 3+3
# pre-norm layers), all embeddings shared, and its training (Adam, inverse-sqrt schedule, label smoothing, no
# dropout, 1,024 tokens a batch). Used by examples/demo/run.sh and examples/translation/compare.sh (which warms up
# over 500 updates instead of 150).
# --required-batch-size-multiple 1: with fairseq's default 8, a split's last batch is dropped when its size is not a
# multiple of 8 (facebookresearch/fairseq#5036): validation would skip sentences, or see none on a tiny split.
DEMO_TRANSFORMER=(
    --share-all-embeddings --encoder-layers 3 --decoder-layers 3
    --encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
    --encoder-attention-heads 4 --decoder-attention-heads 4
    --encoder-normalize-before --decoder-normalize-before --dropout 0.0
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 150
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 1024
    --required-batch-size-multiple 1 --num-workers 0
)
# The device of training and scoring: the CPU unless a comparison's -d/-p say otherwise (compare_options).
DEVICE_ARGS=(--cpu) EVAL_DEVICE_ARGS=(--cpu)
DEMO_BPE_MERGES=8000
DEMO_BPE_THRESHOLD=10

# debian_packages DIR PACKAGE...: download the Debian packages (apt-get download, not installed) and unpack them
# under DIR/root (dpkg-deb -x); DIR/versions.txt names each package and version. Skipped when DIR exists.
debian_packages() {
    local dir=$1 deb
    shift
    [[ -d $dir ]] && return 0
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/debs"
    (cd "$dir.tmp/debs" && apt-get download "$@") \
        || { echo "error: apt-get download failed; run 'apt-get update' first (as root)" >&2; exit 1; }
    for deb in "$dir.tmp"/debs/*.deb; do
        dpkg-deb -x "$deb" "$dir.tmp/root"
        dpkg-deb -f "$deb" Package Version | paste -sd ' ' >> "$dir.tmp/versions.txt"
    done
    mv "$dir.tmp" "$dir"
}

# debian_corpus_options DEFAULT_OUT ARGS...: the command line "[-o OUT] [-h]" of a script that builds corpora from
# Debian packages: OUT (default DEFAULT_OUT) made absolute from the repository root, where it then runs, with the
# tools it needs checked.
debian_corpus_options() {
    local opt OPTARG OPTIND=1
    OUT=$1
    shift
    while getopts "o:h" opt; do
        case $opt in o) OUT=$OPTARG ;; h) usage; exit 0 ;; *) usage >&2; exit 2 ;; esac
    done
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    OUT=$(realpath -m "$OUT")
    require_tools python apt-get dpkg-deb
}

# require_tools TOOL...: stop with a message when one is not on PATH.
require_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || {
            echo "error: $tool not found on PATH; run 'make install' and put .venv/bin first on PATH" >&2; exit 1; }
    done
}

# demo_corpus OUT [DIR]: OUT/corpus/{train,valid,test}.{en,de}, the demo corpus built from this machine's gettext
# catalogs (scripts.demo_corpus), or a copy of DIR's files of those names (your own corpus).
demo_corpus() {
    local out=$1 dir=${2:-} split lang
    [[ -d $out/corpus ]] && return 0
    rm -rf "$out/corpus.tmp"
    if [[ -z $dir ]]; then
        python -m scripts.demo_corpus "$out/corpus.tmp"
    else
        mkdir -p "$out/corpus.tmp"
        for split in train valid test; do
            for lang in en de; do
                [[ -s $dir/$split.$lang ]] || { echo "error: $dir/$split.$lang is missing or empty" >&2; exit 1; }
                cp "$dir/$split.$lang" "$out/corpus.tmp/"
            done
        done
    fi
    mv "$out/corpus.tmp" "$out/corpus"
}

# joint_bpe OUT: OUT/bpe, a joint BPE (subword-nmt, DEMO_BPE_MERGES merges) learnt on OUT/corpus's train split and
# applied to every split. No Moses tokenisation: on software messages (%s, »%s«, --options, paths) its detokeniser
# does not restore the text, while BPE on whitespace-separated words is undone exactly by --remove-bpe.
joint_bpe() {
    local out=$1 split lang
    [[ -d $out/bpe ]] && return 0
    rm -rf "$out/bpe.tmp" && mkdir "$out/bpe.tmp"
    subword-nmt learn-joint-bpe-and-vocab --input "$out/corpus/train.en" "$out/corpus/train.de" \
        -s "$DEMO_BPE_MERGES" -o "$out/bpe.tmp/codes" \
        --write-vocabulary "$out/bpe.tmp/vocab.en" "$out/bpe.tmp/vocab.de" 2> "$out/bpe.tmp/learn.log" \
        || { cat "$out/bpe.tmp/learn.log" >&2; exit 1; }
    for split in train valid test; do
        for lang in en de; do
            subword-nmt apply-bpe -c "$out/bpe.tmp/codes" --vocabulary "$out/bpe.tmp/vocab.$lang" \
                --vocabulary-threshold "$DEMO_BPE_THRESHOLD" < "$out/corpus/$split.$lang" > "$out/bpe.tmp/$split.$lang"
        done
    done
    mv "$out/bpe.tmp" "$out/bpe"
}

# binarize_translation OUT: OUT/data-bin from OUT/bpe, one dictionary for both languages (--share-all-embeddings
# needs it).
binarize_translation() {
    local out=$1
    [[ -d $out/data-bin ]] && return 0
    rm -rf "$out/data-bin.tmp"
    fairseq-preprocess --source-lang en --target-lang de \
        --trainpref "$out/bpe/train" --validpref "$out/bpe/valid" --testpref "$out/bpe/test" \
        --destdir "$out/data-bin.tmp" --joined-dictionary --workers 2 > "$out/preprocess.log" 2>&1 \
        || { cat "$out/preprocess.log" >&2; exit 1; }
    mv "$out/data-bin.tmp" "$out/data-bin"
}

# lm_data OUT [DIR]: OUT/text/{train,valid,test}.txt, the English side of the demo corpus or a copy of DIR's files
# of those names (your text: one paragraph or sentence a line, tokens separated by spaces, e.g.
# examples/language_model/corpus.sh's), and OUT/data-bin, word level, words seen fewer than 3 times in train mapped
# to <unk>.
lm_data() {
    local out=$1 dir=${2:-} split
    if [[ ! -d $out/text ]]; then
        rm -rf "$out/text.tmp"
        if [[ -z $dir ]]; then
            demo_corpus "$out/text.tmp"
            for split in train valid test; do mv "$out/text.tmp/corpus/$split.en" "$out/text.tmp/$split.txt"; done
            rm -rf "$out/text.tmp/corpus"
        else
            mkdir -p "$out/text.tmp"
            for split in train valid test; do
                [[ -s $dir/$split.txt ]] || { echo "error: $dir/$split.txt is missing or empty" >&2; exit 1; }
                cp "$dir/$split.txt" "$out/text.tmp/"
            done
        fi
        mv "$out/text.tmp" "$out/text"
    fi
    [[ -d $out/data-bin ]] && return 0
    rm -rf "$out/data-bin.tmp"
    fairseq-preprocess --only-source --thresholdsrc 3 --trainpref "$out/text/train.txt" \
        --validpref "$out/text/valid.txt" --testpref "$out/text/test.txt" --destdir "$out/data-bin.tmp" \
        --workers 2 > "$out/preprocess.log" 2>&1 || { cat "$out/preprocess.log" >&2; exit 1; }
    mv "$out/data-bin.tmp" "$out/data-bin"
}

# train_into DIR LOG ARGS...: define_fairseq.tools.train (fairseq-train's loop with a clean process exit) with ARGS
# into DIR, its json log appended to LOG (which holds the start of a run stopped part way); DIR's checkpoint_best.pt
# removed (the comparisons score their own points). On a failure, the log's end and an error naming DIR.
train_into() {
    local dir=$1 log=$2; shift 2
    python -m define_fairseq.tools.train "$@" --save-dir "$dir" --no-progress-bar --log-format json \
        --log-interval 50 >> "$log" 2>&1 \
        || { tail -20 "$log" >&2; echo "error: training into $dir failed" >&2; exit 1; }
    rm -f "$dir/checkpoint_best.pt"
}

# train_run DIR ARGS...: fairseq-train ARGS into DIR (its checkpoints, train.log with --log-format json),
# skipped when DIR/train.log says the run finished. A run stopped part way (a session's end, a kill) goes on from its
# last checkpoint, which fairseq-train resumes exactly, its log continued; a DIR with no checkpoint starts over.
train_run() {
    local dir=$1; shift
    grep -qs "done training" "$dir/train.log" && return 0
    if [[ -f $dir/checkpoint_last.pt && -f $dir/train.log.tmp ]]; then
        echo "==> $dir: stopped part way; on from its last checkpoint"
    else
        rm -rf "$dir" && mkdir -p "$dir"
    fi
    train_into "$dir" "$dir/train.log.tmp" "$@"
    mv "$dir/train.log.tmp" "$dir/train.log"
}

# train_more DIR ARGS...: train the finished run in DIR on to ARGS' --max-update. fairseq-train resumes it from
# DIR/checkpoint_last.pt, which ends where one run trained to that count at once would (data position, optimizer and
# per-update seeds are in the checkpoint; the schedules do not depend on --max-update). The log goes on in
# DIR/train.log; the run's points are indexed again.
train_more() {
    local dir=$1; shift
    train_into "$dir" "$dir/train.more.tmp" "$@"
    rm -f "$dir/points.json"
    cat "$dir/train.log" "$dir/train.more.tmp" > "$dir/train.log.tmp"
    mv "$dir/train.log.tmp" "$dir/train.log"
    rm -f "$dir/train.more.tmp"
}

# trained_updates RUN_DIR: the updates of the run's last checkpoint (its points.json).
trained_updates() {
    python -c "import json, sys; print(max(p[0] for p in json.load(open(sys.argv[1]))))" "$1/points.json"
}

# seconds_of RUN_DIR: the training time fairseq-train logged for the run ("done training in S seconds").
seconds_of() {
    grep -o 'done training in [0-9.]* seconds' "$1/train.log" | grep -o '[0-9.]*' | tail -1
}

# vocabulary_size OUT: the symbols of OUT/data-bin/dict.txt plus fairseq's 4 specials (<s>, <pad>, </s>, <unk>).
vocabulary_size() {
    echo $(( $(wc -l < "$1/data-bin/dict.txt") + 4 ))
}

# eval_lm_test OUT DIR ARGS... [--path CHECKPOINT]: fairseq-eval-lm of DIR/checkpoint_last.pt (or CHECKPOINT) on the
# test split of OUT/data-bin, on the device of EVAL_DEVICE_ARGS (ARGS: the task and its batching), its output in
# DIR/eval.log; stops with the log's last lines on failure.
eval_lm_test() {
    local out=$1 dir=$2
    shift 2
    fairseq-eval-lm "$out/data-bin" --user-dir define_fairseq --path "$dir/checkpoint_last.pt" \
        "${EVAL_DEVICE_ARGS[@]}" --gen-subset test "$@" > "$dir/eval.log" 2>&1 \
        || { tail -20 "$dir/eval.log" >&2; exit 1; }
}

# test_perplexity DIR: the perplexity in DIR/eval.log (eval_lm_test's).
test_perplexity() {
    grep -o 'Perplexity: [0-9.]*' "$1/eval.log" | tail -1 | awk '{print $2}'
}

# The comparisons over several seeds (compare_options, compare_run_all, compare_report, ...).
# shellcheck source=examples/compare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/compare_lib.sh"
