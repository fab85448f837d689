"""Write a copy of a word-tokenized text file with synthetic character noise (typos).

    python -m define_fairseq.tools.noise_text --rate 0.05 --seed 1 [--types insert,delete,...]
        [--min-chars N] [--segmented] INPUT OUTPUT

Use it on plain (pre-BPE) text, e.g. to build a noisy-source test set for a robustness evaluation: noise
the raw source side, then apply the same BPE and ``fairseq-preprocess`` as for the clean one. The BPE then
segments a misspelled word afresh, usually into shorter pieces that the dictionary has.

With ``--segmented`` the input is already BPE-segmented (subword-nmt ``@@`` or sentencepiece ``▁``
pieces): the characters of each word are edited and every segmentation point is kept, exactly as the
``translation_c2s`` task noises its training source (``CharNoise.noise_tokens``). An edited piece is then
often missing from the dictionary: fairseq reads it as ``<unk>``, Char2Subword from its letters.

Each line is split at whitespace; every word is noised with ``define_fairseq.data.char_noise.CharNoise``
(see there for the edit types and the exact model), line ``i`` (counting from 0) with the random generator
``sample_rng(seed, 0, i)``, so a line's noise does not depend on the other lines. Whitespace, line ends and
empty lines are copied unchanged. The file is written to ``OUTPUT.tmp`` and renamed to ``OUTPUT`` at the
end, so OUTPUT is never half-written.

Prints the measured character edit rate (edit operations / editable characters of the words with at least
``--min-chars`` characters; a swap is one edit) and how many words changed.
"""

import argparse
import os
import re
from typing import List, Optional

from define_fairseq.data.char_noise import NOISE_TYPES, CharNoise, NoiseStats, parse_noise_types, sample_rng

_SEPARATORS = re.compile(r"(\s+)")


def noise_line(noise: CharNoise, line: str, seed: int, index: int, stats: Optional[NoiseStats] = None) -> str:
    """Line ``index`` of a file, noised word by word with ``sample_rng(seed, 0, index)``; whitespace kept."""
    rng = sample_rng(seed, 0, index)
    parts = _SEPARATORS.split(line)  # words at even positions, whitespace runs at odd ones
    return "".join(part if k % 2 or not part else noise.noise_word(part, rng, stats) for k, part in enumerate(parts))


def noise_segmented_line(noise: CharNoise, line: str, seed: int, index: int, stats: Optional[NoiseStats] = None) -> str:
    """Line ``index`` of a BPE-segmented file, its words noised with ``sample_rng(seed, 0, index)`` and every
    segmentation point kept; pieces are written separated by single spaces, the line end kept."""
    body = line.rstrip("\r\n")
    pieces = body.split()
    if not pieces:
        return line
    return " ".join(noise.noise_tokens(pieces, sample_rng(seed, 0, index), stats)) + line[len(body) :]


def noise_file(noise: CharNoise, input_path: str, output_path: str, seed: int, segmented: bool = False) -> NoiseStats:
    """Noise ``input_path`` line by line into ``output_path`` (via ``output_path + ".tmp"``); ``segmented``:
    the lines are BPE pieces (see :func:`noise_segmented_line`)."""
    if not os.path.isfile(input_path):
        raise FileNotFoundError(f"input file not found: {input_path}")
    tmp_path = output_path + ".tmp"
    stats = NoiseStats()
    try:
        with open(input_path, encoding="utf-8", newline="") as source, open(
            tmp_path, "w", encoding="utf-8", newline=""
        ) as target:
            for index, line in enumerate(source):
                noised = noise_segmented_line if segmented else noise_line
                target.write(noised(noise, line, seed, index, stats))
        os.replace(tmp_path, output_path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    return stats


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (probability that a character is edited), got {text}")
    return rate


def _types(text: str):
    try:
        return parse_noise_types(text, flag="--types")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _min_chars(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq.tools.noise_text",
        description="Write a copy of a word-tokenized text file with synthetic character noise (typos).",
    )
    parser.add_argument("input", metavar="INPUT", help="plain text, one sentence a line, words split by spaces")
    parser.add_argument("output", metavar="OUTPUT", help="where to write the noised copy")
    parser.add_argument("--rate", type=_rate, required=True, help="probability that a character is edited, in [0, 1]")
    parser.add_argument("--seed", type=int, required=True, help="random seed (line i uses (seed, 0, i))")
    parser.add_argument(
        "--types",
        type=_types,
        default=NOISE_TYPES,
        help=f"comma-separated edit types (default: {','.join(NOISE_TYPES)})",
    )
    parser.add_argument(
        "--min-chars", type=_min_chars, default=1, help="leave words with fewer characters unchanged (default: 1)"
    )
    parser.add_argument(
        "--segmented",
        action="store_true",
        help="INPUT is BPE-segmented (@@ or ▁ pieces): edit each word's characters and keep "
        "every segmentation point, as translation_c2s does while training",
    )
    args = parser.parse_args(argv)
    noise = CharNoise(args.rate, args.types, args.min_chars)
    try:
        stats = noise_file(noise, args.input, args.output, args.seed, args.segmented)
    except UnicodeDecodeError as e:
        raise SystemExit(f"error: {args.input} is not UTF-8 text ({e})")
    except OSError as e:  # the message names the file (missing input, unwritable output, ...)
        raise SystemExit(f"error: {e}")
    print(f"wrote {args.output}")
    print(
        f"character edit rate: {stats.rate:.4f} ({stats.edits} edits / {stats.chars} characters of words with "
        f">= {args.min_chars} characters; requested {args.rate})"
    )
    print(f"words changed: {stats.words_changed} of {stats.words}")


if __name__ == "__main__":
    main()
