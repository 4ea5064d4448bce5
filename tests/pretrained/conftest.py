import warnings

import pytest

from poslab.pretrained.tiny import tiny_checkpoint  # imports transformers only when called


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """kind -> the path of a tiny random checkpoint of that architecture (written once)."""
    root = tmp_path_factory.mktemp("tiny")
    made = {}

    def get(kind: str, **options):
        key = (kind, repr(sorted(options.items())))
        if key not in made:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                made[key] = tiny_checkpoint(kind, root / f"{kind}-{len(made)}", **options)
        return made[key]

    return get


@pytest.fixture
def collect_capturing():
    """(model, batch, modules) -> (model.collect(batch), each module's forward output in call order): what a
    checkpoint's own projections gave, beside what collect reports."""
    def run(model, batch, modules):
        outputs = []
        handles = [m.register_forward_hook(lambda mod, args, out: outputs.append(out)) for m in modules]
        try:
            return model.collect(batch), outputs
        finally:
            for h in handles:
                h.remove()
    return run
