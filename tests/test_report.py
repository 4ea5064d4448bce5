"""``poslab report``: the page over every stored experiment, as markdown and as self-contained HTML
rendered in headless Chromium (all images load, no console errors)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from poslab.cli import main
from poslab.experiments import run_study
from poslab.experiments.claims import read_claims
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import Inline
from poslab.store import Store
from poslab.studies import get_experiment

SETS = ['grid.encoding=["rope","learned"]', "grid.task.K=[2]", "seeds=2", "train.steps=10", "train.batch_size=16",
        "eval.lengths=[12,20]", "eval.n_sequences=16"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    exp = get_experiment("phenomenon")
    study = apply_overrides(exp.study("quick"), SETS)
    with Store(root / "s.sqlite") as db:
        run_study(exp, study, store=db, out=root / "results" / "phenomenon", progress=False, executor=Inline())
    result = CliRunner().invoke(main, ["report", "--store", str(root / "s.sqlite"), "--results",
                                       str(root / "results"), "--out", str(root / "page" / "report.html")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "phenomenon" in result.output and "finished" in result.output  # the plain listing
    return root


def test_markdown_has_claims_budgets_figures(page):
    md = (page / "page" / "report.md").read_text()
    claims = read_claims(page / "results" / "phenomenon" / "claims.json")
    assert claims
    for c in claims:  # every structured claim, paper beside measured
        assert f"| {c.name} | {c.paper} | {c.measured_text()} |" in md
    verdicts = [c for c in claims if c.role != "check"]  # checks are shown, never counted
    held = sum(c.holds is True for c in verdicts)
    failed = sum(c.holds is False for c in verdicts)
    assert re.search(rf"\| all \|  \| {held} \| {failed} \|", md)
    assert "| seeds | 0, 1 |" in md and "| train steps | 10 |" in md and "| eval lengths | 12, 20 |" in md
    pngs = sorted(p.name for p in (page / "results" / "phenomenon").glob("*.png"))
    assert pngs and all(f"]({os.path.join('..', 'results', 'phenomenon', n)})" in md for n in pngs)


def test_html_is_self_contained(page):
    text = (page / "page" / "report.html").read_text()
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', text)
    assert len(srcs) == len(list((page / "results" / "phenomenon").glob("*.png")))
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<script" not in text and "http" not in text.replace("http-equiv", "")


def _chromium() -> str | None:
    """The browser ``make browser`` (run by .ci/run) installs; the test skips without one."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  const body = document.body.clientWidth;
  const narrow = imgs.filter(i => i.getBoundingClientRect().width < 0.9 * body).length;
  document.title = 'PROBE ' + JSON.stringify({images: imgs.length, loaded: ok, narrow: narrow, body: body});
});
</script>"""


def test_renders_in_headless_chromium(page, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (make browser installs it: apt-get install -y chromium)")
    text = (page / "page" / "report.html").read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probed.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"<title>PROBE (\{.*?\})</title>", done.stdout)
    assert found, done.stdout[:2000]
    counts = json.loads(found.group(1))
    assert counts["images"] == len(list((page / "results" / "phenomenon").glob("*.png"))) > 0
    assert counts["loaded"] == counts["images"]
    assert counts["narrow"] == 0 and counts["body"] > 500, counts  # every figure at the page's full width
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console


def test_html_opens_with_the_counts_then_contents_and_groups_claims_by_role(page):
    text = (page / "page" / "report.html").read_text()
    nav = text.index("<nav>")
    assert text.index("Which published claims reproduced") < nav
    assert '<a href="#phenomenon">phenomenon</a>' in text[nav:text.index("</nav>")] and 'id="phenomenon"' in text
    study = text[text.index('<div class="study">'):]
    assert study.index("The paper beside this run") < study.index("<h4>paper</h4>") < study.index("<figure>")
    claims = read_claims(page / "results" / "phenomenon" / "claims.json")
    roles = [r for r in ("paper", "control", "external", "check") if any(c.role == r for c in claims)]
    assert [study.index(f"<h4>{r}</h4>") for r in roles] == sorted(study.index(f"<h4>{r}</h4>") for r in roles)


def test_long_notes_fold():
    from poslab.report import NOTE_FOLD, _cell

    assert _cell("short note", fold=True) == "short note"
    long = "word " * 40
    folded = _cell(long, fold=True)
    assert folded.startswith("<details><summary>") and long.strip() in folded and NOTE_FOLD < len(long)
