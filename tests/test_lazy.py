"""poslab.lazy: pandas is imported where rows are framed, not when a fresh Python starts poslab (each
worker process, command line and test subprocess paid about 0.2 s for it)."""

import subprocess
import sys

from poslab.lazy import Lazy


def test_starting_the_command_line_and_a_worker_does_not_import_pandas_and_framing_rows_does():
    code = ("import sys; import poslab.cli, poslab.experiments.training, poslab.studies, poslab.experiments.spec; "
            "print('pandas' in sys.modules); from poslab.experiments.rows import frame; "
            "df = frame([{'probe': 'x', 'v': 1}]); print('pandas' in sys.modules, type(df).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "DataFrame"]


def test_a_lazy_module_reads_through_to_the_module():
    import json

    stand_in = Lazy("json")
    assert stand_in.dumps is json.dumps and stand_in.loads("[1]") == [1] and repr(stand_in) == "Lazy('json')"
