"""Data helpers that need neither fairseq nor torch (character noise for Char2Subword)."""
