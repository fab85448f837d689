"""fairseq tasks of the plugin (imported for ``--user-dir``)."""

import importlib
import pkgutil

# Import every module of this package, so each registers itself with fairseq.
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
