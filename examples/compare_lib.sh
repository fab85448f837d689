# shellcheck shell=bash disable=SC2034
# The comparisons over several seeds (sourced by examples/lib.sh, not run): the examples' compare.sh scripts. Each
# scored run of MODEL[name] with seed S lives in OUT/runs/REGIME/NAME.sS, its score (the metric) in its file `score`.

# The points every comparison scores (compare_run), and its options' defaults before the script's own: equal
# updates after UPDATES, equal time (TIMED=1; -T: none), longer training after LONG (0: none) for seeds
# 1..LONG_SEEDS; EXTRA: fairseq-train arguments given to every model (-x); SCHEDULE: the learning rate's (-S).
TIMED=1 LONG=0 LONG_SEEDS=1 EXTRA="" CORPUS="" SCHEDULE=fixed

# compare_options ARGS...: parse a comparison's command line with getopts: -o OUT, -s SEEDS, -m MODELS, -c CORPUS
# (a corpus folder), -u UPDATES, -T, -L LONG, -n LONG_SEEDS, -i SAVE_EVERY, -x EXTRA, -S SCHEDULE, -d DEVICE,
# -p PRECISION and -h (the script's function `usage`, then exit 0). A bad option prints the usage on stderr and
# exits 2. -d cpu (the default) or cuda (fairseq's default device, the first GPU) and -p fp32 (the default) or bf16
# (training in bfloat16 through define_fairseq.tools.train, scoring in float32) set DEVICE_ARGS and
# EVAL_DEVICE_ARGS. -S cosine sets TIMED=0: a run cut at another's time is not annealed.
compare_options() {
    local opt OPTARG OPTIND=1 device=cpu precision=fp32
    COMPARE_COMMAND="bash $0${*:+ $(printf '%q ' "$@")}"  # kept with every run in OUT/results.json
    COMPARE_COMMAND=${COMPARE_COMMAND% }
    while getopts "o:s:m:c:u:TL:n:i:x:S:d:p:h" opt; do
        case $opt in
            o) OUT=$OPTARG ;; s) SEEDS=$OPTARG ;; m) MODELS=$OPTARG ;; c) CORPUS=$OPTARG ;;
            u) UPDATES=$OPTARG ;; T) TIMED=0 ;; L) LONG=$OPTARG ;; n) LONG_SEEDS=$OPTARG ;;
            i) SAVE_EVERY=$OPTARG ;; x) EXTRA=$OPTARG ;; S) SCHEDULE=$OPTARG ;; d) device=$OPTARG ;;
            p) precision=$OPTARG ;; h) usage; exit 0 ;; *) usage >&2; exit 2 ;;
        esac
    done
    case $SCHEDULE in
        fixed) ;;
        cosine) TIMED=0
            if [[ " $EXTRA " == *" --lr-scheduler"* ]]; then
                echo "error: -S cosine: -x sets --lr-scheduler, which -S cosine sets for every model" >&2; exit 2
            fi ;;
        *) echo "error: -S $SCHEDULE: the schedule is fixed or cosine" >&2; exit 2 ;;
    esac
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
                  [-c CORPUS_DIR] [-x "TRAIN ARGS"] [-S fixed|cosine] [-T] [-d cpu|cuda] [-p fp32|bf16]
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
  - longer training (with -L): after LONG updates, for seeds 1..LONG_SEEDS (default 1); with -S fixed, runs
    already done train on from their last checkpoint (the same run as one trained that long at once), as does a
    run stopped part way.
-S sets the learning rate's schedule, the same for every model (default fixed):
  fixed   the schedule above, which does not depend on the run's length: one run per model and seed
          (OUT/runs/train) gives every point, and a larger -L trains it on;
  cosine  the same warm-up, then a cosine decay to 0 at the run's last update (fairseq's --lr-scheduler cosine,
          --lr-period-updates = the run's updates - the warm-up, --lr-shrink 0): the run's length is part of its
          schedule, so UPDATES and LONG are runs of their own (OUT/runs/train-cosine-UPDATES, -LONG), each finished
          for its budget; a longer -L is a new run, not the shorter one trained on (a run stopped part way still
          goes on from its last checkpoint); no equal-time point (as -T).
-x adds fairseq-train arguments to every model alike; -d cuda and -p bf16 train on the GPU, in bfloat16.
Writes OUT/results.md and OUT/curves.png (validation loss against updates and time; needs matplotlib).
OUT defaults to $OUT. A rerun skips what is done (per schedule and budget); give each setting (-x) and each
schedule (-S) its own OUT.
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

# compare_run_all: for each seed FIRST_SEED..LAST_SEED (-s), compare_run each model of MODELS, in order, once OUT's
# schedule (compare_check_schedule) and, under -S cosine, every budget's schedule (compare_schedule_args) hold.
# compare_run NAME SEED: train NAME with SEED (compare_train), checkpointing and validating every SAVE_EVERY
# updates, score its points, then delete the checkpoints no point uses (compare_prune). Each point lives in
# OUT/runs/REGIME/NAME.sSEED (point.json, params.txt, score): `updates`, the checkpoint after UPDATES updates;
# `long` (when LONG > 0 and SEED <= LONG_SEEDS), after LONG; `time` (when TIMED=1), the last checkpoint within the
# time NAME's reference took for UPDATES updates with the same seed, for which the other models train TIME_MARGIN
# percent of UPDATES (set TIME_MARGIN above the fastest model's speed-up: a model that reaches the end of its run
# before the reference's time gets its last checkpoint, with a warning). The reference is the first model of
# MODELS, or what the script's function time_reference NAME prints (several families, each against its own
# baseline). With -S fixed, one run (OUT/runs/train/NAME.sSEED) gives every point: with a learning-rate schedule
# and data order that do not depend on --max-update (scripts.run_points), each is the checkpoint of a run stopped
# there. With -S cosine, each point is the last checkpoint of a run of its own budget
# (OUT/runs/train-cosine-BUDGET/NAME.sSEED), annealed to 0 there. The script defines run_args NAME SEED, which
# sets the array RUN_ARGS (fairseq-train's arguments, the data folder first), and score_checkpoint CHECKPOINT DIR,
# which prints the point's score (it may leave its files in DIR).
compare_run_all() {
    local seed name budget
    compare_check_schedule
    if [[ $SCHEDULE != fixed ]]; then  # a budget within a model's warm-up stops the script before any training
        for name in $MODELS; do
            run_args "$name" "$FIRST_SEED"
            for budget in "$UPDATES" "$LONG"; do (( budget == 0 )) || compare_schedule_args "$budget"; done
        done
    fi
    for seed in $(seq "$FIRST_SEED" "$LAST_SEED"); do
        for name in $MODELS; do
            compare_run "$name" "$seed"
        done
    done
}

# compare_check_schedule: stop, naming -S, when OUT holds runs of another schedule (OUT/schedule; an OUT made before
# -S existed holds fixed-schedule runs), so that no point of one schedule is scored from, or merged with, the other's;
# else write OUT/schedule.
compare_check_schedule() {
    local found=$SCHEDULE
    if [[ -f $OUT/schedule ]]; then
        found=$(cat "$OUT/schedule")
    elif compgen -G "$OUT/runs/*/*.s*" > /dev/null; then
        found=fixed
    fi
    if [[ $found != "$SCHEDULE" ]]; then
        echo "error: -S $SCHEDULE: $OUT holds runs of the $found schedule; give each schedule its own OUT (-o)" >&2
        exit 2
    fi
    [[ -f $OUT/schedule ]] || { echo "$SCHEDULE" > "$OUT/schedule.tmp$$"; mv "$OUT/schedule.tmp$$" "$OUT/schedule"; }
}

# compare_schedule_args BUDGET: set SCHEDULE_ARGS, the fairseq-train arguments that -S adds after RUN_ARGS for a run
# of BUDGET updates: none for fixed; for cosine, RUN_ARGS' warm-up kept (its last --warmup-updates, 0 without),
# then a cosine from the peak lr to 0 over the rest of BUDGET. Stops when BUDGET is not longer than the warm-up.
compare_schedule_args() {
    local budget=$1 warmup=0 i
    SCHEDULE_ARGS=()
    [[ $SCHEDULE == cosine ]] || return 0
    for (( i = 0; i < ${#RUN_ARGS[@]}; i++ )); do
        case ${RUN_ARGS[i]} in
            --warmup-updates) warmup=${RUN_ARGS[i + 1]} ;; --warmup-updates=*) warmup=${RUN_ARGS[i]#*=} ;;
        esac
    done
    if (( budget <= warmup )); then
        echo "error: -S cosine: a run of $budget updates ends within the warm-up ($warmup updates)" >&2; exit 2
    fi
    # --lr-shrink 0: fairseq's cosine starts a second period at update BUDGET at a tenth of the peak; 0 keeps it 0
    SCHEDULE_ARGS=(--lr-scheduler cosine --lr-period-updates $((budget - warmup)) --lr-shrink 0)
}

# compare_reference NAME: the model whose time for UPDATES updates is NAME's equal time.
compare_reference() {
    if declare -F time_reference > /dev/null; then time_reference "$1"; else echo "${MODELS%% *}"; fi
}

# compare_updates_for NAME SEED: how many updates NAME's run with SEED trains under -S fixed.
compare_updates_for() {
    local updates=$UPDATES
    (( LONG && $2 <= LONG_SEEDS )) && updates=$LONG
    if (( TIMED )) && [[ $1 != "$(compare_reference "$1")" ]] && (( updates * 100 < UPDATES * TIME_MARGIN )); then
        updates=$(( (UPDATES * TIME_MARGIN / 100 + SAVE_EVERY - 1) / SAVE_EVERY * SAVE_EVERY ))
    fi
    echo "$updates"
}

compare_run() {
    local name=$1 seed=$2 budget reference
    run_args "$name" "$seed"
    if [[ $SCHEDULE != fixed ]]; then
        compare_train "$name" "$seed" "$UPDATES"
        compare_point updates "$name" "$seed" "$RUN_DIR" at-updates "$UPDATES"
        compare_prune "$RUN_DIR"
        if (( LONG && seed <= LONG_SEEDS )); then
            compare_train "$name" "$seed" "$LONG"
            compare_point long "$name" "$seed" "$RUN_DIR" at-updates "$LONG"
            compare_prune "$RUN_DIR"
        fi
        return 0
    fi
    compare_train "$name" "$seed" "$(compare_updates_for "$name" "$seed")"
    compare_point updates "$name" "$seed" "$RUN_DIR" at-updates "$UPDATES"
    if (( LONG && seed <= LONG_SEEDS )); then
        compare_point long "$name" "$seed" "$RUN_DIR" at-updates "$LONG"
    fi
    if (( TIMED )); then
        reference=$(compare_reference "$name")
        budget=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['seconds'])" \
            "$OUT/runs/updates/$reference.s$seed/point.json")
        compare_point time "$name" "$seed" "$RUN_DIR" within-seconds "$budget"
    fi
    compare_prune "$RUN_DIR"
}

# compare_train NAME SEED TARGET: train NAME's run with SEED (RUN_ARGS set) to TARGET updates, skipped when done,
# into RUN_DIR: OUT/runs/train/NAME.sSEED under -S fixed (a finished run shorter than TARGET trains on), else
# OUT/runs/train-SCHEDULE-TARGET/NAME.sSEED, the budget's own run.
compare_train() {
    local name=$1 seed=$2 target=$3
    RUN_DIR=$OUT/runs/train/$name.s$seed
    [[ $SCHEDULE == fixed ]] || RUN_DIR=$OUT/runs/train-$SCHEDULE-$target/$name.s$seed
    compare_schedule_args "$target"
    if ! grep -qs "done training" "$RUN_DIR/train.log"; then
        echo "==> $name, seed $seed: $target updates${SCHEDULE_ARGS[0]:+, annealed to 0 there (-S $SCHEDULE)}"
        train_run "$RUN_DIR" "${RUN_ARGS[@]}" "${SCHEDULE_ARGS[@]}" --max-update "$target" \
            --validate-interval-updates "$SAVE_EVERY" --save-interval-updates "$SAVE_EVERY"
        python -m define_fairseq.tools.params "${RUN_ARGS[@]}" > "$RUN_DIR/params.txt" 2> "$RUN_DIR/params.log"
        python -m scripts.run_points "$RUN_DIR" index
    elif (( $(trained_updates "$RUN_DIR") < target )); then
        echo "==> $name, seed $seed: on from $(trained_updates "$RUN_DIR") to $target updates"
        train_more "$RUN_DIR" "${RUN_ARGS[@]}" --max-update "$target" --validate-interval-updates "$SAVE_EVERY" \
            --save-interval-updates "$SAVE_EVERY"
        python -m scripts.run_points "$RUN_DIR" index
    fi
}

# compare_prune RUN: delete RUN's checkpoints but its last and those a scored point of its own names.
compare_prune() {
    local run=$1 keep checkpoint
    keep=$(python -c "
import glob, json, os, sys
run = os.path.realpath(sys.argv[1])
kept = set()
for path in glob.glob(os.path.join(sys.argv[2], 'runs', '*', os.path.basename(run), 'point.json')):
    point = json.load(open(path))
    if os.path.realpath(os.path.join(os.path.dirname(path), point['run'])) == run:
        kept.add(point['updates'])
print(' '.join(name for updates, _, name in json.load(open(os.path.join(run, 'points.json'))) if updates in kept))
" "$run" "$OUT")
    for checkpoint in "$run"/checkpoint*.pt; do
        [[ " $keep checkpoint_last.pt " == *" $(basename "$checkpoint") "* ]] || rm -f "$checkpoint"
    done
}

# compare_point REGIME NAME SEED RUN QUERY VALUE: score the checkpoint of RUN (NAME's run with SEED) that run_points
# QUERY VALUE names (score_checkpoint), into OUT/runs/REGIME/NAME.sSEED; skipped when scored, unless the point was
# scored after another count of updates or from another run (a rerun with another -L).
compare_point() {
    local regime=$1 name=$2 seed=$3 run=$4 query=$5 value=$6 found checkpoint updates seconds scored
    local dir=$OUT/runs/$regime/$name.s$seed link=../../${4#"$OUT/runs/"}
    if [[ -f $dir/score ]]; then
        [[ $query == at-updates ]] || return 0
        scored=$(python -c "import json, sys; p = json.load(open(sys.argv[1])); print(p['updates'], p['run'])" \
            "$dir/point.json")
        [[ $scored == "$value $link" ]] && return 0
        echo "==> $name, seed $seed: the $regime point again, after $value updates (it was after ${scored%% *})"
    fi
    found=$(python -m scripts.run_points "$run" "$query" "$value")
    [[ $found != *$'\n'* ]] || echo "${found%$'\n'*}" >&2  # its warnings: the last line is the point
    IFS=$'\t' read -r checkpoint updates seconds <<< "${found##*$'\n'}"
    [[ -f $checkpoint ]] || { echo "error: $checkpoint was deleted once $run's points were scored; remove $run" \
        "to train it again" >&2; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir"
    cp "$run/params.txt" "$dir/"
    printf '{"run": "%s", "updates": %s, "seconds": %s}\n' "$link" "$updates" "$seconds" > "$dir/point.json"
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

# compare_runs_note REFERENCE: compare_report's note on where the points come from; REFERENCE: whose time is equal.
compare_runs_note() {
    if [[ $SCHEDULE == fixed ]]; then
        echo "Every point comes from one run per model and seed (OUT/runs/train), checkpointed every $SAVE_EVERY" \
            "updates; equal time: the last checkpoint within $1's time."
    else
        echo "Learning rate annealed (-S $SCHEDULE): each point is the last update of a run of its own budget" \
            "(OUT/runs/train-$SCHEDULE-BUDGET), its rate decayed to 0 there; no equal-time point."
    fi
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
        "specials).${2:+ $2} $(compare_runs_note "$1")${EXTRA:+ Every model with: $EXTRA.}"
}
