"""What several studies share, beside the studies and above the engine (:mod:`poslab.experiments`).

- ``fixed_offset``: the retrieval head's rows (accuracy, selected peak, carriers, margins) for the
  fixed-offset studies, and their shared tables;
- ``offset_rows``: per-head and per-layer rows of the two-layer and controls studies;
- ``derive``: quantities derived from stored rows (the dilution law's fit per group);
- ``checks``: study-level validation shared by several studies (rotary-only grids);
- ``charlm``: the character-level language model's recipe, rows and streamed evaluation;
- ``rope_extension``: context extension of a trained RoPE model (schedules, fine-tunes as stages);
- ``longrope_search``: LongRoPE's evolutionary search of per-pair rescale factors;
- ``ranking``: methods ranked by a measure, for the context-extension studies;
- ``leakage_rows``: the leakage studies' rows from the probes of :mod:`poslab.probes.leakage`.

A helper only one study uses stays in that study's module; one that every study needs belongs
to the engine.
"""
