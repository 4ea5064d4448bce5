"""Fixtures shared across test modules."""

import pytest


@pytest.fixture
def corpus(tmp_path):
    """A small corpus (4,000 characters): training is fast and the validation split is 400
    characters, so an L = 1000 window reads the corpus's (training) start."""
    path = tmp_path / "corpus.txt"
    words = ["to be or not to be\n", "that is the question\n", "whether tis nobler\n", "in the mind to suffer\n"]
    path.write_text("".join(words[i % 4] for i in range(200))[:4000], encoding="utf-8")
    return path


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``-n auto``) each worker takes its share of the
    cores for torch's intra-op threads, so the workers do not oversubscribe the machine."""
    import os

    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
