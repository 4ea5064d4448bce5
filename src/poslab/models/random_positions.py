"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers"), an extension of a model's embedding step: the positions of a
sequence of s tokens are a sorted sample without replacement from [0, N)::

    positions = sort(sample_s([0, N)))        per sequence; BOS keeps 0 and the sample shifts by 1

instead of 0 .. s - 1, so a model trained on short sequences has seen every position up to N. N must
exceed every training and evaluation length (``Transformer.check_length``). The authors' code
(google-deepmind/randomized_positional_encodings) samples at evaluation too; ``at_eval=False``
evaluates at 0 .. s - 1.

``draw`` says for how many tokens a padded training batch draws: ``"width"`` (the default, and every
stored run before the field) draws s positions for the batch's padded width s, so a sequence of l < s
tokens gets the l smallest of them; ``"length"`` draws each sequence's l positions for its own length, as
the authors' batches (one length, no padding: ``sample_batch(length=L)``) and every evaluation batch do.
Drawn for its own length, a sequence's positions no longer depend on the padding, so the trainer's
``crop_padding`` may cut the batch (``Transformer.padding_inert``).

A model turns it on with ``TransformerConfig(random_positions=RandomPositions(N=...))`` (an integer N
stands for ``RandomPositions(N=N)``). A run's config records it under the flat names it had before it
was an extension (``random_positions`` N, ``random_positions_eval``), so every stored run key still
names its run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.errors import ConfigError, require_positive_int


@dataclass(frozen=True, kw_only=True)
class RandomPositions:
    N: int  # positions are sampled from [0, N)
    at_eval: bool = True  # sample at evaluation too (the authors' code); False: 0 .. s - 1 in eval mode
    draw: str = "width"  # a training sequence's positions drawn for the padded width or its own length (DRAWS)

    def __post_init__(self):
        require_positive_int("random_positions.N", self.N)
        if not isinstance(self.at_eval, bool):
            raise ConfigError("random_positions.at_eval", self.at_eval, "True, False")
        if self.draw not in DRAWS:
            raise ConfigError("random_positions.draw", self.draw, list(DRAWS))

    @classmethod
    def setting(cls, value, path: str = "random_positions") -> RandomPositions | None:
        """The extension a config value stands for: None (off), an integer N, a mapping of this
        class's fields, or a RandomPositions."""
        if isinstance(value, cls) or value is None:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            require_positive_int(path, value)
            return cls(N=value)
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"{path}.{unknown[0]}", unknown[0], sorted(cls.__dataclass_fields__))
            if "N" not in value:
                raise ConfigError(f"{path}.N", None, "a positive integer (the positions' range [0, N))")
            return cls(**value)
        raise ConfigError(path, value, f"null, a positive integer N or an object of {sorted(cls.__dataclass_fields__)}")

    def record(self) -> dict:
        """As a run's config records it (see the module docstring)."""
        return dict(random_positions=self.N, random_positions_eval=self.at_eval, random_positions_draw=self.draw)

    def sample(self, b: int, s: int, device=None, lengths: Tensor | None = None) -> Tensor:
        """[b, s] positions for b sequences of s tokens (see :func:`random_positions`); ``lengths`` [b]:
        each sequence's own tokens, where the draw is per length."""
        return random_positions(b, s, self.N, device, lengths if self.draw == "length" else None)


DRAWS = ("width", "length")


def recorded(extension: RandomPositions | None) -> dict:
    """``extension`` as a run's config records it (off: N None, sampled at evaluation)."""
    off = dict(random_positions=None, random_positions_eval=True, random_positions_draw="width")
    return off if extension is None else extension.record()


def from_recorded(fields: dict) -> RandomPositions | None:
    """The extension of a run's recorded model config (:func:`recorded`'s inverse)."""
    if fields.get("random_positions") is None:
        return None
    return RandomPositions(N=fields["random_positions"], at_eval=fields.get("random_positions_eval", True),
                           draw=fields.get("random_positions_draw", "width"))


def random_positions(b: int, s: int, N: int, device=None, lengths: Tensor | None = None) -> Tensor:
    """Ruoss et al. (2023): for each of b sequences, s positions drawn without replacement from
    [0, N) and sorted, [b, s] long. The s smallest of N uniform keys are a uniform s-subset; drawn
    from torch's generator (under the ensemble's vmap, randomness="different": each member its own).
    A sequence longer than N has no s-subset: one ConfigError naming the model field (studies check
    their grids before any work; this catches a sequence that reaches the model some other way).

    ``lengths`` [b]: sequence i's first l_i tokens take the l_i smallest keys' positions, sorted, a
    uniform l_i-subset whatever s is; its padding takes the next s - l_i, sorted after them. The keys
    are drawn for N whatever s is, so a batch cut to its longest sequence draws the same positions for
    every real token as the padded batch."""
    if s > N:
        raise ConfigError("model.random_positions", N, f"an N of at least the {s} tokens of this sequence")
    keys = torch.rand(b, N, device=device)  # [b, N]
    first = keys.argsort(dim=-1)[:, :s]  # [b, s], the s smallest keys' positions in key order
    if lengths is None:
        return first.sort(dim=-1).values
    padding = torch.arange(s, device=first.device) >= lengths[:, None]  # [b, s]
    order = (first + N * padding).sort(dim=-1).values  # real positions first, each part sorted
    return order - N * (order >= N)
