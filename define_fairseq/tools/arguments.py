"""argparse types shared by the command-line tools."""

import argparse


def int_at_least(low: int, flag: str):
    """An argparse ``type``: an integer of at least ``low``; the error names ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be at least {low}, got {value}")
        return value

    return parse
