"""Char2Subword embeddings (Aguilar et al., 2021): each subword's vector built from its characters.

    characters of the token (+ sinusoidal positions) -> Transformer encoder over characters
    -> Linear(char_dim, d) -> max over characters -> LayerNorm(d)

The characters of every dictionary entry are precomputed into a buffer ``[V, max_chars]`` of character ids:
UTF-8 bytes, with the BPE markers taken off the text and encoded as two special characters instead, so that
"new@@" (subword-nmt: the word continues) and "▁new" (sentencepiece: a word starts) differ from "new"
and character noise never touches a marker. The dictionary's special symbols (``<s>``, ``<pad>``, ``</s>``,
``<unk>``) have learned vectors instead (the padding one stays zero).

The module is a drop-in ``embed_tokens`` (``embedding_dim``, ``padding_idx``, ``num_embeddings``):
``forward(tokens)`` looks tokens up by id. During training it runs the character encoder once per distinct
token of the batch; in eval mode under ``torch.no_grad`` it computes the ``V x d`` table once and reuses it
until a parameter changes or the module switches mode. ``forward(tokens, chars)`` embeds the character strings
given per position instead (``chars [..., M]``, e.g. a misspelled word that the dictionary lacks and that
fairseq would map to ``<unk>``); positions whose ``chars`` row is empty fall back to the token id.
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from define_fairseq.modules.checks import check_probability
from define_fairseq.modules.parameter_cache import ParameterCache

PAD_CHAR = 0
WORD_START_CHAR = 1  # sentencepiece's "▁" prefix
CONTINUES_CHAR = 2  # subword-nmt's "@@" suffix
BYTE_OFFSET = 3
NUM_CHARS = BYTE_OFFSET + 256
SENTENCEPIECE_MARK = "\u2581"
SUBWORD_NMT_MARK = "@@"


def token_characters(symbol: str) -> Tuple[str, bool, bool]:
    """``(text, word_start, continues)``: ``symbol`` without its BPE markers, and which markers it had.

    ``"new@@" -> ("new", False, True)``, ``"▁new" -> ("new", True, False)``, ``"new" -> ("new", False, False)``.
    A symbol that is only a marker keeps it as text (``"@@" -> ("@@", False, False)``).
    """
    word_start = continues = False
    if symbol.endswith(SUBWORD_NMT_MARK) and len(symbol) > len(SUBWORD_NMT_MARK):
        symbol, continues = symbol[: -len(SUBWORD_NMT_MARK)], True
    if symbol.startswith(SENTENCEPIECE_MARK) and len(symbol) > len(SENTENCEPIECE_MARK):
        symbol, word_start = symbol[len(SENTENCEPIECE_MARK) :], True
    return symbol, word_start, continues


def encode_characters(symbol: str, max_chars: Optional[int] = None) -> List[int]:
    """The character ids of a token: ``[WORD_START]`` + UTF-8 bytes + ``[CONTINUES]``, markers as present. With
    ``max_chars`` the bytes are cut so that the whole fits (the markers are always kept)."""
    text, word_start, continues = token_characters(symbol)
    data = [BYTE_OFFSET + b for b in text.encode("utf-8")]
    head = [WORD_START_CHAR] if word_start else []
    tail = [CONTINUES_CHAR] if continues else []
    if max_chars is not None:
        data = data[: max(max_chars - len(head) - len(tail), 0)]
    return head + data + tail


def character_table(symbols: Sequence[str], max_chars: int, skip: Sequence[int] = ()) -> Tensor:
    """``[len(symbols), max_chars]`` long tensor of character ids, right-padded with ``PAD_CHAR``; the rows of
    the indices in ``skip`` (special symbols) stay empty."""
    table = torch.full((len(symbols), max_chars), PAD_CHAR, dtype=torch.long)
    skip = set(skip)
    for i, symbol in enumerate(symbols):
        if i in skip:
            continue
        ids = encode_characters(symbol, max_chars)
        table[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return table


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """``[length, dim]``: sin on the even dimensions, cos on the odd ones (Vaswani et al., 2017)."""
    position = torch.arange(length, dtype=torch.float).unsqueeze(1)
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : dim // 2]
    return table


class Char2SubwordEmbedding(nn.Module):
    """Token embeddings composed from characters. Shapes: ``tokens [*] -> [*, embedding_dim]``;
    ``chars [*, M]`` (optional, character ids as :func:`encode_characters` gives them) per token.

    Args:
        symbols: the dictionary's entries in id order (``dictionary.symbols``).
        padding_idx: the padding id (its vector is zero).
        embedding_dim: the output width d.
        special_indices: ids with learned vectors instead of characters (fairseq: ``range(dictionary.nspecial)``).
        char_dim, layers, heads, ffn_dim: the character Transformer encoder (pre-norm layers).
        max_chars: characters kept per token (markers included); longer tokens are cut.
        dropout: dropout inside the character encoder.
        output_scale: multiplies the output (a model that multiplies embeddings by sqrt(d) passes 1/sqrt(d):
            the LayerNorm already gives unit scale).
    """

    def __init__(
        self,
        symbols: Sequence[str],
        padding_idx: int,
        embedding_dim: int,
        special_indices: Sequence[int] = (),
        char_dim: int = 128,
        layers: int = 2,
        heads: int = 4,
        ffn_dim: int = 512,
        max_chars: int = 24,
        dropout: float = 0.0,
        output_scale: float = 1.0,
    ):
        super().__init__()
        for name, value in (
            ("embedding_dim", embedding_dim),
            ("char_dim", char_dim),
            ("layers", layers),
            ("heads", heads),
            ("ffn_dim", ffn_dim),
            ("max_chars", max_chars),
        ):
            if value < 1:
                raise ValueError(f"Char2SubwordEmbedding: {name}={value} must be at least 1")
        if char_dim % heads:
            raise ValueError(f"Char2SubwordEmbedding: char_dim={char_dim} must be divisible by heads={heads}")
        check_probability(dropout, "dropout", "Char2SubwordEmbedding")
        self.num_embeddings = len(symbols)
        self.padding_idx = padding_idx
        self.embedding_dim = embedding_dim
        self.max_chars = max_chars
        self.output_scale = output_scale
        specials = sorted(set(special_indices) | ({padding_idx} if padding_idx is not None else set()))
        self.register_buffer("chars", character_table(symbols, max_chars, skip=specials), persistent=False)
        is_special = torch.zeros(len(symbols), dtype=torch.bool)
        is_special[specials] = True
        self.register_buffer("is_special", is_special, persistent=False)
        slot = torch.full((len(symbols),), -1, dtype=torch.long)
        slot[specials] = torch.arange(len(specials))
        self.register_buffer("special_slot", slot, persistent=False)
        # (unit scale per dimension, as the LayerNorm gives the composed vectors)
        self.special = nn.Parameter(torch.randn(len(specials), embedding_dim))
        self._pad_slot = specials.index(padding_idx) if padding_idx is not None else None

        self.char_embed = nn.Embedding(NUM_CHARS, char_dim, padding_idx=PAD_CHAR)
        nn.init.normal_(self.char_embed.weight, std=char_dim**-0.5)
        with torch.no_grad():
            self.char_embed.weight[PAD_CHAR].zero_()
        self.register_buffer("positions", sinusoidal_positions(max_chars, char_dim), persistent=False)
        layer = nn.TransformerEncoderLayer(
            char_dim, heads, ffn_dim, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        # (not named "encoder": fairseq upgrades any key ending in "encoder.layers.N.self_attn.in_proj_weight")
        self.char_transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(char_dim)
        self.out_proj = nn.Linear(char_dim, embedding_dim)
        self.layer_norm = nn.LayerNorm(embedding_dim)
        self._table = ParameterCache()  # the eval-mode table of every token, while no parameter changes

    # -- composing from characters ---------------------------------------------------------------------------

    def compose(self, chars: Tensor) -> Tensor:
        """``chars [N, M]`` (non-empty rows) -> ``[N, embedding_dim]``."""
        chars = chars[:, : self.max_chars]
        length = int(chars.ne(PAD_CHAR).sum(dim=1).max().item()) if chars.numel() else 0
        chars = chars[:, : max(length, 1)]
        pad = chars.eq(PAD_CHAR)
        x = self.char_embed(chars) * math.sqrt(self.char_embed.embedding_dim) + self.positions[: chars.size(1)]
        x = self.char_transformer(x, src_key_padding_mask=pad)
        x = self.out_proj(self.final_norm(x))
        x = x.masked_fill(pad.unsqueeze(-1), float("-inf")).max(dim=1).values
        return self.layer_norm(x)

    def _special_vectors(self, slots: Tensor) -> Tensor:
        vectors = self.special[slots]
        if self._pad_slot is not None:
            vectors = vectors * slots.ne(self._pad_slot).unsqueeze(-1).to(vectors.dtype)
        return vectors

    def table(self) -> Tensor:
        """The ``[V, embedding_dim]`` table of every dictionary entry (differentiable; before ``output_scale``)."""
        out = self.special.new_zeros(self.num_embeddings, self.embedding_dim)
        regular = (~self.is_special).nonzero().squeeze(1)
        chunks = [self.compose(self.chars[part]) for part in regular.split(4096)] if len(regular) else []
        if chunks:
            out = out.index_copy(0, regular, torch.cat(chunks))
        specials = self.is_special.nonzero().squeeze(1)
        return out.index_copy(0, specials, self._special_vectors(self.special_slot[specials]))

    @torch.no_grad()
    def set_output_scale(self, output_scale: float) -> None:
        """Change ``output_scale`` and keep every output as it was: the ratio of the old scale to the new one is
        folded into the final LayerNorm's gain and bias and into the special vectors (e.g. to put a module distilled
        at a table's scale into a model that expects unit scale)."""
        if not output_scale > 0:
            raise ValueError(f"Char2SubwordEmbedding: output_scale={output_scale} must be positive")
        ratio = self.output_scale / output_scale
        for tensor in (self.layer_norm.weight, self.layer_norm.bias, self.special):
            tensor.mul_(ratio)
        self.output_scale = float(output_scale)

    def train(self, mode: bool = True):
        if mode:
            self._table.clear()
        return super().train(mode)

    # -- forward ---------------------------------------------------------------------------------------------

    def forward(self, tokens: Tensor, chars: Optional[Tensor] = None) -> Tensor:
        flat = tokens.reshape(-1)
        given = None
        if chars is not None:
            chars = chars.reshape(flat.size(0), -1)
            given = chars.ne(PAD_CHAR).any(dim=1)
        by_id = None if given is None else (~given).nonzero().squeeze(1)
        ids = flat if by_id is None else flat[by_id]
        if not self.training and not torch.is_grad_enabled():
            from_ids = self._table.get(self.parameters(), self.table)[ids]
        else:
            from_ids = self._lookup(ids) if ids.numel() else self.special.new_zeros(0, self.embedding_dim)
        if by_id is None:
            out = from_ids
        else:
            out = from_ids.new_zeros(flat.size(0), self.embedding_dim).index_copy(0, by_id, from_ids)
            rows = given.nonzero().squeeze(1)
            if rows.numel():
                unique, inverse = torch.unique(chars[rows], dim=0, return_inverse=True)
                out = out.index_copy(0, rows, self.compose(unique)[inverse].to(out.dtype))
        out = out.view(*tokens.shape, self.embedding_dim)
        return out * self.output_scale if self.output_scale != 1.0 else out

    def _lookup(self, flat: Tensor) -> Tensor:
        """Each distinct token once: composed from its characters, or its learned vector for a special."""
        unique, inverse = torch.unique(flat, return_inverse=True)
        special = self.is_special[unique]
        vectors = self.special.new_zeros(unique.size(0), self.embedding_dim)
        if bool((~special).any()):
            regular = (~special).nonzero().squeeze(1)
            vectors = vectors.index_copy(0, regular, self.compose(self.chars[unique[regular]]))
        if bool(special.any()):
            idx = special.nonzero().squeeze(1)
            vectors = vectors.index_copy(0, idx, self._special_vectors(self.special_slot[unique[idx]]))
        return vectors[inverse]

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, max_chars={self.max_chars}, "
            f"output_scale={self.output_scale:.4g}"
        )
