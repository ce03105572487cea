"""What each `growpipe` command does once its arguments are parsed: one handler per command, its exit code.

Every handler imports what it uses inside itself: the command that runs loads its own dependencies (torch, Ray,
MLflow, pandas), no other command's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from growpipe.cli_parser import BENCHES
from growpipe.errors import ConfigError, DataError, OutputError

if TYPE_CHECKING:
    from growpipe.outputs import Kind


def _cmd_train(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.api import train
    from growpipe.checkpoint import save_net
    from growpipe.outputs import write_json
    from growpipe.prepare import prepare_run
    from growpipe.progress import EpochBar
    from growpipe.report import format_report, format_stage_table, format_topology_changes
    from growpipe.tracking import ui_command

    outputs: dict[str, tuple[str | None, Kind]] = {
        "--json-out": (args.json_out, "json"),
        "--save": (args.save, "checkpoint"),
        "--plot-out": (args.plot_out, "png"),
        "--trace-out": (args.trace_out, "json"),
    }
    overrides = [*args.overrides, *(["checkpoint.overwrite=true"] if args.overwrite else [])]
    prepared = prepare_run(args.config, overrides, resume_run=args.resume, runtime=args.runtime,
                           address=args.address, outputs=outputs)  # fmt: skip
    cfg = prepared.cfg
    bar = EpochBar()  # a redrawn bar per epoch in a terminal; plain lines in job logs and pipes
    progress = None if args.quiet else bar.line
    run = train(prepared, args.runtime, args.address, progress, keep_net=bool(args.save),
                bar=None if args.quiet else bar)  # fmt: skip
    summary = run.result
    print(format_report(summary))
    if "stages" in summary:
        print(format_stage_table(summary["stages"]))
    if summary.get("topology_changes"):
        print("topology changes:\n" + format_topology_changes(summary["topology_changes"]))
    failed: list[str] = []  # one output that cannot be written does not cost the others
    if args.plot_out:
        title = f"{cfg.method} on {cfg.data.name}, {summary['blocks']} blocks"
        if plot := _attempt(failed, lambda: _plot(summary, args.plot_out, title)):
            summary["plots"] = {"accuracy_vs_compute": str(plot)}
    if args.json_out and (out := _attempt(failed, lambda: write_json(args.json_out, summary))):
        print(f"result JSON: {out}")
    timeline = summary.get("timeline")
    if args.trace_out and timeline and (trace := _attempt(failed, lambda: write_json(args.trace_out, timeline,
                                                                                    "--trace-out"))):  # fmt: skip
        print(f"timeline: {trace} (open in https://ui.perfetto.dev)")
    if args.save and (path := _attempt(failed, lambda: save_net(args.save, run.net, cfg, summary))):
        print(f"checkpoint: {path}  (growpipe evaluate --checkpoint {path})")
    if cfg.tracking.mlflow and cfg.tracking.uri:
        print(f"MLflow: experiment {cfg.tracking.experiment!r} in {cfg.tracking.uri}")
        print(f"  UI: {ui_command(cfg.tracking.uri)}")
    if failed:
        raise OutputError("\n".join(failed))
    return 0


def _attempt(failed: list[str], write: Any) -> Any:
    """write(); an OutputError is kept in `failed` (None returned) so that the other outputs are written."""
    try:
        return write()
    except OutputError as e:
        failed.append(str(e))
        return None


def _check_outputs(outputs: dict[str, Any]) -> None:
    """Refuse, before any work, output paths the command could not write or must not replace."""
    # lazy: only the command that runs loads its dependencies
    from growpipe.outputs import check_outputs
    from growpipe.prepare import refuse

    refuse(check_outputs(outputs))


def _grow_request(args: argparse.Namespace) -> dict[str, object]:
    request: dict[str, object] = {}
    if args.spec:
        text = Path(args.spec).read_text() if Path(args.spec).is_file() else args.spec
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"--spec: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise ConfigError("--spec: give a mapping, e.g. '{kind: layer, width: 128}'")
        request.update(loaded)
    for key in ("kind", "group", "width", "input_size"):
        if getattr(args, key) is not None:
            request[key] = getattr(args, key)
    return request


def _cmd_grow(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.api import grow

    answer = grow(args.run, _grow_request(args), address=args.address, timeout_s=args.timeout, say=print)
    where = f" at epoch {answer['epoch'] + 1} batch {answer['batch']}" if answer.get("batch") is not None else ""
    print(
        f"run {args.run}: +{answer['kind']} block {answer['block']} -> {answer['blocks']} blocks, "
        f"stage actor {answer['stage']}{where}"
    )
    print(json.dumps(answer))
    return 0


def _plot(ev: dict[str, Any], path: str, title: str) -> Path:
    # lazy: only the command that runs loads its dependencies
    from growpipe.plots import plot_accuracy_vs_compute

    out = plot_accuracy_vs_compute(ev, path, title)
    print(f"plot: {out}")
    return out


def _cmd_evaluate(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.api import evaluate
    from growpipe.outputs import write_json
    from growpipe.report import format_exits

    ev = evaluate(args.checkpoint, args.overrides, {"--json-out": (args.json_out, "json"),
                                                    "--plot-out": (args.plot_out, "png")})  # fmt: skip
    print(f"{ev['method']} on {ev['dataset']}: {ev['blocks']} blocks, full-path accuracy {ev['full_accuracy']:.4f}")
    print(format_exits(ev))
    if args.plot_out:
        title = f"{ev['method']} on {ev['dataset']}, {ev['blocks']} blocks"
        ev["plots"] = {"accuracy_vs_compute": str(_plot(ev, args.plot_out, title))}
    if args.json_out:
        print(f"evaluation JSON: {write_json(args.json_out, ev)}")
    return 0


def _cmd_baseline(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.baseline import classical_bar
    from growpipe.config import load_config
    from growpipe.outputs import write_json
    from growpipe.report import format_bar

    cfg = load_config(args.config, args.overrides)
    _check_outputs({"--json-out": (args.json_out, "json")})
    bar = classical_bar(cfg)
    if "skipped" in bar:
        raise DataError(format_bar(bar))
    print(f"{cfg.data.name}: {format_bar(bar)}")
    if args.json_out:
        print(f"baseline JSON: {write_json(args.json_out, {'dataset': cfg.data.name, **bar})}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.prepare import absolute
    from growpipe.serve.deploy import ServeOptions, serve_config
    from growpipe.serve.server import run
    from growpipe.serve.source import resolve
    from growpipe.tracking import default_tracking_uri

    if args.follow and not args.run:
        raise ConfigError("--follow: follows a run; give --run NAME")
    low, _, high = args.replicas.partition("-")
    try:
        replicas = (int(low), int(high or low))
    except ValueError:
        raise ConfigError(f"--replicas: {args.replicas!r} is not N or MIN-MAX (e.g. 2 or 1-4)") from None
    options = ServeOptions(args.host, args.port, *replicas, cpus_per_replica=args.cpus, stages=args.stages)
    options.check()
    tracking = args.tracking_uri or default_tracking_uri(absolute("runs"))
    checkpoint = absolute(args.checkpoint) if args.checkpoint else None
    source = resolve(args.run, checkpoint, args.model, absolute(args.checkpoint_uri), tracking)
    if args.print_config:
        print(yaml.safe_dump(serve_config(source, options), sort_keys=False), end="")
        return 0
    return run(source, options, follow_run=args.follow, address=args.address)


def _cmd_partition(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.config import dump_config, load_config
    from growpipe.outputs import write_json, write_yaml
    from growpipe.partition import plan_partition

    cfg = load_config(args.config, args.overrides)
    _check_outputs({"--write": (args.write, "yaml"), "--json-out": (args.json_out, "json")})
    if args.measure and cfg.engine() == "ddp":
        raise ConfigError("runtime.engine: ddp is data-parallel and has no stages to measure; "
                          "use gpipe or 1f1b with --measure")  # fmt: skip
    report = plan_partition(cfg, args.stages, args.memory_mb)
    part: Any = report.pop("config")
    print(f"data   {report['data']}")
    print("layer ms: " + ", ".join(f"{v:.2f}" for v in report["layer_ms"])
          + (f"  ({report['stage_constant_ms']:+.2f} ms per stage: one head, no input gradient upstream)"
             if cfg.method != "bp" else ""))  # fmt: skip
    print(f"{'stage':>5}  {'layers':>6}  {'predicted ms':>12}  {'memory MB':>9}  measured ms")
    measured: list[float | None] = [None] * args.stages
    if args.measure:
        # lazy: only the command that runs loads its dependencies
        from growpipe.api import train

        quick = part.model_copy(update={"train": part.train.model_copy(update={"epochs": 1})})
        stages = train(quick, progress=None).result["stages"]  # bp: GPipe or 1F1B (runtime.engine)
        bs = part.data.batch_size
        for s in stages:
            measured[s["stage"]] = 1000 * s["busy_s"] / max(s["samples"] / bs, 1)
        report["measured_stage_ms"] = measured
    for i, (n, ms, mb) in enumerate(zip(report["layers"], report["predicted_stage_ms"], report["stage_memory_mb"],
                                        strict=True)):  # fmt: skip
        got = f"{measured[i]:.2f}" if measured[i] is not None else "-"
        print(f"{i:>5}  {n:>6}  {ms:>12.2f}  {mb:>9.1f}  {got}")
    print(f"net.blocks: {args.stages}, net.layers: {report['layers']}")
    if args.write:
        written = write_yaml(args.write, dump_config(part), f"growpipe partition --stages {args.stages}")
        print(f"config: {written}  (growpipe train --config {args.write})")
    if args.json_out:
        print(f"partition JSON: {write_json(args.json_out, report)}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.outputs import write_json
    from growpipe.tune.spec import load_sweep
    from growpipe.tune.sweep import prepare, run_sweep

    spec = load_sweep(args.file, args.overrides)
    _check_outputs({"--json-out": (args.json_out, "json")})
    if args.check:
        _, cfgs = prepare(spec, args.address, print)
        print(f"{args.file}: ok ({spec.kind}, {len(cfgs)} search-space corners checked as run configs)")
        return 0
    summary = run_sweep(spec, args.address, resume=True if args.resume else False if args.fresh else None)
    if args.json_out:
        print(f"sweep JSON: {write_json(args.json_out, summary)}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "bench" / BENCHES[args.name]
    if not script.is_file():
        raise ConfigError(f"bench: {script} not found; growpipe bench runs the scripts of a source checkout")
    return subprocess.call([sys.executable, str(script), *args.args])


def _cmd_mlflow(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.tracking import replay

    if args.mlflow_command == "serve":
        # lazy: only the command that runs loads its dependencies
        from growpipe.config import TrackingSpec
        from growpipe.prepare import absolute
        from growpipe.serving import serve_model
        from growpipe.tracking import default_tracking_uri

        serve_model(args.model_uri, args.tracking_uri or default_tracking_uri(absolute(TrackingSpec().workdir)),
                    args.host, args.port)  # fmt: skip
    if not Path(args.file).is_file():
        raise ConfigError(f"{args.file}: no such file; give the runs/mlflow-unsent-*.jsonl a run wrote")
    replay(args.file, args.tracking_uri)
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    # lazy: only the command that runs loads its dependencies
    from growpipe.data import PREFIXES, REGISTRY, load_data

    if args.data_command == "list":
        for name, (_, desc) in REGISTRY.items():
            print(f"  {name:<14} {desc}")
        for prefix, (_, desc) in PREFIXES.items():
            print(f"  {prefix + '...':<14} {desc}")
        return 0
    # lazy: only the command that runs loads its dependencies
    from growpipe.config import apply_overrides, build_config

    raw = apply_overrides({"data": {"name": args.name}}, args.overrides)
    bundle = load_data(build_config(raw, "data check").data)
    print(bundle.summary())
    counts = bundle.train.y.bincount(minlength=bundle.num_classes).tolist()
    print(f"train samples per class: {counts}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": _cmd_train,
    "grow": _cmd_grow,
    "evaluate": _cmd_evaluate,
    "baseline": _cmd_baseline,
    "sweep": _cmd_sweep,
    "partition": _cmd_partition,
    "data": _cmd_data,
    "mlflow": _cmd_mlflow,
    "bench": _cmd_bench,
    "serve": _cmd_serve,
}
"""growpipe COMMAND -> its handler (the parsed arguments -> the exit code)."""
