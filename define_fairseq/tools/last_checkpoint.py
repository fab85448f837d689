"""Put back a ``checkpoint_last.pt`` that a killed run left truncated, so that the run resumes.

fairseq writes the first file of each save atomically (a temporary file, then a rename) and copies it to the
other names of that save (``checkpoint_last.pt``, ``checkpoint_best.pt``) with a plain copy. A run killed during
that copy leaves a truncated ``checkpoint_last.pt``, and starting it again stops on the damaged file. The first file
of the same save is complete and holds the same bytes, so putting it back in place (atomically) resumes the run
where the killed one last saved::

    python -m define_fairseq.tools.last_checkpoint SAVE_DIR

``python -m define_fairseq.tools.train`` (the recipes' training command) does this before training. A readable
``checkpoint_last.pt``, or none, is left as it is. That command also reads :func:`last_updates`: a run killed after
its final save but before it exited is finished, where fairseq-train would take one more update on resuming.
"""

import argparse
import glob
import logging
import os
import shutil
import zipfile
from typing import Optional, Tuple

import torch

logger = logging.getLogger(__name__)

LAST = "checkpoint_last.pt"


def readable(path: str) -> bool:
    """Whether ``path`` is a whole ``torch.save`` file: a zip archive whose directory (written last) is there."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def repair_last_checkpoint(save_dir: str) -> Optional[str]:
    """Replace an unreadable ``save_dir/checkpoint_last.pt`` by the newest readable checkpoint of ``save_dir``
    (by modification time: the first file of the save whose copy was cut, or an earlier one). Returns that file,
    or None when there was nothing to repair. Raises ``FileNotFoundError`` when no readable checkpoint is left."""
    last = os.path.join(save_dir, LAST)
    if not os.path.exists(last) or readable(last):
        return None
    others = [path for path in glob.glob(os.path.join(save_dir, "checkpoint*.pt")) if os.path.basename(path) != LAST]
    for path in sorted(others, key=os.path.getmtime, reverse=True):
        if readable(path):
            temporary = f"{last}.repair{os.getpid()}"
            shutil.copyfile(path, temporary)
            os.replace(temporary, last)
            logger.warning(f"{last} was truncated (a run killed while fairseq copied it); replaced by {path}")
            return path
    raise FileNotFoundError(
        f"{last} is truncated and {save_dir} holds no other readable checkpoint to resume from; remove {last} to "
        f"train from the start"
    )


def checkpoint_point(path: str) -> Tuple[int, float]:
    """(updates, cumulative training seconds) recorded in a fairseq checkpoint."""
    # Our own run's file; fairseq stores its config objects, which the weights-only loader refuses.
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    try:
        updates = int(state["optimizer_history"][-1]["num_updates"])
        seconds = float(state["extra_state"]["previous_training_time"])
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{path} is not a fairseq training checkpoint (no update count or training time)") from None
    return updates, seconds


def last_updates(save_dir: str) -> Optional[int]:
    """The update count of ``save_dir/checkpoint_last.pt`` (None without one)."""
    last = os.path.join(save_dir, LAST)
    return checkpoint_point(last)[0] if os.path.exists(last) else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("save_dir", help="the run's --save-dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    used = repair_last_checkpoint(args.save_dir)
    print(f"{LAST}: {'replaced by ' + used if used else 'readable or absent, left as it is'}")


if __name__ == "__main__":
    main()
