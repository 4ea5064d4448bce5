"""poslab: a laboratory for positional encodings in attention."""

__version__ = "0.1.0"
