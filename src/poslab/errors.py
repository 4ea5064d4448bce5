"""One error type for bad input.

Every check on user input raises :class:`ConfigError` before any work is done. The message names
the offending field, the value given and what is allowed, so a researcher can fix the command
line without reading code. The command line turns it into one line on stderr and exit code 2.
"""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Bad input, caught before any training starts or anything is written."""

    def __init__(self, field: str, value: object, allowed: str | Iterable[object]):
        if not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: got {value!r}; allowed: {allowed}")

    def __reduce__(self):
        """Rebuilt from its three fields, so the error survives the trip back from a worker process
        (the default pickling would call ``__init__`` with the message alone)."""
        return (type(self), (self.field, self.value, self.allowed))


def check_choice(field: str, value: object, allowed: Iterable[object]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(field, value, allowed)


def require_int(field: str, value: object, lo: int, allowed: str | None = None) -> None:
    """Raise ConfigError unless ``value`` is an int (not a bool) >= ``lo``; ``allowed`` says what is (default:
    "an integer >= lo")."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ConfigError(field, value, allowed or f"an integer >= {lo}")


def require_positive_int(field: str, value: object) -> None:
    """Raise ConfigError unless ``value`` is an int (not a bool) >= 1."""
    require_int(field, value, 1, "a positive integer")
