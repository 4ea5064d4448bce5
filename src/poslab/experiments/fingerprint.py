"""What judges a claim, as a hash: the canonical form of a claim spec without its prose.

Standalone (no poslab import), so that ``scripts/register_claims.py`` can fingerprint the claim specs
of any earlier revision of poslab with the same rule as today's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

# the fields that say nothing about how a claim is judged: its words, and the inputs whose effect is its role
PROSE = frozenset({"text", "why", "name", "paper", "note", "percent", "revised", "renamed_from", "source", "setting"})


def canonical(value: Any) -> Any:
    """A JSON-able, order-stable form of what judges a claim: prose fields and fields at their default
    left out (so a field added later with a default changes no fingerprint)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if f.name in PROSE or (default is not dataclasses.MISSING and v == default):
                continue
            fields[f.name] = canonical(v)
        return {"__type__": type(value).__name__, **fields}
    if isinstance(value, (tuple, list)):
        return [canonical(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    return value


def digest(what: Any) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()[:16]
