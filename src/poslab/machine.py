"""Facts about the machine a run plans for: its physical memory and the share a run may take.

The ground floor (it imports nothing of poslab): the engine caps its worker count with these,
and a pretrained checkpoint's forward refuses a length whose attention would not fit.
"""

from __future__ import annotations

import os

MEMORY_FRACTION = 0.8  # the share of the machine's memory a run may plan for


def memory_bytes() -> int:
    """The machine's physical memory in bytes (16 GiB where the platform will not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30
