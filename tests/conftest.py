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

        threads = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(threads)
        # and the Pythons a test starts (command lines, the GPU script's steps) take the same share: with
        # the default (every core) beside the other workers, OpenMP's threads wait on busy cores, and the
        # LM's quick run took 31.8 s of wall against 3.7 s with one thread (2 cores, both busy)
        os.environ["OMP_NUM_THREADS"] = str(threads)
