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

# require_tools TOOL...: stop with a message when one is not on PATH.
require_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || {
            echo "error: $tool not found on PATH; run 'make install' and put .venv/bin first on PATH" >&2; exit 1; }
    done
}

# demo_corpus OUT [DIR]: OUT/corpus/{train,valid,test}.{en,de}, the demo corpus built from this machine's gettext
# catalogs (define_fairseq.tools.demo_corpus), or a copy of DIR's files of those names (your own corpus).
demo_corpus() {
    local out=$1 dir=${2:-} split lang
    [[ -d $out/corpus ]] && return 0
    rm -rf "$out/corpus.tmp"
    if [[ -z $dir ]]; then
        python -m define_fairseq.tools.demo_corpus "$out/corpus.tmp"
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

# train_run DIR ARGS...: fairseq-train ARGS into DIR (its checkpoints, train.log with --log-format json),
# skipped when DIR/train.log says the run finished; an unfinished DIR is started over. Training runs through
# define_fairseq.tools.train, fairseq-train's loop with a clean process exit.
train_run() {
    local dir=$1; shift
    grep -qs "done training" "$dir/train.log" && return 0
    rm -rf "$dir" && mkdir -p "$dir"
    python -m define_fairseq.tools.train "$@" --save-dir "$dir" --no-progress-bar \
        --log-format json --log-interval 50 > "$dir/train.log.tmp" 2>&1 \
        || { tail -20 "$dir/train.log.tmp" >&2; echo "error: training into $dir failed" >&2; exit 1; }
    rm -f "$dir/checkpoint_best.pt"
    mv "$dir/train.log.tmp" "$dir/train.log"
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

# ------------------------------------------------------------------------- the comparisons over several seeds
# The examples' compare.sh scripts: each scored run of MODEL[name] with seed S lives in OUT/runs/REGIME/NAME.sS, its
# score (the metric) in its file `score`.

# The points every comparison scores (compare_run), and its options' defaults before the script's own: equal
# updates after UPDATES, equal time (TIMED=1; -T: none), longer training after LONG (0: none) for seeds
# 1..LONG_SEEDS; EXTRA: fairseq-train arguments given to every model (-x).
TIMED=1 LONG=0 LONG_SEEDS=1 EXTRA="" CORPUS=""

# compare_options ARGS...: parse a comparison's command line with getopts: -o OUT, -s SEEDS, -m MODELS, -c CORPUS
# (a corpus folder), -u UPDATES, -T, -L LONG, -n LONG_SEEDS, -i SAVE_EVERY, -x EXTRA, -d DEVICE, -p PRECISION and
# -h (the script's function `usage`, then exit 0). A bad option prints the usage on stderr and exits 2. -d cpu (the
# default) or cuda (fairseq's default device, the first GPU) and -p fp32 (the default) or bf16 (training in
# bfloat16 through define_fairseq.tools.train, scoring in float32) set DEVICE_ARGS and EVAL_DEVICE_ARGS.
compare_options() {
    local opt OPTARG OPTIND=1 device=cpu precision=fp32
    while getopts "o:s:m:c:u:TL:n:i:x:d:p:h" opt; do
        case $opt in
            o) OUT=$OPTARG ;; s) SEEDS=$OPTARG ;; m) MODELS=$OPTARG ;; c) CORPUS=$OPTARG ;;
            u) UPDATES=$OPTARG ;; T) TIMED=0 ;; L) LONG=$OPTARG ;; n) LONG_SEEDS=$OPTARG ;;
            i) SAVE_EVERY=$OPTARG ;; x) EXTRA=$OPTARG ;; d) device=$OPTARG ;; p) precision=$OPTARG ;;
            h) usage; exit 0 ;; *) usage >&2; exit 2 ;;
        esac
    done
    case $device in
        cpu) DEVICE_ARGS=(--cpu) EVAL_DEVICE_ARGS=(--cpu) ;;
        cuda) DEVICE_ARGS=() EVAL_DEVICE_ARGS=() ;;
        *) echo "error: -d $device: the device is cpu or cuda" >&2; exit 2 ;;
    esac
    case $precision in
        fp32) ;;
        bf16) DEVICE_ARGS+=(--bf16) ;;
        *) echo "error: -p $precision: the precision is fp32 or bf16" >&2; exit 2 ;;
    esac
}

# compare_usage_line: the synopsis of every comparison's options.
compare_usage_line() {
    cat <<EOF
Usage: $(basename "$0") [-o OUT] [-s SEEDS] [-u UPDATES] [-L LONG] [-n LONG_SEEDS] [-i INTERVAL] [-m MODELS]
                  [-c CORPUS_DIR] [-x "TRAIN ARGS"] [-T] [-d cpu|cuda] [-p fp32|bf16]
EOF
}

# lm_corpus_usage: what the language-model comparisons read (lm_data).
lm_corpus_usage() {
    cat <<EOF
Text: CORPUS_DIR/{train,valid,test}.txt (one paragraph or sentence a line, tokens separated by spaces;
examples/language_model/corpus.sh builds one from Debian's manuals), or the English side of the demo corpus; word
level, words seen fewer than 3 times in train mapped to <unk>.
EOF
}

# compare_usage_points SCORE REFERENCE: the paragraph on the runs and their points, which every comparison shares:
# SCORE says how a point is scored, REFERENCE whose time the equal time is.
compare_usage_points() {
    cat <<EOF
Each model of MODELS trains once per seed 1..SEEDS (default $SEEDS), saving and validating every INTERVAL updates
(default $SAVE_EVERY). MODELS defaults to:
  $MODELS
Its points, scored by $1:
  - equal updates: after UPDATES updates (default $UPDATES);
  - equal time (skipped with -T): the last checkpoint within the time that $2
    took for UPDATES updates with the same seed (the others train $((TIME_MARGIN - 100))% past UPDATES for it);
  - longer training (with -L): after LONG updates, for seeds 1..LONG_SEEDS (default 1).
-x adds fairseq-train arguments to every model alike; -d cuda and -p bf16 train on the GPU, in bfloat16.
Writes OUT/results.md and OUT/curves.png (validation loss against updates and time; needs matplotlib).
OUT defaults to $OUT. A rerun skips what is done; give each setting (-x) its own OUT.
Time figures need a machine doing nothing else.
EOF
}

# compare_check_models: exit 2, saying which, when a name in MODELS is not a key of the script's MODEL array.
compare_check_models() {
    local name
    for name in $MODELS; do
        [[ -n ${MODEL[$name]:-} ]] || { echo "error: -m: unknown model '$name'; see -h" >&2; exit 2; }
    done
}

# compare_check_points: exit 2, saying why, when -u UPDATES or -L LONG is not a multiple of -i SAVE_EVERY, when LONG
# is not longer than UPDATES, or when a model's equal-time reference (compare_reference) does not come before it.
compare_check_points() {
    local value name reference seen=" "
    for value in "$UPDATES" "$LONG"; do
        (( value % SAVE_EVERY == 0 )) \
            || { echo "error: -u/-L: $value is not a multiple of -i $SAVE_EVERY" >&2; exit 2; }
    done
    if (( LONG && LONG <= UPDATES )); then
        echo "error: -L $LONG: the longer training must be longer than -u $UPDATES" >&2; exit 2
    fi
    for name in $MODELS; do
        reference=$(compare_reference "$name")
        if (( TIMED )) && [[ $reference != "$name" && $seen != *" $reference "* ]]; then
            echo "error: -m: $name's equal time is $reference's, which must come before it in -m (or -T: no" \
                "equal time)" >&2
            exit 2
        fi
        seen+="$name "
    done
}

# compare_run_all: for each seed 1..SEEDS, compare_run each model of MODELS, in order.
# compare_run NAME SEED: train NAME with SEED once (OUT/runs/train/NAME.sSEED), checkpointing and validating every
# SAVE_EVERY updates, score its points, then delete the checkpoints no point uses. Each point lives in
# OUT/runs/REGIME/NAME.sSEED (point.json, params.txt, score): `updates`, the checkpoint after UPDATES updates;
# `long` (when LONG > 0 and SEED <= LONG_SEEDS), after LONG; `time` (when TIMED=1), the last checkpoint within the
# time NAME's reference took for UPDATES updates with the same seed, for which the other models train TIME_MARGIN
# percent of UPDATES (set TIME_MARGIN above the fastest model's speed-up: a model that reaches the end of its run
# before the reference's time gets its last checkpoint, with a warning). The reference is the first model of
# MODELS, or what the script's function time_reference NAME prints (several families, each against its own
# baseline). With a learning-rate schedule and data order that do not depend on --max-update
# (define_fairseq.tools.run_points), each is the checkpoint of a run stopped there. The script defines
# run_args NAME SEED, which sets the array RUN_ARGS (fairseq-train's arguments, the data folder first), and
# score_checkpoint CHECKPOINT DIR, which prints the point's score (it may leave its files in DIR).
compare_run_all() {
    local seed name
    for seed in $(seq 1 "$SEEDS"); do
        for name in $MODELS; do
            compare_run "$name" "$seed"
        done
    done
}

# compare_reference NAME: the model whose time for UPDATES updates is NAME's equal time.
compare_reference() {
    if declare -F time_reference > /dev/null; then time_reference "$1"; else echo "${MODELS%% *}"; fi
}

# compare_updates_for NAME SEED: how many updates NAME's run with SEED trains.
compare_updates_for() {
    local updates=$UPDATES
    (( LONG && $2 <= LONG_SEEDS )) && updates=$LONG
    if (( TIMED )) && [[ $1 != "$(compare_reference "$1")" ]] && (( updates * 100 < UPDATES * TIME_MARGIN )); then
        updates=$(( (UPDATES * TIME_MARGIN / 100 + SAVE_EVERY - 1) / SAVE_EVERY * SAVE_EVERY ))
    fi
    echo "$updates"
}

compare_run() {
    local name=$1 seed=$2 dir=$OUT/runs/train/$1.s$2 target budget keep checkpoint reference
    target=$(compare_updates_for "$name" "$seed")
    run_args "$name" "$seed"
    if ! grep -qs "done training" "$dir/train.log"; then
        echo "==> $name, seed $seed: $target updates"
        train_run "$dir" "${RUN_ARGS[@]}" --max-update "$target" --validate-interval-updates "$SAVE_EVERY" \
            --save-interval-updates "$SAVE_EVERY"
        python -m define_fairseq.tools.params "${RUN_ARGS[@]}" > "$dir/params.txt" 2> "$dir/params.log"
        python -m define_fairseq.tools.run_points "$dir" index
    fi
    compare_point updates "$name" "$seed" at-updates "$UPDATES"
    if (( LONG && seed <= LONG_SEEDS )); then
        compare_point long "$name" "$seed" at-updates "$LONG"
    fi
    if (( TIMED )); then
        reference=$(compare_reference "$name")
        budget=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['seconds'])" \
            "$OUT/runs/updates/$reference.s$seed/point.json")
        compare_point time "$name" "$seed" within-seconds "$budget"
    fi
    keep=$(cat "$OUT"/runs/*/"$name.s$seed"/point.json 2>/dev/null | python -c "
import json, sys
points = json.load(open(sys.argv[1]))
kept = {json.loads(line)['updates'] for line in sys.stdin}
print(' '.join(name for updates, _, name in points if updates in kept))" "$dir/points.json")
    for checkpoint in "$dir"/checkpoint*.pt; do
        [[ " $keep checkpoint_last.pt " == *" $(basename "$checkpoint") "* ]] || rm -f "$checkpoint"
    done
}

# compare_point REGIME NAME SEED QUERY VALUE: score the checkpoint of NAME's run with SEED that run_points QUERY
# VALUE names (score_checkpoint), into OUT/runs/REGIME/NAME.sSEED; skipped when scored.
compare_point() {
    local regime=$1 name=$2 seed=$3 query=$4 value=$5 run=$OUT/runs/train/$2.s$3 found checkpoint updates seconds
    local dir=$OUT/runs/$regime/$name.s$seed
    [[ -f $dir/score ]] && return 0
    found=$(python -m define_fairseq.tools.run_points "$run" "$query" "$value")
    [[ $found != *$'\n'* ]] || echo "${found%$'\n'*}" >&2  # its warnings: the last line is the point
    IFS=$'\t' read -r checkpoint updates seconds <<< "${found##*$'\n'}"
    [[ -f $checkpoint ]] || { echo "error: $checkpoint was deleted once $run's points were scored; remove $run" \
        "to train it again" >&2; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir"
    cp "$run/params.txt" "$dir/"
    printf '{"run": "../../train/%s.s%s", "updates": %s, "seconds": %s}\n' "$name" "$seed" "$updates" "$seconds" \
        > "$dir/point.json"
    score_checkpoint "$checkpoint" "$dir" > "$dir/score.tmp"
    mv "$dir/score.tmp" "$dir/score"
}

# equal_size FILE BUDGET SIZE LOW HIGH STEP ARGS...: set EQUAL_SIZE to the largest multiple of STEP in [LOW, HIGH]
# at which fairseq-train's ARGS then SIZE (its {} replaced by the size) build a model with no more parameters than
# ARGS then BUDGET (define_fairseq.tools.equal_params). FILE keeps the answer and the arguments it answers; a rerun
# with other arguments into the same OUT stops with an error.
equal_size() {
    local file=$1 budget=$2 size=$3 low=$4 high=$5 step=$6 key
    shift 6
    key=$(printf '%s' "$* | $budget | $size | $low $high $step" | tr -s '[:space:]' ' ')
    if [[ ! -s $file ]]; then
        python -m define_fairseq.tools.equal_params --budget "$budget" --size "$size" --low "$low" --high "$high" \
            --step "$step" -- "$@" > "$file.tmp"
        echo "$key" >> "$file.tmp"
        mv "$file.tmp" "$file"
    elif [[ $(sed -n 2p "$file") != "$key" ]]; then
        echo "error: $file answers other arguments (another -x?); give each setting its own OUT (-o)" >&2
        exit 2
    fi
    EQUAL_SIZE=$(head -1 "$file" | cut -f1)
}

# compare_report METRIC [NOTE...]: OUT/results.md (written through a .tmp name), define_fairseq.tools.compare_runs'
# table of the runs of MODELS under OUT/runs (METRIC names their score), then, after an empty line, the line NOTE
# (its arguments joined by spaces); and OUT/curves.png when matplotlib is installed. Prints the results.
compare_report() {
    local metric=$1 names models plot=(--plot "$OUT/curves.png")
    shift
    read -r -a names <<< "$MODELS"
    models=$(IFS=,; echo "${names[*]}")
    python -c "import matplotlib" 2>/dev/null \
        || { plot=(); echo "note: no matplotlib, so no curves.png (pip install matplotlib)" >&2; }
    {
        python -m define_fairseq.tools.compare_runs "$OUT" --metric "$metric" --models "$models" "${plot[@]}"
        if (( $# )); then
            echo
            echo "$*"
        fi
    } > "$OUT/results.md.tmp"
    mv "$OUT/results.md.tmp" "$OUT/results.md"
    cat "$OUT/results.md"
}
