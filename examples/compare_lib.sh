# shellcheck shell=bash disable=SC2034
# The comparisons over several seeds (sourced by examples/lib.sh, not run): the examples' compare.sh scripts. Each
# scored run of MODEL[name] with seed S lives in OUT/runs/REGIME/NAME.sS, its score (the metric) in its file `score`.

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
    COMPARE_COMMAND="bash $0${*:+ $(printf '%q ' "$@")}"  # kept with every run in OUT/results.json
    COMPARE_COMMAND=${COMPARE_COMMAND% }
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
    COMPARE_DEVICE="$device, $precision"
    parse_seeds "$SEEDS"
}

# parse_seeds SEEDS: FIRST_SEED and LAST_SEED of -s SEEDS: N for seeds 1..N, A-B for seeds A..B (several processes
# or machines filling one OUT, each its own seeds); anything else stops with exit status 2.
parse_seeds() {
    if [[ $1 =~ ^([1-9][0-9]*)-([1-9][0-9]*)$ ]] && (( BASH_REMATCH[1] <= BASH_REMATCH[2] )); then
        FIRST_SEED=${BASH_REMATCH[1]} LAST_SEED=${BASH_REMATCH[2]}
    elif [[ $1 =~ ^[1-9][0-9]*$ ]]; then
        FIRST_SEED=1 LAST_SEED=$1
    else
        echo "error: -s $1: the seeds are a count N (1..N) or a range A-B with A <= B" >&2; exit 2
    fi
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
Each model of MODELS trains once per seed 1..SEEDS (default $SEEDS; -s A-B: seeds A..B, so that several
processes fill one OUT: start the others once the first has prepared OUT's data), saving and validating every
INTERVAL updates (default $SAVE_EVERY). MODELS defaults to:
  $MODELS
Its points, scored by $1:
  - equal updates: after UPDATES updates (default $UPDATES);
  - equal time (skipped with -T): the last checkpoint within the time that $2
    took for UPDATES updates with the same seed (the others train $((TIME_MARGIN - 100))% past UPDATES for it);
  - longer training (with -L): after LONG updates, for seeds 1..LONG_SEEDS (default 1); runs already done train
    on from their last checkpoint (the same run as one trained that long at once), as does a run stopped part way.
    python -m scripts.plateau OUT gives the first LONG at which every run had levelled off (its best validation
    perplexity down by less than 1% over the last 20% of its updates; docs/results.md).
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

# compare_run_all: for each seed FIRST_SEED..LAST_SEED (-s), compare_run each model of MODELS, in order.
# compare_run NAME SEED: train NAME with SEED once (OUT/runs/train/NAME.sSEED), checkpointing and validating every
# SAVE_EVERY updates, score its points, then delete the checkpoints no point uses. Each point lives in
# OUT/runs/REGIME/NAME.sSEED (point.json, params.txt, score): `updates`, the checkpoint after UPDATES updates;
# `long` (when LONG > 0 and SEED <= LONG_SEEDS), after LONG; `time` (when TIMED=1), the last checkpoint within the
# time NAME's reference took for UPDATES updates with the same seed, for which the other models train TIME_MARGIN
# percent of UPDATES (set TIME_MARGIN above the fastest model's speed-up: a model that reaches the end of its run
# before the reference's time gets its last checkpoint, with a warning). The reference is the first model of
# MODELS, or what the script's function time_reference NAME prints (several families, each against its own
# baseline). With a learning-rate schedule and data order that do not depend on --max-update
# (scripts.run_points), each is the checkpoint of a run stopped there. The script defines
# run_args NAME SEED, which sets the array RUN_ARGS (fairseq-train's arguments, the data folder first), and
# score_checkpoint CHECKPOINT DIR, which prints the point's score (it may leave its files in DIR).
compare_run_all() {
    local seed name
    for seed in $(seq "$FIRST_SEED" "$LAST_SEED"); do
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
        python -m scripts.run_points "$dir" index
    elif (( $(trained_updates "$dir") < target )); then
        echo "==> $name, seed $seed: on from $(trained_updates "$dir") to $target updates"
        train_more "$dir" "${RUN_ARGS[@]}" --max-update "$target" --validate-interval-updates "$SAVE_EVERY" \
            --save-interval-updates "$SAVE_EVERY"
        python -m scripts.run_points "$dir" index
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
# VALUE names (score_checkpoint), into OUT/runs/REGIME/NAME.sSEED; skipped when scored, unless a point after so many
# updates was scored after others (a rerun with another -L).
compare_point() {
    local regime=$1 name=$2 seed=$3 query=$4 value=$5 run=$OUT/runs/train/$2.s$3 found checkpoint updates seconds
    local dir=$OUT/runs/$regime/$name.s$seed
    if [[ -f $dir/score ]]; then
        [[ $query == at-updates ]] || return 0
        updates=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['updates'])" "$dir/point.json")
        (( updates == value )) && return 0
        echo "==> $name, seed $seed: the $regime point again, after $value updates (it was after $updates)"
    fi
    found=$(python -m scripts.run_points "$run" "$query" "$value")
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
# ARGS then BUDGET (scripts.equal_params). FILE keeps the answer and the arguments it answers; a rerun
# with other arguments into the same OUT stops with an error.
equal_size() {
    local file=$1 budget=$2 size=$3 low=$4 high=$5 step=$6 key
    shift 6
    key=$(printf '%s' "$* | $budget | $size | $low $high $step" | tr -s '[:space:]' ' ')
    if [[ ! -s $file ]]; then
        python -m scripts.equal_params --budget "$budget" --size "$size" --low "$low" --high "$high" \
            --step "$step" -- "$@" > "$file.tmp"
        echo "$key" >> "$file.tmp"
        mv "$file.tmp" "$file"
    elif [[ $(sed -n 2p "$file") != "$key" ]]; then
        echo "error: $file answers other arguments (another -x?); give each setting its own OUT (-o)" >&2
        exit 2
    fi
    EQUAL_SIZE=$(head -1 "$file" | cut -f1)
}

# compare_report METRIC [NOTE...]: scripts.compare_runs over every scored run under OUT/runs (those
# of MODELS first, in its order, then any other model's that a process filling the same OUT scored: the union, so
# that processes with different -m or -s lose none of each other's runs). Under a lock it merges them into
# OUT/results.json (per model, regime and seed: score, parameters, updates, seconds, the command, the revision,
# the machine; docs/results.md) and writes OUT/results.md (the table, then, after an empty line, the line NOTE: its
# arguments joined by spaces), each through a temporary name; and OUT/curves.png when matplotlib is installed.
# Prints the results.
compare_report() {
    local metric=$1 names models plot=(--plot "$OUT/curves.png")
    shift
    read -r -a names <<< "$MODELS"
    models=$(IFS=,; echo "${names[*]}")
    python -c "import matplotlib" 2>/dev/null \
        || { plot=(); echo "note: no matplotlib, so no curves.png (pip install matplotlib)" >&2; }
    python -m scripts.compare_runs "$OUT" --metric "$metric" --models "$models" "${plot[@]}" \
        --group "$(basename "${CORPUS:-default corpus}")" --command "${COMPARE_COMMAND:-not recorded}" \
        --device "${COMPARE_DEVICE:-not recorded}" --report "$OUT/results.md" --note "$*" > /dev/null
    cat "$OUT/results.md"
}

# ------------------------------------------------------------------------------------ language-model comparisons

# lm_compare_usage MODELS_TEXT SCORE REFERENCE: the usage of a language-model comparison: its options, the text it
# reads (lm_corpus_usage), MODELS_TEXT on its models, then compare_usage_points SCORE REFERENCE.
lm_compare_usage() {
    compare_usage_line
    echo
    lm_corpus_usage
    printf '\n%s\n' "$1"
    compare_usage_points "$2" "$3"
}

# lm_compare_start ARGS...: once a language-model comparison has set its defaults and its MODEL array, parse its
# command line ARGS (compare_options), check the models and points, and make OUT's word-level data (lm_data); V is
# the vocabulary's size.
lm_compare_start() {
    compare_options "$@"
    require_tools python fairseq-preprocess fairseq-eval-lm
    compare_check_models
    compare_check_points
    mkdir -p "$OUT"
    lm_data "$OUT" "$CORPUS"
    V=$(vocabulary_size "$OUT")
}

# lm_compare_report REFERENCE [NOTE]: run a language-model comparison (compare_run_all) and report its test
# perplexities (compare_report); REFERENCE says whose time the equal time is, NOTE follows the vocabulary's size.
lm_compare_report() {
    compare_run_all
    compare_report "test perplexity" "Vocabulary: $V symbols (words seen at least 3 times in train, plus fairseq's" \
        "specials).${2:+ $2} Every point comes from one run per model and seed (OUT/runs/train), checkpointed every" \
        "$SAVE_EVERY updates; equal time: the last checkpoint within $1's time.${EXTRA:+ Every model with: $EXTRA.}"
}
