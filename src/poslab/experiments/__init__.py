"""The machinery that runs any study: configs and overrides (``config``), the runner
(``runner``), executors, claims as data (``spec``, ``claims``), the report layer (``outputs``)
and the retrieval-head helpers the paper's studies share (``retrieval``).

The studies themselves, one module per published artefact, live in :mod:`poslab.studies`.
"""
