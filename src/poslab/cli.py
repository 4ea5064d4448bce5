"""The command line: thin wrappers over plain functions.

    poslab list                                   encodings (with metadata), tasks, experiments
    poslab run EXPERIMENT|all [--preset paper|quick] [--seeds N] [--set key=value ...]
                          [--device cpu|cuda] [--out DIR] [--store PATH] [--force | --reevaluate]
                          [--executor auto|local|inline|ray [--address ADDR] [--task-cpus N]]
    poslab report [--store PATH] [--results DIR] [--out FILE.html]
                                                  what the store holds; one HTML + markdown page
    poslab encodings [--store PATH] [--cost-lengths 64,256,1024] [--layout NAME|PATTERN ...]
                                                  the survey table: cost and extrapolation measured
    poslab bench train [--steps N] [--plain-steps N] [--scaling 6,12,24,48|none]
    poslab bench eval [--lengths 1000,...,1000000] [--figure PATH]   streamed evaluation to 10^6
    poslab bench eval --model lm [--lengths 1000,10000,30000] [--device cuda]   the LM's position-wise loss
    poslab bench profile [EXPERIMENT] [--preset P] [--set key=value]   where one study's wall time goes
    poslab bench floor [EXPERIMENT ...] [--preset P]   the training's matmul FLOPs over this CPU's rate
    poslab bench ensemble [EXPERIMENT] [--preset cpu]   a preset's training: ensembles vs the plain loop
    poslab bench parity [--device cpu|cuda]   ensemble = solo: Table 1's groups as ensembles and each seed alone

Bad input stops before any work with one line naming the field and the allowed values, exit 2.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from poslab.errors import ConfigError, check_choice


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            click.echo(f"poslab: error: {e}", err=True)
            sys.exit(2)
        except click.UsageError as e:  # a malformed command line: the same one line, exit 2
            if type(e).__name__ == "NoArgsIsHelpError":  # `poslab bench` alone: click shows the help
                raise
            click.echo(f"poslab: error: {_usage_line(e)}", err=True)
            sys.exit(2)


def _usage_line(e: click.UsageError) -> str:
    """click's usage error as ``field: got ...; allowed: ...`` (its own text names the option)."""
    message = " ".join(e.format_message().split())
    ctx = e.ctx
    allowed = f"see `{ctx.command_path} --help`" if ctx is not None else "see `poslab --help`"
    field = getattr(e, "param_hint", None) or getattr(getattr(e, "param", None), "name", None) or "command line"
    if isinstance(field, (list, tuple)):
        field = " / ".join(field)
    return f"{field}: {message}; allowed: {allowed}"


@click.group(cls=_Group)
def main():
    """poslab: a laboratory for positional encodings in attention."""


@main.command("list")
def list_cmd():
    """Every encoding with its metadata, every task and every experiment, with the package each came
    from ("poslab" for built-ins; others are plugins, see poslab.plugins)."""
    from poslab import plugins
    from poslab.positional import ENCODINGS, small_encoding
    from poslab.studies import EXPERIMENTS
    from poslab.tasks import TASKS

    header = ("encoding", "kind", "sites", "extra parameters", "cost", "KV cache", "reference", "package")
    rows = []
    for name in ENCODINGS:
        m = small_encoding(name).meta  # sites and KV cache are read off a built instance
        rows.append((name, m.kind, ", ".join(m.sites) or "-", m.parameters, m.cost, "yes" if m.kv_cache else "no",
                     m.reference, plugins.origin("encodings", name)))
    click.echo(_table(header, rows))
    click.echo("")
    options = lambda t: ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(t))  # noqa: E731
    click.echo(_table(("task", "options", "package"),
                      [(n, options(t), plugins.origin("tasks", n)) for n, t in TASKS.items()]))
    click.echo("")
    click.echo(_table(("experiment", "reproduces", "package"),
                      [(n, m.title, plugins.origin("studies", n)) for n, m in EXPERIMENTS.items()]))
    extra = [(kind, n, plugins.origin(kind, n)) for kind, names in
             (("schedules", [n for n in _schedules() if plugins.origin("schedules", n) != plugins.BUILTIN]),
              ("probes", list(plugins.probes()))) for n in names]
    if extra:  # plugins' rope schedules and probes (poslab's own are listed in their modules' docstrings)
        click.echo("")
        click.echo(_table(("plugin kind", "name", "package"), extra))


def _schedules() -> list[str]:
    from poslab.positional import ROPE_SCHEDULES

    return list(ROPE_SCHEDULES)


def _table(header, rows) -> str:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


@main.command()
@click.argument("experiment")
@click.option("--preset", default="paper", show_default=True, help="paper | quick")
@click.option("--seeds", type=int, default=None, help="number of seeds (seeds 0..N-1); default: the preset's")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override any config field by dotted path, e.g. train.steps=100 (repeatable)")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda")
@click.option("--executor", default="auto", show_default=True,
              help="auto (worker processes; a run estimated under 4 s of training trains in this process) | "
                   "local (worker processes) | inline | ray")
@click.option("--address", default=None, help="with --executor ray: the Ray cluster (host:port, or auto); "
                                               "default: a local Ray instance")
@click.option("--task-cpus", type=int, default=1, show_default=True, help="with --executor ray: CPUs per Ray task")
@click.option("--workers", type=int, default=None,
              help="groups trained at once in worker processes (default: one per CPU core, at most one per group)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="default: results/<experiment>/")
@click.option("--store", type=click.Path(path_type=Path), default=Path("runs/poslab.sqlite"), show_default=True)
@click.option("--force", is_flag=True, help="retrain members the store already holds")
@click.option("--reevaluate", is_flag=True,
              help="train nothing: probe the stored weights again and rewrite the rows, tables and claims "
                   "(after a probe or criterion changed)")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--corpus", type=click.Path(path_type=Path), default=None,
              help="a UTF-8 text file for a text task (default: the packaged TinyShakespeare)")
@click.option("--model", "checkpoint", default=None,
              help="a pretrained study's checkpoint: smollm2-135m, a Hugging Face directory, a .gguf file or a hub id")
@click.option("--print-config", is_flag=True,
              help="print the resolved study (config, members, steps, lengths) and run nothing")
# max-args: one parameter per option, as click passes them (docs/complexity.md)
def run(experiment, preset, seeds, overrides, device, executor, address, task_cpus,  # noqa: PLR0913
        workers, out, store, force, reevaluate, progress, corpus, checkpoint, print_config):
    """Reproduce one published experiment: train, probe, and write its table and figures."""
    from poslab.experiments import describe
    from poslab.experiments import run as run_studies
    from poslab.experiments.runner import prepare
    from poslab.studies import PAPER_STUDIES, get_experiment

    names = list(PAPER_STUDIES) if experiment == "all" else [experiment]  # all: the seed paper, in order
    if print_config:  # the preset resolved, --seeds, --set, --corpus and --model applied; nothing run
        for exp in map(get_experiment, names):
            study = prepare(exp, preset, seeds=seeds, overrides=overrides, corpus=corpus, checkpoint=checkpoint)
            click.echo(describe(exp, study))
        return

    def said(name: str, summary: dict, folder: Path) -> None:
        done = (f"re-evaluated {summary['reevaluated']} from {store}" if reevaluate else
                f"trained {summary['trained']}, reused {summary['reused']} from {store}")
        click.echo(f"{name}: {summary['members']} members, {done} ({summary['seconds']:.1f} s)"
                   + (f"; {summary['variants']} evaluate-only variants, evaluated {summary['evaluated']}"
                      if summary["variants"] else ""))
        for f in summary["files"]:
            click.echo(f"  wrote {f}")
        table = folder / "table.md"
        if table.exists() and len(names) == 1:
            click.echo("")
            click.echo(table.read_text())

    run_studies([get_experiment(n) for n in names], preset, store=store, out=out, seeds=seeds, overrides=overrides,
                device=device, executor=executor, address=address, task_cpus=task_cpus, workers=workers,
                force=force, reevaluate=reevaluate, progress=progress, corpus=corpus, checkpoint=checkpoint,
                on_study=said)


@main.command()
@click.option("--store", type=click.Path(path_type=Path), default=Path("runs/poslab.sqlite"), show_default=True)
@click.option("--cost-lengths", default="64,256,1024", show_default=True,
              help="lengths at which each encoding's forward is timed on a tiny model; 'none' skips it")
@click.option("--layout", "layouts", multiple=True,
              help="also a per-layer layout, by pattern ('rope,rope,rope,nope') or name (rnope, swan, irope); "
                   "repeatable; 'named': every named one")
def encodings(store, cost_lengths, layouts):
    """The survey's comparison of every encoding: metadata, measured cost, and extrapolation measured
    from the store; with --layout, the same columns for per-layer layouts."""
    from poslab.models.layout import NAMED
    from poslab.survey import HEADER, check_layouts, comparison_rows, layout_rows

    lengths = _int_list("--cost-lengths", cost_lengths, 2, 65536, none=True)
    layouts = tuple(n for v in layouts for n in (NAMED if v == "named" else (v,)))
    check_layouts(layouts)
    rows = comparison_rows(store, lengths) + layout_rows(store, layouts, lengths)
    click.echo(_table(tuple(HEADER.values()), [tuple(r[k] for k in HEADER) for r in rows]))


@main.command()
@click.option("--store", type=click.Path(path_type=Path), default=Path("runs/poslab.sqlite"), show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=None,
              help="where each experiment's table, claims.json and figures are (RESULTS/<experiment>/); "
                   "default: the folder each study last wrote to (recorded in the store)")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/report.html"), show_default=True,
              help="the HTML page; the markdown goes beside it with suffix .md")
def report(store, results, out):
    """What the store holds, and one page (HTML + markdown) over every stored experiment."""
    from poslab.report import store_listing, write_report
    from poslab.store import Store

    if not store.is_file():
        raise ConfigError("--store", str(store), "the path of an existing store (run an experiment first)")
    if out.suffix.lower() not in (".html", ".htm"):
        raise ConfigError("--out", str(out), "a path ending in .html (the markdown goes beside it as .md)")
    if out.exists() and not out.is_file() or (out.parent.exists() and not out.parent.is_dir()):
        raise ConfigError("--out", str(out), "a file path in a writable directory")
    with Store(store) as db:
        listing = store_listing(db)
    click.echo(_table(("experiment", "status", "runs"), listing))
    try:
        page, md = write_report(store, results, out)
    except OSError as e:
        raise ConfigError("--out", str(out), f"a file path in a writable directory ({e.strerror})") from None
    click.echo(f"wrote {page}\nwrote {md}")


@main.command("claims")
@click.argument("study")
@click.option("--results", type=click.Path(path_type=Path), default=None,
              help="the folder holding the study's claims.json (default: the one it last wrote to, recorded "
                   "in --store)")
@click.option("--store", type=click.Path(path_type=Path), default=Path("runs/poslab.sqlite"), show_default=True)
def claims_cmd(study, results, store):
    """A study's stored claims, each revised claim's registered criterion and verdict beside the current ones,
    and the counts per role as first registered and as revised."""
    from poslab.experiments import registry
    from poslab.experiments.claims import claims_markdown, counts_both, read_claims
    from poslab.store import Store
    from poslab.studies import get_experiment

    name = get_experiment(study).name
    if results is None:
        folder = None
        if store.is_file():
            with Store(store) as db:
                folder = db.outputs().get(name)
        if folder is None:
            raise ConfigError("--results", "(none)", f"the folder holding {name}'s claims.json (no run of {name} "
                                                     f"is recorded in {store})")
        results = Path(folder)
    path = results / "claims.json" if (results / "claims.json").is_file() else results / name / "claims.json"
    if not path.is_file():
        raise ConfigError("--results", str(results), f"a folder holding {name}'s claims.json")
    claims = registry.registered(name, read_claims(path))
    click.echo(claims_markdown(claims))
    click.echo(f"\ncounts (yes / no / n.a.): {counts_both(claims)}")
    revised = sum(bool(c.registered) for c in claims)
    unregistered = "" if registry.ledger_path(name).exists() else f"; {name} has no ledger (scripts/register_claims.py)"
    click.echo(f"{len(claims)} claims, {revised} revised after their first verdict{unregistered}")


@main.command()
def models():
    """Position encodings of representative LLMs (published configs), with poslab's computed columns."""
    from poslab.pretrained.table import HEADER, table_rows

    click.echo(_table(tuple(HEADER.values()), [tuple(r[k] for k in HEADER) for r in table_rows()]))


@main.command("inspect")
@click.argument("path")
@click.option("--parity", is_flag=True,
              help="load the weights and measure poslab's rotary (forward and collect) against the checkpoint's "
                   "own forward: max |delta logit| / max |logit| per length against its threshold, pass or fail "
                   "(exit 1 on a fail)")
@click.option("--lengths", default=None, help="token counts for --parity, e.g. 16,48 (default: 16 and 48, "
                                              "or past a sliding window; within 3/4 of the context)")
def inspect_cmd(path, parity, lengths):
    """The same columns as `poslab models` for any config.json, model directory, GGUF file or
    built-in model (one row per layer type where the types' rope settings differ)."""
    from poslab.pretrained.loading import shared_gguf_reader
    from poslab.pretrained.table import HEADER, inspect_rows

    if lengths is not None and not parity:
        raise ConfigError("--lengths", lengths, "used with --parity only")
    with shared_gguf_reader():  # one parse of a GGUF header for the config, the load and the rows
        model, wanted = _parity_model(path, lengths) if parity else (None, None)  # refusals before any output
        rows = inspect_rows(path)
    click.echo(_table(tuple(HEADER.values()), [tuple(row[k] for k in HEADER) for row in rows]))
    for row in rows:
        if row.get("notes"):
            click.echo(f"layers also: {row['notes']}")
    if model is not None:
        _parity(model, path, wanted)


def _parity_model(path: str, lengths: str | None):
    """`inspect --parity`'s refusals: before the weights are read (no weights, files cut short, no
    rotary, an architecture poslab does not replace, a length), then as they are (a tokenizer past
    the embedding, a forward that fails, attention that is not recorded). The loaded model and the
    lengths asked for (None: the default)."""
    from poslab.pretrained.checks import preflight, require_capable
    from poslab.pretrained.loading import read_causal_config, resolve
    from poslab.pretrained.model import load
    from poslab.pretrained.table import entry_from_config

    config = read_causal_config(resolve(path, field="PATH"), "PATH")
    if entry_from_config(config)["encoding"] != "rope":
        raise ConfigError("--parity", path, "a checkpoint with rotary position embedding")
    require_capable(config, ("schedule", "record"), "--parity", path)
    context = config.get("max_position_embeddings") or config.get("n_positions")
    wanted = _int_list("--lengths", lengths, 2, context) if lengths is not None else None
    model = load(path, quiet=True)
    preflight(model, ("record", "schedule"), "--parity", path, compare=False)  # it runs, recorded and rescheduled
    return model, wanted


def _parity(model, path: str, wanted: tuple[int, ...] | None) -> None:
    """`inspect --parity`: the table of :func:`~poslab.pretrained.model.parity` with each length's
    relative measure, threshold and verdict (:func:`~poslab.pretrained.checks.parity_verdict`); exit 1
    on a fail."""
    from poslab.pretrained.checks import PARITY_RELATIVE, parity_verdict, run_checked
    from poslab.pretrained.model import parity

    rows = [parity_verdict(r) for r in run_checked(lambda: parity(model, wanted), "--parity", path,
                                                   "a checkpoint whose rotary poslab can replace (with poslab's "
                                                   "in its place the forward fails")]
    click.echo("\nparity with the checkpoint's own forward (random tokens; poslab's rotary, own schedule): "
               "max |d logit| / max |logit|, forward and collect, against the threshold "
               f"max({PARITY_RELATIVE:g}, L x 2^-23) at L tokens (float32 rounding: pretrained/checks.py)")
    click.echo(_table(("tokens", "max |logit|", "forward max |d logit|", "collect max |d logit|", "forward / max",
                       "collect / max", "threshold", "verdict"),
                      [(str(r["length"]), f"{r['logit_scale']:.3g}", f"{r['forward']:.2e}", f"{r['collect']:.2e}",
                        f"{r['forward_relative']:.2e}", f"{r['collect_relative']:.2e}", f"{r['tolerance']:.1e}",
                        "pass" if r["pass"] else "FAIL") for r in rows]))
    failed = [str(r["length"]) for r in rows if not r["pass"]]
    if failed:
        click.echo(f"parity: FAIL at {', '.join(failed)} tokens", err=True)
        sys.exit(1)
    click.echo("parity: pass")


@main.group()
def bench():
    """Benchmarks (not tests)."""


@bench.command("train")
@click.option("--steps", type=int, default=4000, show_default=True, help="ensemble steps (4000 = Table 1)")
@click.option("--plain-steps", type=int, default=200, show_default=True, help="steps of the plain loop to time")
@click.option("--workers", type=int, default=None, help="worker processes (default: one per core, one per group)")
@click.option("--scaling", default="6,12,24,48", show_default=True,
              help="ensemble sizes to time for the fixed + marginal fit (comma-separated; 'none' skips it)")
@click.option("--scaling-steps", type=int, default=100, show_default=True, help="steps timed per size")
def bench_train(steps, plain_steps, workers, scaling, scaling_steps):
    """Table 1 training as its ensembles (shared out among workers as `poslab run` does) vs a plain
    one-model-at-a-time loop, wall time against wall time; then each ensemble's step as fixed +
    marginal cost per member, and the most this engine can reach from that."""
    from poslab.bench import bench_train as run_bench

    sizes = _int_list("--scaling", scaling, 1, none=True)
    if scaling_steps < 1:
        raise ConfigError("--scaling-steps", scaling_steps, "a positive integer")
    run_bench(steps=steps, plain_steps=plain_steps, workers=workers, scaling=sizes, scaling_steps=scaling_steps,
              echo=click.echo)


@bench.command("ensemble")
@click.argument("experiment", required=False)
@click.option("--preset", default="cpu", show_default=True, help="the study's preset whose groups are timed")
@click.option("--steps", type=int, default=20, show_default=True, help="steps timed per group")
@click.option("--per-task", type=int, default=2, show_default=True, help="groups timed per task")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="as in poslab run")
@click.option("--compile", "compile_", is_flag=True,
              help="ensembles under train.compile, against each member alone compiled too (steady-state steps)")
def bench_ensemble(experiment, preset, steps, per_task, overrides, compile_):
    """A study preset's training (default: the length-generalization benchmark's cpu preset): each
    group's members as one ensemble vs each alone in the plain loop, one thread, as a ratio."""
    from poslab.bench import bench_ensemble as run_bench
    from poslab.studies import DEFAULTS, get_experiment

    exp = get_experiment(experiment or DEFAULTS["bench-ensemble"])
    check_choice("--preset", preset, exp.presets)
    for field, value in (("--steps", steps), ("--per-task", per_task)):
        if value < 1:
            raise ConfigError(field, value, "a positive integer")
    run_bench(exp, preset, steps=steps, per_task=per_task, overrides=overrides, compile=compile_, echo=click.echo)


def _int_list(field: str, text: str, low: int, high: int | None = None, *, none: bool = False) -> tuple[int, ...]:
    """``"6,12,24"`` -> (6, 12, 24), each in [low, high]; ``none``: "none" gives (). Anything else is
    one ConfigError naming ``field`` and what it takes."""
    if none and text.strip().lower() == "none":
        return ()
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < low or (high is not None and max(values) > high):
        allowed = f"comma-separated integers {f'in [{low}, {high}]' if high is not None else f'>= {low}'}"
        raise ConfigError(field, text, allowed + (", or 'none'" if none else ""))
    return values


@bench.command("profile")
@click.argument("experiment", default=None, required=False)
@click.option("--preset", default="paper", show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="as in poslab run")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda")
def bench_profile(experiment, preset, overrides, device):
    """Where one study's wall time goes: setup, sampling, forward, backward, optimizer, evaluation,
    variants, store, tables and figures; seconds, share of the wall time and ms per member-step
    (timed at the phase boundaries, inline, in a temporary store)."""
    from poslab.bench import bench_profile as profile
    from poslab.studies import DEFAULTS

    profile(experiment or DEFAULTS["bench"], preset=preset, overrides=overrides, device=device, echo=click.echo)


@bench.command("floor")
@click.argument("experiments", nargs=-1)
@click.option("--preset", default="paper", show_default=True)
def bench_floor(experiments, preset):
    """The arithmetic floor of training EXPERIMENTS (default: all of the paper's) on this machine:
    their matmul FLOPs over this CPU's (or GPU's) float32 matmul rate."""
    from poslab.bench import bench_floor as floor

    floor(tuple(experiments) or ("all",), preset=preset, echo=click.echo)


@bench.command("eval")
@click.option("--model", "model_type", type=click.Choice(["retrieval_head", "lm"]), default="retrieval_head",
              show_default=True,
              help="a trained RoPE head (accuracy, attention), or the character LM (position-wise loss)")
@click.option("--lengths", default=None, help="comma-separated lengths [head: 1000,10000,100000,1000000; "
                                               "lm: 1000,10000,30000]")
@click.option("--sequences", type=int, default=16, show_default=True, help="sequences per length (head)")
@click.option("--key-chunk", type=int, default=None, help="keys per chunk [head: 4096; lm: 512 on cpu, else "
                                                          "4096; also queries]")
@click.option("--steps", type=int, default=None, help="training steps [head: 1000; lm: 200 of the paper "
                                                     "recipe, 0: random weights]")
@click.option("--device", default="cpu", show_default=True, help="lm: cpu, or cuda for 10^6")
@click.option("--figure", type=click.Path(path_type=Path), default=None,
              help="write the figure here (head: accuracy and peak; lm: loss by position, time and memory)")
def bench_eval(model_type, lengths, sequences, key_chunk, steps, device, figure):
    """Streamed evaluation: time and peak memory per length, up to 10^6 (a RoPE head, or the LM's
    position-wise loss with --model lm)."""
    from poslab.bench import bench_eval as run_bench
    from poslab.bench import bench_eval_lm

    lm = model_type == "lm"
    lengths = lengths or ("1000,10000,30000" if lm else "1000,10000,100000,1000000")
    low = 2 if lm else 48
    parsed = _int_list("--lengths", lengths, low)
    key_chunk = key_chunk if key_chunk is not None else (4096 if not lm or device != "cpu" else 512)
    steps = steps if steps is not None else (200 if lm else 1000)
    for name, value, least in (("--sequences", sequences, 1), ("--key-chunk", key_chunk, 1),
                               ("--steps", steps, 0 if lm else 1)):
        if value < least:
            raise ConfigError(name, value, f"an integer >= {least}")
    if lm:
        if device != "cpu" and not torch_cuda_available():
            raise ConfigError("--device", device, "cpu (no CUDA device is available here)")
        bench_eval_lm(lengths=parsed, steps=steps, chunk=key_chunk, device=device, figure=figure, echo=click.echo)
        return
    run_bench(lengths=parsed, n_sequences=sequences, key_chunk=key_chunk, steps=steps, figure=figure,
              echo=click.echo)


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@bench.command("parity")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda")
@click.option("--members", type=int, default=3, show_default=True, help="seeds per ensemble")
@click.option("--steps", type=int, default=50, show_default=True, help="training steps")
def bench_parity(device, members, steps):
    """Ensemble = solo on a device: Table 1's RoPE and APE groups trained as ensembles and each seed
    alone; the largest weight and loss differences (0 on CPU)."""
    from poslab.bench import bench_parity as run_bench
    from poslab.errors import check_choice

    check_choice("--device", device, ("cpu", "cuda"))
    if device == "cuda" and not torch_cuda_available():
        raise ConfigError("--device", device, "cpu (no CUDA device is available here)")
    for name, value in (("--members", members), ("--steps", steps)):
        if value < 1:
            raise ConfigError(name, value, "a positive integer")
    run_bench(device=device, members=members, steps=steps, echo=click.echo)


@bench.command("lm")
@click.option("--steps", type=int, default=100, show_default=True, help="training steps timed per side")
@click.option("--members", type=int, default=2, show_default=True, help="ensemble size for the per-member cost")
@click.option("--encoding", default="learned", show_default=True, help="the LM's encoding")
@click.option("--rounds", type=int, default=3, show_default=True, help="interleaved rounds (the best counts)")
@click.option("--compile/--no-compile", "compile_", default=True, show_default=True,
              help="also time train.compile and the plain model under torch.compile")
@click.option("--side-by-side/--no-side-by-side", default=True, show_default=True,
              help="also time one member per core in one-thread workers, as `poslab run lm` trains a sweep")
def bench_lm(steps, members, encoding, rounds, compile_, side_by_side):
    """The LM training step (paper preset) beside the same model written plainly with SDPA."""
    from poslab.bench import bench_lm as run_bench

    run_bench(steps=steps, members=members, encoding=encoding, rounds=rounds, compile=compile_,
              side_by_side=side_by_side, echo=click.echo)


@bench.command("pretrained")
@click.option("--model", default="smollm2-135m", show_default=True, help="smollm2-135m, an HF directory or a GGUF")
@click.option("--lengths", default="2048", show_default=True, help="comma-separated window lengths in tokens")
@click.option("--threads", type=int, default=1, show_default=True)
def bench_pretrained(model, lengths, threads):
    """A pretrained checkpoint's position-wise loss (chunked readout) beside its own forward."""
    from poslab.bench import bench_pretrained as run_bench

    parsed = _int_list("--lengths", lengths, 2)
    if threads < 1:
        raise ConfigError("--threads", threads, "an integer >= 1")
    run_bench(model=model, lengths=parsed, threads=threads, echo=click.echo)


@bench.command("leakage-memory")
@click.option("--model", default="smollm2-135m", show_default=True, help="smollm2-135m, gemma3-270m, a directory")
@click.option("--length", type=int, default=512, show_default=True, help="tokens a window")
@click.option("--windows", type=int, default=4, show_default=True)
@click.option("--groups", type=int, default=2, show_default=True)
@click.option("--bos", type=click.Choice(["with BOS", "without BOS"]), default="with BOS", show_default=True)
def bench_leakage_memory(model, length, windows, groups, bos):
    """Peak RSS of one evaluate-only job on a pretrained checkpoint (one checkpoint and BOS mode, every
    variant), in a fresh process, beside the peak its study plans for."""
    import json

    from poslab.bench import bench_job_memory
    from poslab.studies import DEFAULTS

    bench_job_memory(DEFAULTS["job-memory"], preset="quick", checkpoint=model, echo=click.echo,
                     overrides=[f"model.length={length}", f"model.windows={windows}", f"model.groups={groups}",
                                "model.window=64", f"grid.model.bos={json.dumps([bos])}"])


@main.command()
@click.option("--store", type=click.Path(path_type=Path), default=Path("runs/poslab.sqlite"), show_default=True)
@click.option("--run", "key", default=None, help="a run key (default: the latest member of --experiment)")
@click.option("--experiment", default=None, help="the study whose members to read (default: the character LM's)")
@click.option("--encoding", default=None, help="the member's encoding (default: any)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--length", type=int, default=300, show_default=True, help="characters to generate")
@click.option("--temperature", type=float, default=0.8, show_default=True)
@click.option("--prompt", default="\n", show_default=True, help="text to continue (characters of the corpus)")
@click.option("--sample-seed", type=int, default=0, show_default=True, help="seed of the sampler")
def sample(store, key, experiment, encoding, seed, length, temperature, prompt, sample_seed):
    """Generate text from a stored language model, to read what it learned."""
    import torch

    from poslab.sampling import generate, load_member
    from poslab.store import Store

    if not store.exists():
        raise ConfigError("--store", str(store), "the path of an existing store (run an experiment first)")
    if not (length >= 1):
        raise ConfigError("--length", length, "a positive integer")
    if not temperature > 0:
        raise ConfigError("--temperature", temperature, "a positive number")
    with Store(store) as db:
        model, task, run = load_member(db, key, experiment=experiment, encoding=encoding, seed=seed)
    text = generate(model, task, prompt, length, temperature=temperature,
                    generator=torch.Generator().manual_seed(sample_seed))
    click.echo(f"# run {run['key'][:12]} ({run['experiment']}, {run['config']['model']['encoding']}, "
               f"seed {run['config']['seed']}), temperature {temperature}", err=True)
    click.echo(prompt + text)


if __name__ == "__main__":
    main()
