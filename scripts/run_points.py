"""The checkpoints of a training run as points of a comparison: after so many updates, or within so much time.

    python -m scripts.run_points RUN_DIR index
    python -m scripts.run_points RUN_DIR at-updates U
    python -m scripts.run_points RUN_DIR within-seconds T

A run trained with ``--save-interval-updates`` keeps ``checkpoint_E_U.pt`` every so many updates (and, at the ends
of epochs, where fairseq writes no such file, ``checkpointE.pt``; and ``checkpoint_last.pt``); each records its
update count and fairseq's cumulative training time (``previous_training_time``: wall-clock seconds since training
began, validations and saves included, the measure ``--stop-time-hours`` stops on). ``index`` writes
``RUN_DIR/points.json`` (``[[updates, seconds, file], ...]``, by updates) once; ``at-updates`` prints the checkpoint
file after exactly U updates and ``within-seconds`` the last one saved within T seconds, each with its updates and
seconds (tab-separated), or stops with an error saying what the run lacks. So one run gives a comparison its
equal-updates point, its equal-time point (at most the baseline's time, to the save interval) and a longer-training
point: fairseq's inverse-square-root schedule and data order do not depend on ``--max-update``, so a run's
checkpoint after U updates is the checkpoint of a run stopped at U.
"""

import argparse
import glob
import json
import os
import re
from typing import List, Optional, Tuple

from define_fairseq.tools.last_checkpoint import checkpoint_point

INDEX = "points.json"
_CHECKPOINT = re.compile(r"^checkpoint(\d+|_\d+_\d+|_last)\.pt$")


def index(run_dir: str) -> List[Tuple[int, float, str]]:
    """``[(updates, seconds, file name)]`` of the run's checkpoints, by updates; read from ``points.json`` when
    there, else from the checkpoints and written there."""
    path = os.path.join(run_dir, INDEX)
    if os.path.isfile(path):
        with open(path) as f:
            return [tuple(p) for p in json.load(f)]
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoint*.pt")))
    points = {}
    for name in names:
        if _CHECKPOINT.match(name):
            updates, seconds = checkpoint_point(os.path.join(run_dir, name))
            if updates not in points or name != "checkpoint_last.pt":
                points[updates] = (updates, seconds, name)
    if not points:
        raise ValueError(f"{run_dir} holds no checkpoint: train it first")
    result = sorted(points.values())
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result


def at_updates(points, updates: int) -> Tuple[int, float, str]:
    for point in points:
        if point[0] == updates:
            return point
    raise ValueError(
        f"no checkpoint after exactly {updates} updates (saved: {[p[0] for p in points]}); "
        f"train with --max-update >= {updates} and a --save-interval-updates that divides it"
    )


def within_seconds(points, seconds: float) -> Tuple[int, float, str]:
    inside = [p for p in points if p[1] <= seconds]
    if not inside:
        raise ValueError(
            f"no checkpoint within {seconds:.0f} s (the first was saved at {points[0][1]:.0f} s); "
            f"save more often (--save-interval-updates)"
        )
    interval = points[-1][1] - points[-2][1] if len(points) > 1 else points[-1][1]
    if inside[-1] is points[-1] and seconds - points[-1][1] > interval:
        print(
            f"warning: the run ended at {points[-1][1]:.0f} s, before {seconds:.0f} s: its last checkpoint "
            f"stands for the equal-time point; train it for more updates",
            flush=True,
        )
    return inside[-1]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.run_points", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("query", choices=("index", "at-updates", "within-seconds"))
    parser.add_argument("value", nargs="?", type=float)
    args = parser.parse_args(argv)
    try:
        points = index(args.run_dir)
        if args.query == "index":
            return
        if args.value is None:
            parser.error(f"{args.query} needs a value")
        if args.query == "at-updates":
            point = at_updates(points, int(args.value))
        else:
            point = within_seconds(points, args.value)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{os.path.join(args.run_dir, point[2])}\t{point[0]}\t{point[1]!r}")  # exact: the next query compares it


if __name__ == "__main__":
    main()
