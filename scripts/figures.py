"""The one way the scripts draw a PNG: matplotlib on its Agg backend, written through a temporary name, and a note
in the file's text chunk that says what data it was drawn from (so ``render_results --check`` can tell a stale
picture without drawing it again, or needing matplotlib)."""

import logging
import struct
import zlib
from pathlib import Path
from typing import Dict

NOTE = "Description"  # the PNG text key that holds the digest of the data a picture was drawn from


def pyplot(purpose: str):
    """matplotlib's pyplot, drawing to files only; exits naming ``purpose`` when matplotlib is missing."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import leaves the root logger at DEBUG
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(f"error: {purpose} needs matplotlib (pip install matplotlib)") from None
    return plt


def save(figure, path: Path, note: str = "", dpi: int = 110) -> None:
    """``figure`` into ``path``, with ``note`` as its text; no software version in it, so that the same drawing
    gives the same bytes under another matplotlib."""
    metadata = {"Software": None, **({NOTE: note} if note else {})}
    tmp = path.with_name(path.name + ".tmp.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(tmp, dpi=dpi, metadata=metadata)
    pyplot("a picture").close(figure)
    tmp.replace(path)


def png_text(path: Path) -> Dict[str, str]:
    """The text chunks (tEXt, zTXt) of a PNG file; empty when it is missing or no PNG."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return {}
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return {}
    found, at = {}, 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        if kind == b"tEXt" and b"\0" in body:
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt" and b"\0" in body:
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = zlib.decompress(value[1:]).decode("latin-1")
        elif kind == b"IEND":
            break
        at += 12 + length
    return found
