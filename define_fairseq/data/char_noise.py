"""Character-level noise (synthetic typos) for words and BPE-segmented sentences.

Used by Char2Subword to make subword vectors robust to misspelled input, and to build noisy copies of test
sets (``python -m define_fairseq.tools.noise_text``). Plain Python: needs neither fairseq nor torch.

The model of noise: every editable character *position* of a word is edited with probability ``rate``,
independently. The edit is drawn uniformly from the enabled ``types`` that apply at that position:

* ``insert``: put one character after it: a QWERTY keyboard neighbour of the character (same case), or a
  random lowercase ASCII letter when the character has no neighbour table (digits, punctuation, non-ASCII);
* ``delete``: remove it; never the last character left in the word;
* ``substitute``: replace it by a keyboard neighbour (same case) for ASCII letters, else by a random
  lowercase ASCII letter; always a different character;
* ``swap``: exchange it with the next character; only when the next character is editable and different;
* ``case``: flip its case; only for characters with a one-character case partner (letters; not digits or
  punctuation).

When no enabled type applies at a selected position (e.g. ``types=("case",)`` on a digit), the position is
left unchanged and no edit is counted. Positions are visited left to right; characters inserted by the noise
are not visited again, and after a swap the next position holds the character that moved there. When the
edits of a word happen to cancel out (delete "a", swap "s" and "a", insert "a" turns "asa" into "asa"), the
word's edits are drawn again (up to ``MAX_REDRAWS`` times), so an edited word is a changed word.

Editable characters are letters, digits, punctuation and symbols (Unicode categories L, N, P, S); whitespace,
control characters and combining marks are never edited or moved, and the noise only ever creates letters,
so it never creates whitespace. Words with fewer than ``min_chars`` characters are left alone (the paper
noises only subwords longer than four characters: ``min_chars=5``).

BPE pieces (``noise_tokens``): subword-nmt pieces carry an ``@@`` suffix when the word continues in the next
piece; sentencepiece pieces carry a ``\u2581`` prefix when they start a word. Markers are never edited. The
pieces of one word are noised as one character sequence, and the segmentation points stay where they were: a
substitution or case flip keeps a character in its piece, an inserted character joins the piece of the
character before it, a swap across a piece boundary exchanges the two characters between the pieces. A
piece that loses all its characters is dropped (never an empty token); the word-start marker or the missing
final ``@@`` then moves to the piece that now starts or ends the word, so the sentence keeps its words.

Determinism: ``sample_rng(seed, epoch, index)`` seeds a ``random.Random`` from a SHA-256 of the three
numbers, the same in every process (Python's own ``hash()`` is salted per process).
"""

import hashlib
import numbers
import operator
import random
import string
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

NOISE_TYPES = ("insert", "delete", "substitute", "swap", "case")

RATE_FLAG = "--c2s-noise-rate"
TYPES_FLAG = "--c2s-noise-types"

SUBWORD_NMT_SUFFIX = "@@"
SENTENCEPIECE_PREFIX = "\u2581"

_LOWERCASE = string.ascii_lowercase
# Edits can cancel out (delete "a", swap "s" and "a", insert "a" gives "asa" back from "asa"); such a pass is
# drawn again, at most this many times, so that a word with an edit is a changed word.
MAX_REDRAWS = 8
_EDITABLE_CATEGORIES = ("L", "N", "P", "S")


def _qwerty_neighbours() -> Dict[str, str]:
    """Keys touching each letter key of a QWERTY keyboard, lowercase.

    The three letter rows start 0, 1/4 and 3/4 of a key to the right (x of key i in row r: i + offset[r]); two
    keys touch when they sit in the same row side by side, or in adjacent rows less than one key apart in x.
    """
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    offsets = (0.0, 0.25, 0.75)
    keys = [(letter, r, i + offsets[r]) for r, row in enumerate(rows) for i, letter in enumerate(row)]
    table = {}
    for letter, r, x in keys:
        table[letter] = "".join(
            other
            for other, r2, x2 in keys
            if other != letter and ((r2 == r and abs(x2 - x) == 1.0) or (abs(r2 - r) == 1 and abs(x2 - x) < 1.0))
        )
    return table


KEYBOARD_NEIGHBOURS = _qwerty_neighbours()


def keyboard_neighbours(char: str) -> str:
    """The QWERTY neighbours of an ASCII letter, in the letter's case; ``""`` for any other character."""
    if char.isascii() and char.isalpha():
        neighbours = KEYBOARD_NEIGHBOURS[char.lower()]
        return neighbours.upper() if char.isupper() else neighbours
    return ""


def is_editable(char: str) -> bool:
    """Whether the noise may edit or move ``char``: letters, digits, punctuation and symbols."""
    return unicodedata.category(char).startswith(_EDITABLE_CATEGORIES)


def case_flip(char: str) -> Optional[str]:
    """``char`` with its case flipped, or None when it has no one-character case partner."""
    flipped = char.swapcase()
    if len(flipped) == 1 and flipped != char and flipped.lower() == char.lower():
        return flipped
    return None


def parse_noise_types(text: str, flag: str = TYPES_FLAG) -> Tuple[str, ...]:
    """Comma-separated noise types (``"insert,swap"``) -> a tuple in ``NOISE_TYPES`` order, without repeats.

    Raises ValueError naming ``flag`` for an unknown or missing type.
    """
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    return _check_types(names, flag)


def _check_types(names: Sequence[str], flag: str = TYPES_FLAG) -> Tuple[str, ...]:
    unknown = [name for name in names if name not in NOISE_TYPES]
    if unknown:
        raise ValueError(
            f"{flag}: unknown noise type(s) {', '.join(map(repr, unknown))}; valid types: {', '.join(NOISE_TYPES)}"
        )
    if not names:
        raise ValueError(f"{flag}: give at least one noise type out of {', '.join(NOISE_TYPES)}")
    return tuple(name for name in NOISE_TYPES if name in names)


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """A ``random.Random`` for one sample, the same for the same (seed, epoch, index) in every process."""
    key = f"{operator.index(seed)}:{operator.index(epoch)}:{operator.index(index)}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


@dataclass
class NoiseStats:
    """Counts gathered by ``CharNoise.noise_word`` / ``noise_tokens`` when given a ``stats`` object.

    ``chars``: editable characters of the words that were eligible (at least ``min_chars`` characters);
    ``edits``: edit operations performed (a swap is one edit); ``ops``: edits per noise type;
    ``words``: words seen; ``words_changed``: words whose characters differ after the noise.
    """

    words: int = 0
    words_changed: int = 0
    chars: int = 0
    edits: int = 0
    ops: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(NOISE_TYPES, 0))

    @property
    def rate(self) -> float:
        """Measured edit rate: edits per eligible character (0 when there were none)."""
        return self.edits / self.chars if self.chars else 0.0


class CharNoise:
    """Random character edits (see the module docstring for the exact model).

    Args:
        rate: probability that an editable character position is edited, in [0, 1] (``--c2s-noise-rate``).
        types: enabled edit types, a subset of ``NOISE_TYPES`` (``--c2s-noise-types``); a comma-separated
            string is accepted too. The order does not matter.
        min_chars: words (for BPE: all pieces of the word, markers excluded) with fewer characters are
            left unchanged.
    """

    def __init__(self, rate: float, types: Union[str, Sequence[str]] = NOISE_TYPES, min_chars: int = 1):
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate <= 1.0:
            raise ValueError(
                f"{RATE_FLAG} must be a number in [0, 1] (probability that a character is edited), got {rate!r}"
            )
        if isinstance(types, str):
            self.types = parse_noise_types(types)
        else:
            self.types = _check_types(list(types))
        if isinstance(min_chars, bool) or not isinstance(min_chars, int) or min_chars < 0:
            raise ValueError(f"min_chars must be a non-negative integer, got {min_chars!r}")
        self.rate = float(rate)
        self.min_chars = min_chars

    def __repr__(self):
        return f"CharNoise(rate={self.rate}, types={self.types}, min_chars={self.min_chars})"

    def noise_word(self, word: str, rng: random.Random, stats: Optional[NoiseStats] = None) -> str:
        """A noised copy of ``word`` (never empty when ``word`` is not)."""
        cells = [[char, 0] for char in word]
        self._noise_word_cells(cells, rng, stats)
        return "".join(char for char, _ in cells)

    def noise_tokens(self, pieces: Sequence[str], rng: random.Random, stats: Optional[NoiseStats] = None) -> List[str]:
        """Noise a BPE-segmented sentence (subword-nmt ``@@`` or sentencepiece ``\u2581`` pieces).

        Pieces are grouped into words: with sentencepiece (some piece starts with ``\u2581``) a word starts at
        each ``\u2581`` piece; otherwise (subword-nmt) a word ends at each piece without the ``@@`` suffix.
        Both markers are kept off the editable characters in either case. Raises ValueError for an empty
        piece.
        """
        parsed = []
        for position, piece in enumerate(pieces):
            if not piece:
                raise ValueError(f"empty BPE piece at position {position} of {list(pieces)!r}")
            starts = piece.startswith(SENTENCEPIECE_PREFIX)
            body = piece[len(SENTENCEPIECE_PREFIX) :] if starts else piece
            continues = body.endswith(SUBWORD_NMT_SUFFIX)
            chars = body[: -len(SUBWORD_NMT_SUFFIX)] if continues else body
            parsed.append((starts, chars, continues))
        sentencepiece = any(starts for starts, _, _ in parsed)

        out: List[str] = []
        word: List[Tuple[bool, str, bool]] = []
        for position, piece in enumerate(parsed):
            new_word = piece[0] if sentencepiece else (position > 0 and not parsed[position - 1][2])
            if new_word and word:
                out.extend(self._noise_word_pieces(word, rng, stats))
                word = []
            word.append(piece)
        if word:
            out.extend(self._noise_word_pieces(word, rng, stats))
        return out

    def _noise_word_pieces(
        self, word: List[Tuple[bool, str, bool]], rng: random.Random, stats: Optional[NoiseStats]
    ) -> List[str]:
        """The pieces of one word (``(starts, chars, continues)`` each), noised and re-marked."""
        cells = [[char, k] for k, (_, chars, _) in enumerate(word) for char in chars]
        self._noise_word_cells(cells, rng, stats)
        new_chars = [""] * len(word)
        for char, k in cells:
            new_chars[k] += char
        # Drop the pieces that lost all their characters (marker-only pieces of the input stay).
        kept = [k for k, (_, chars, _) in enumerate(word) if new_chars[k] or not chars]
        first, last = kept[0], kept[-1]
        pieces = []
        for k in kept:
            starts, _, continues = word[k]
            if k == first:
                starts = starts or word[0][0]
            if k == last:
                continues = word[-1][2]
            pieces.append(
                (SENTENCEPIECE_PREFIX if starts else "") + new_chars[k] + (SUBWORD_NMT_SUFFIX if continues else "")
            )
        return pieces

    def _noise_word_cells(self, cells: List[list], rng: random.Random, stats: Optional[NoiseStats]) -> None:
        """Noise one word in place. ``cells``: ``[char, piece]`` per character; inserted characters take the
        piece of the character before them; a swap exchanges characters and leaves the pieces in place."""
        eligible = len(cells) >= self.min_chars and len(cells) > 0
        if stats is not None:
            stats.words += 1
            if eligible:
                stats.chars += sum(is_editable(char) for char, _ in cells)
        if not eligible or self.rate == 0.0:
            return
        original = [char for char, _ in cells]
        for _ in range(1 + MAX_REDRAWS):
            noised = [list(cell) for cell in cells]
            ops = self._edit_pass(noised, rng)
            changed = [char for char, _ in noised] != original
            if changed or not ops:
                break
        cells[:] = noised
        if stats is not None:
            stats.edits += len(ops)
            for op in ops:
                stats.ops[op] += 1
            stats.words_changed += changed

    def _edit_pass(self, cells: List[list], rng: random.Random) -> List[str]:
        """One left-to-right pass over the positions of ``cells`` (edited in place); the edits performed."""
        ops = []
        j = 0  # index in cells of the position being visited
        for _ in range(len(cells)):
            char = cells[j][0]
            if not is_editable(char) or rng.random() >= self.rate:
                j += 1
                continue
            choices = [op for op in self.types if self._applies(op, cells, j)]
            if not choices:
                j += 1
                continue
            op = rng.choice(choices)
            ops.append(op)
            if op == "insert":
                cells.insert(j + 1, [rng.choice(keyboard_neighbours(char) or _LOWERCASE), cells[j][1]])
                j += 2
            elif op == "delete":
                del cells[j]
            elif op == "substitute":
                cells[j][0] = rng.choice(keyboard_neighbours(char) or [c for c in _LOWERCASE if c != char])
                j += 1
            elif op == "swap":
                cells[j][0], cells[j + 1][0] = cells[j + 1][0], char
                j += 1
            else:  # case
                cells[j][0] = case_flip(char)
                j += 1
        return ops

    @staticmethod
    def _applies(op: str, cells: List[list], j: int) -> bool:
        if op == "delete":
            return len(cells) > 1
        if op == "swap":
            return j + 1 < len(cells) and is_editable(cells[j + 1][0]) and cells[j + 1][0] != cells[j][0]
        if op == "case":
            return case_flip(cells[j][0]) is not None
        return True  # insert, substitute
