"""The DeFINE unit's arguments read from a configuration, and the flags that set each (for its errors)."""

# DeFINEEmbedding's arguments (and its adaptive map's factor) -> the flags that set them
DEFINE_FLAGS = dict(
    n="--define-n",
    k="--define-k",
    depth="--define-depth",
    max_groups="--define-max-groups",
    variant="--define-variant",
    activation="--define-activation",
    norm="--define-norm",
    dropout="--define-dropout",
    init="--define-init",
    map_dropout="--define-map-dropout",
    output_norm="--define-output-norm",
    factor="--adaptive-input-factor",
)


def define_options(cfg) -> dict:
    """The DeFINE unit's arguments (``DeFINEEmbedding``'s names, but ``m`` and the map's) from a configuration with
    the define_* fields, as plain values."""
    return dict(
        n=cfg.define_n,
        k=cfg.define_k,
        depth=cfg.define_depth,
        max_groups=cfg.define_max_groups,
        variant=str(cfg.define_variant),
        activation=None if cfg.define_activation is None else str(cfg.define_activation),
        norm=None if cfg.define_norm is None else str(cfg.define_norm),
        dropout=cfg.define_dropout,
        init=str(cfg.define_init),
        map_dropout=getattr(cfg, "define_map_dropout", 0.0),  # absent from the configs of older checkpoints
        output_norm=str(getattr(cfg, "define_output_norm", "none")),  # the same
        token_path=None if getattr(cfg, "define_token_path", None) is None else str(cfg.define_token_path),
    )
