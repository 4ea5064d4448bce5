"""All eight methods' reasoning table and rankings: this run's store (none, pi, dynamic, ntk_by_parts,
llama3, longrope + the short-context control) with ntk and yarn read from the 2026-12-02 run's
table.md (docs/pretrained-reasoning-cpu), after checking that both runs' `none` rows agree."""
import re, sys
from poslab.store import Store
from poslab.studies.pretrained_extension import ranking_rows, REASONING

old = open("docs/pretrained-reasoning-cpu/table-none-ntk-yarn.md").read()
def section(title):
    part = old.split(f"## {title}")[1].split("\n## ")[0]
    rows = [l for l in part.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, [c.strip() for c in r.strip("|").split("|")])) for r in rows[1:]]
num = lambda s: float(s.split("±")[0]) if s else None
old_rows = []
for r in section("Loss below and past the original context L0"):
    old_rows.append(dict(probe="summary", method=r["method"], scale=int(r["scale"]), loss_in=num(r["loss < L0"]),
                         loss_out=num(r["loss >= L0"])))
for r in section("Reasoning and code: exact match by task"):
    for t in REASONING:
        old_rows.append(dict(probe="reasoning", method=r["method"], scale=int(r["scale"]), task=t, exact=num(r[t])))
with Store(sys.argv[1]) as store:
    new = store.rows(keys=[r["key"] for r in store.runs(experiment="pretrained-extension")])
# the check: none's rows of both runs, at the printed digits
ok = True
for o in (r for r in old_rows if r["method"] == "none"):
    n = [r for r in new if r.get("probe") == o["probe"] and r.get("method") == "none" and r.get("scale") == o["scale"]
         and r.get("task") == o.get("task")]
    if o["probe"] == "summary":
        same = round(n[0]["loss_in"], 3) == o["loss_in"] and (o["loss_out"] is None or round(n[0]["loss_out"], 3) == o["loss_out"])
    else:
        same = n[0]["exact"] == o["exact"]
    ok &= same
    print("none", o["probe"], o["scale"], o.get("task", ""), "same" if same else f"DIFFERS {n[0]} vs {o}")
print("none rows agree:", ok)
rows = [r for r in new if r.get("method") not in ("ntk", "yarn")] + [r for r in old_rows if r["method"] in ("ntk", "yarn")]
order = ["none", "pi", "ntk", "dynamic", "ntk_by_parts", "yarn", "llama3", "longrope"]
print("\n## Exact match (one example per cell, depth 0.5) and loss past L0, eight methods\n")
print("| method | scale | " + " | ".join(REASONING) + " | loss >= L0 |")
print("| --- | --- |" + " --- |" * (len(REASONING) + 1))
for m in order:
    for s in (1, 2):
        ex = {r["task"]: r["exact"] for r in rows if r.get("probe") == "reasoning" and r["method"] == m and r["scale"] == s}
        lo = next((r["loss_out"] for r in rows if r.get("probe") == "summary" and r["method"] == m and r["scale"] == s), None)
        print(f"| {m} | {s} | " + " | ".join("" if ex.get(t) is None else f"{ex[t]:.0f}" for t in REASONING)
              + f" | {'' if lo is None else f'{lo:.3f}'} |")
print("\n## Rankings at 2x (16,384 tokens): exact match against loss past L0\n")
print("| task | Kendall tau (8 methods, x2) | best by task | best by loss | short-context exact | can rank |")
print("| --- | --- | --- | --- | --- | --- |")
for r in ranking_rows(rows):
    print(f"| {r['task']} | {'' if r['tau'] is None else format(r['tau'], '.3f')} | {r['best_task'] or ''} | {r['best_loss']} | "
          f"{r['short_exact']:.2f} | {'yes' if r['informative'] else 'no'} |")
