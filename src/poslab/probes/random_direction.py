"""The 1/d baseline of the carrier energy, measured (Table 2's "untrained baseline 0.016").

The share of the projected queries' or keys' energy along a random unit direction: its
expectation is 1/d for any distribution, so it is the carrier energy a head with no shared
direction would have.
"""

from __future__ import annotations

import torch

from poslab.probes.carriers import token_keys
from poslab.probes.common import at_last_query, over_chunks

N_DIRECTIONS = 64  # random unit directions averaged over


def random_direction(model, batch, which: str, head: int = 0, n_directions: int = N_DIRECTIONS) -> float:
    """The 1/d baseline, measured: mean over ``n_directions`` random unit directions u (seed 0)
    of E[(u . x)^2] / E||x||^2 for the trained projected queries (``which="q"``) or keys
    (``"k"``) x (layer 0, head ``head``, unrotated). Its expectation is 1/d."""
    g = torch.Generator().manual_seed(0)
    d = model.cfg.d_head
    U = torch.randn(n_directions, d, generator=g, dtype=torch.float64)
    U = U / U.norm(dim=-1, keepdim=True)
    num = den = 0.0
    for _, inter in over_chunks(model, batch):
        li = inter.layers[0]
        if which == "q":
            x = at_last_query(li.q, inter)[:, head].double()  # [b, d]
        else:
            x = li.k[:, head].double()[token_keys(inter)]  # [keys, d]
        num += float((x @ U.T).square().mean(-1).sum())
        den += float(x.square().sum())
    return num / den


def random_directions(model, batch, head: int = 0) -> dict:
    """:func:`random_direction` of the queries and of the keys: ``random_direction_q``, ``random_direction_k``."""
    return {f"random_direction_{w}": random_direction(model, batch, w, head) for w in ("q", "k")}
