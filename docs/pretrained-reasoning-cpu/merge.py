"""All eight methods' reasoning table and rankings, rendered by the study's own TABLES and
``scale_ranking_rows``: the 2026-12-03 run's store (none, pi, dynamic, ntk_by_parts, llama3, longrope and
the short-context control) with ntk's and yarn's rows read back from the 2026-12-02 run's
table-none-ntk-yarn.md, after checking that both runs' `none` rows agree at the printed digits.

    python docs/pretrained-reasoning-cpu/merge.py STORE > docs/pretrained-reasoning-cpu/eight-methods.md
"""
import sys

from poslab.store import Store
from poslab.studies.pretrained_extension import REASONING, TABLES, scale_ranking_rows

OLD = open("docs/pretrained-reasoning-cpu/table-none-ntk-yarn.md").read()
SHOWN = ("Loss below and past the original context L0", "Reasoning and code: exact match by task",
         "Short-context control: exact match of the untouched checkpoint well within its context",
         "Rankings: methods by exact match against methods by loss past L0 (scale > 1)")


def section(title: str) -> list[dict]:
    """The rows of one markdown table of the old run's table.md, as dicts of its cells."""
    part = OLD.split(f"## {title}")[1].split("\n## ")[0]
    lines = [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[1:]]


def number(cell: str) -> float | None:
    return float(cell.split("±")[0]) if cell else None


old = [dict(probe="summary", method=r["method"], scale=int(r["scale"]), loss_in=number(r["loss < L0"]),
            loss_out=number(r["loss >= L0"]), loss_last_quarter=number(r["last quarter"]), seconds=number(r["seconds"]))
       for r in section("Loss below and past the original context L0")]
old += [dict(probe="reasoning", method=r["method"], scale=int(r["scale"]), task=t, exact=number(r[t]))
        for r in section("Reasoning and code: exact match by task") for t in REASONING]
with Store(sys.argv[1]) as store:
    new = store.rows(keys=[r["key"] for r in store.runs(experiment="pretrained-extension")])

print("# SmolLM2-135M, eight extension methods, zero-shot reasoning (2026-12-03)\n")
print("Made by `python docs/pretrained-reasoning-cpu/merge.py STORE` with the study's own tables: the 2026-12-03 "
      "run (table.md) with NTK and YaRN from table-none-ntk-yarn.md. One example per cell (depth 0.5). "
      "The check: both runs' `none` rows at the printed digits.\n")
agree = True
for o in (r for r in old if r["method"] == "none"):
    n = next(r for r in new if r.get("probe") == o["probe"] and r.get("method") == "none"
             and r.get("scale") == o["scale"] and r.get("task") == o.get("task"))
    keys = ("loss_in", "loss_out") if o["probe"] == "summary" else ("exact",)
    same = all((o[k] is None) == (n.get(k) is None) and (o[k] is None or round(n[k], 3) == o[k]) for k in keys)
    agree &= same
    print(f"- none {o['probe']} x{o['scale']} {o.get('task', '')}: {'same' if same else f'DIFFERS: {n} against {o}'}")
print(f"- none rows agree: {agree}\n")
rows = [r for r in new if r.get("method") not in ("ntk", "yarn")] + [r for r in old if r["method"] in ("ntk", "yarn")]
rows += scale_ranking_rows(rows)
for table in TABLES:
    if table.title in SHOWN:
        print(table.markdown(rows) + "\n")
