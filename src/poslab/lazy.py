"""Modules imported on their first use, not when the importing module loads.

pandas takes about 0.2 s to import here and pulls in some 350 modules. The engine needs it only
to frame result rows, yet every fresh Python (a worker process, a command line, a test's
subprocess) reached it through ``experiments.spec`` at start-up. ``from poslab.lazy import pandas
as pd`` puts that cost where rows are framed; type checkers see the module itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class Lazy:
    """A stand-in for module ``name``: the first attribute read imports it (then every read is the
    module's own attribute, found through ``sys.modules``)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"Lazy({self._name!r})"


if TYPE_CHECKING:
    import pandas as pandas
else:
    pandas = Lazy("pandas")
