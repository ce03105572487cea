"""The `growpipe` command: train, grow, sweep, partition, evaluate, baseline, serve, data, bench."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from growpipe.errors import BAD_INPUT, ConfigError, GrowpipeError

EPILOG = "Config: YAML validated field by field (see configs/); --set key=value overrides any field."


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="run config YAML (default: all defaults: digits, MLP, AL)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set method=scpl --set train.epochs=3 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="growpipe",
        description="Train growable block-wise local-learning networks (AL, SCPL, DASCPL, BP baseline).",
        epilog=EPILOG,
    )
    from growpipe import __version__

    parser.add_argument("--version", action="version", version=f"growpipe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tr = sub.add_parser(
        "train",
        help="train (and grow) a network",
        description="Train (and grow) a network. Everything that can be checked first (the config, the data, "
        "outputs, checkpoint and tracking URIs) is reported together before anything runs. Relative paths "
        "(runs/, checkpoint.uri) resolve against $GROWPIPE_WORKDIR (an existing directory), else in a Ray job's "
        "temporary working dir ~/growpipe_results, else the current directory.",
        epilog=EPILOG,
    )
    _add_config_args(tr)
    tr.add_argument(
        "--runtime",
        choices=["ray", "local"],
        default="ray",
        help="ray (default): one Ray actor per block, packets streamed actor to actor; "
        "local: the single-process reference trainer (the oracle)",
    )
    tr.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster to join (e.g. auto, ray://host:10001; default: $RAY_ADDRESS, else an embedded local Ray)",
    )
    tr.add_argument("--trace-out", metavar="FILE", help="ray runtime: write the Chrome-trace timeline here (Perfetto)")
    tr.add_argument("--json-out", metavar="FILE", help="write the result JSON here")
    tr.add_argument("--plot-out", metavar="PNG", help="plot accuracy vs compute (every exit, adaptive) here")
    tr.add_argument("--save", metavar="DIR", help="write a checkpoint directory here (weights + manifest)")
    tr.add_argument("--quiet", "-q", action="store_true", help="no per-epoch progress lines")
    tr.add_argument("--overwrite", action="store_true", help="replace the checkpoints an earlier run of the same "
                    "name left (checkpoint.overwrite); without it such a run is refused")  # fmt: skip
    tr.add_argument(
        "--resume",
        metavar="NAME",
        help="continue run NAME from its newest whole checkpoint (checkpoint.uri; a damaged newest one: the one "
        "before, said so): same topology, growth history and MLflow run; 'auto': the config's run, or a fresh "
        "start when it has no checkpoint",
    )

    gr = sub.add_parser(
        "grow",
        help="append a block to a running job",
        description="Ask a running job (found by its run name on the cluster) to append a block while it "
        "trains. The block is placed and built while training goes on; the pipeline then pauses before its "
        "next batch, drains, freezes the earlier blocks (grow.freeze) and resumes with the new block.",
    )
    gr.add_argument("--run", required=True, metavar="NAME", help="the run's name (its config's name:)")
    gr.add_argument("--kind", choices=["layer", "feature"], help="layer (default): a block on top; feature: a "
                    "block on top that also reads --group")  # fmt: skip
    gr.add_argument("--group", metavar="G", help="feature group the new block reads (kind feature)")
    gr.add_argument("--width", type=int, metavar="N", help="width of the new block (default: the config's)")
    gr.add_argument("--input-size", type=int, metavar="N", help="features per sample the block expects; "
                    "refused unless the last block produces exactly that many")  # fmt: skip
    gr.add_argument("--spec", metavar="YAML", help="the request as YAML/JSON (inline or a file): kind, group, "
                    "width, input_size; the flags above override it")  # fmt: skip
    gr.add_argument("--address", metavar="ADDR", help="Ray cluster (default: $RAY_ADDRESS, else the one the run "
                    "recorded when it started in runs/clusters/NAME.json, else the newest local one; an explicit "
                    "address of a token-auth cluster needs RAY_AUTH_MODE=token)")  # fmt: skip
    gr.add_argument("--timeout", type=float, default=600.0, metavar="S", help="longest wait for the answer (600)")

    sw = sub.add_parser(
        "sweep",
        help="run a Ray Tune sweep from a sweep file (tune_configs/)",
        description="Sweep block counts, methods, learning rates, widths (kind train: one pipeline per trial, "
        "in its own placement group; search random or optuna; scheduler asha (default), fifo or pbt) or exit "
        "thresholds of a trained net (kind thresholds: its stored per-exit predictions, no retraining). Trials "
        "are MLflow child runs of the sweep's run; the best config is written as YAML for growpipe train "
        "--config. An interrupted sweep is resumed by running the command again.",
    )
    sw.add_argument("file", metavar="SWEEP_YAML", help="sweep file, e.g. tune_configs/digits-quick.yaml")
    sw.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a sweep-file field, e.g. --set num_samples=4 --set set.train.epochs=2")  # fmt: skip
    sw.add_argument("--address", metavar="ADDR", help="Ray cluster (default: $RAY_ADDRESS, else an embedded local Ray)")
    sw.add_argument("--json-out", metavar="FILE", help="write the sweep summary JSON here")
    sw.add_argument("--check", action="store_true", help="validate the file and every search-space corner; no trials")
    again = sw.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="resume the interrupted sweep in its output directory "
        "(the default when there is one): finished trials kept, the others from their checkpoints",
    )
    again.add_argument("--fresh", action="store_true", help="start over even when an interrupted sweep is there")

    pa = sub.add_parser(
        "partition",
        help="cut a network's layers into K balanced stages from a profile on this device",
        description="Time every layer's training step (and its memory) on the config's device, cut the layers "
        "into K contiguous stages minimising the slowest one within --memory-mb per stage, and print the "
        "predicted (and with --measure, measured on Ray) time per stage. MLP backbone.",
    )
    _add_config_args(pa)
    pa.add_argument("--stages", "-k", type=int, required=True, metavar="K", help="number of stages (blocks)")
    pa.add_argument("--memory-mb", type=float, metavar="MB", help="memory a stage may use (default: no limit)")
    pa.add_argument("--write", metavar="YAML", help="write the partitioned run config here (net.blocks, net.layers)")
    pa.add_argument("--measure", action="store_true",
                    help="train 1 epoch on Ray, print the measured stage times (bp: gpipe or 1f1b)")  # fmt: skip
    pa.add_argument("--json-out", metavar="FILE", help="write the partition report JSON here")

    ev = sub.add_parser("evaluate", help="evaluate a checkpoint: every exit and adaptive inference")
    ev.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint directory written by train --save")
    ev.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override eval.* or data.* fields, e.g. --set eval.thresholds=[0.8,0.9] --set eval.confidence=entropy",
    )
    ev.add_argument("--json-out", metavar="FILE", help="write the evaluation JSON here")
    ev.add_argument("--plot-out", metavar="PNG", help="plot accuracy vs compute (every exit, adaptive) here")

    ba = sub.add_parser(
        "baseline",
        help="the classical bar of a run config: TF-IDF or standardised features + logistic regression",
        description="Fit scikit-learn's TF-IDF + logistic regression (text) or logistic regression on standardised "
        "features (tables, images) on the rows a run of the config trains on (data.limit_train, the "
        "data.val_fraction hold-out) and print its accuracy on the rows the run tests on. A run with "
        "eval.baseline: true draws it too, beside its result.",
        epilog=EPILOG,
    )
    _add_config_args(ba)
    ba.add_argument("--json-out", metavar="FILE", help="write the bar as JSON here")

    se = sub.add_parser(
        "serve",
        help="serve a net over HTTP with Ray Serve (early exit), following a running job when asked",
        description="Answer POST /predict with the net of a run, a checkpoint directory or an MLflow model; "
        "--follow serves each new checkpoint of a running run as it is written (see docs/serving.md).",
    )
    what = se.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", metavar="NAME", help="the run's newest whole checkpoint (in --checkpoint-uri)")
    what.add_argument("--checkpoint", metavar="DIR", help="a checkpoint directory (train --save, or a ckpt-*)")
    what.add_argument("--model", metavar="URI", help="an MLflow model: models:/NAME/VERSION or runs:/RUN_ID/model")
    se.add_argument("--follow", action="store_true", help="with --run: serve each new checkpoint as it is written")
    se.add_argument("--checkpoint-uri", default="runs/checkpoints", metavar="URI",
                    help="where the run's checkpoints are (its checkpoint.uri; default %(default)s)")  # fmt: skip
    se.add_argument("--tracking-uri", metavar="URI", help="MLflow store of --model (default: $MLFLOW_TRACKING_URI, "
                    "else runs/mlflow.db)")  # fmt: skip
    se.add_argument("--host", default="127.0.0.1", help="address the HTTP API listens on (default %(default)s)")
    se.add_argument("--port", type=int, default=8000, help="HTTP port (default %(default)s)")
    se.add_argument("--replicas", default="1", metavar="N|MIN-MAX",
                    help="replicas: N, or MIN-MAX to autoscale on ongoing requests (default %(default)s)")  # fmt: skip
    se.add_argument("--cpus", type=float, default=1.0, help="CPUs per replica (default %(default)s)")
    se.add_argument("--stages", type=int, default=1, help="serve the blocks as this many groups, one deployment "
                    "each, passing on only undecided rows (a net too big for a replica; default 1)")  # fmt: skip
    se.add_argument("--address", metavar="ADDR", help="Ray cluster to serve on (default: $RAY_ADDRESS, else an "
                    "embedded local Ray)")  # fmt: skip
    se.add_argument("--print-config", action="store_true", help="print the Serve config (serve deploy / a "
                    "RayService's serveConfigV2) and exit")  # fmt: skip

    be = sub.add_parser(
        "bench",
        help="run a benchmark from bench/ (prints ratios, writes JSON)",
        description="Run bench/NAME.py of this source checkout; the other arguments go to it (see NAME --help).",
    )
    be.add_argument("name", choices=sorted(BENCHES), help="compare: every BP schedule and local rule x dataset "
                    "x K (accuracy, samples/s, time to target, ratios); "
                    "pipeline: Ray pipeline vs sequential, BP, torch GPipe; "
                    "reference: accuracy and seconds/epoch per learning rule; growth: accuracy across growth, "
                    "the frozen-prefix cache, adaptive exits; elastic: a node lost and joined on a 3-raylet "
                    "cluster (seconds to shrink and to spread out, samples/s); data: stage 0's reader per format "
                    "against its block, peak RSS against dataset size; text-ablation: the seeds' text settings one "
                    "at a time; text-sets: short-text and binary sets derived from 20 Newsgroups; text-bar: the "
                    "text recipe's rules against the classical bar per text set; text-ceiling: a linear model on the "
                    "net's own text input, and its first block trained with Adam and with SGD; lstm-speed: a "
                    "BiLSTM step packed vs padded; lstm-pooling: how alike SCPL's BiLSTM "
                    "features end, per pooling; guard: what the divergence guard costs a step; precision: bf16 against "
                    "fp32 (accuracy, seconds/epoch, bytes per hop); scale: 0.1 M-100 M parameters per block x K "
                    "stages (training, evaluation, checkpoint seconds, bytes, peak RSS), the cost model, early exit "
                    "timed; serve: growpipe serve following a growing job under load (latency, failed requests, "
                    "reload seconds) and early exit's throughput per threshold")  # fmt: skip
    be.add_argument("args", nargs=argparse.REMAINDER, help="e.g. --quick --json-out FILE")

    ml = sub.add_parser("mlflow", help="MLflow helpers: send a run's unsent entries, serve a logged model")
    msub = ml.add_subparsers(dest="mlflow_command", required=True, metavar="ACTION")
    rp = msub.add_parser("replay", help="send a spilled runs/mlflow-unsent-*.jsonl to MLflow",
                         description="Send the entries a run could not send (its tracking server was down) into its "
                         "MLflow run, or a new run of the same name when the server does not have it.")  # fmt: skip
    rp.add_argument("file", metavar="JSONL", help="the mlflow-unsent-NAME-TIME.jsonl file the run wrote")
    rp.add_argument("--tracking-uri", metavar="URI", help="where to send them (default: the run's tracking URI)")
    sv = msub.add_parser("serve", help="serve a logged model over HTTP with MLflow's scoring server",
                         description="mlflow models serve -m MODEL_URI --env-manager local, with this virtualenv's "
                         "bin first on PATH (MLflow starts uvicorn from PATH) and growpipe's tracking store: "
                         "POST /invocations, GET /ping.")  # fmt: skip
    sv.add_argument(
        "model_uri", metavar="MODEL_URI", help="models:/NAME/VERSION (a registered run) or models:/MODEL_ID"
    )
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    sv.add_argument("--port", type=int, default=5001, help="port to listen on (default: 5001)")
    sv.add_argument("--tracking-uri", metavar="URI", help="the MLflow store holding the model (default: "
                    "$MLFLOW_TRACKING_URI, else runs/mlflow.db)")  # fmt: skip

    da = sub.add_parser("data", help="list datasets or check that one loads")
    dsub = da.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    dsub.add_parser("list", help="list the dataset names and prefixes growpipe knows")
    ck = dsub.add_parser("check", help="load a dataset and print its summary")
    ck.add_argument("name", help="dataset name, e.g. fashion-mnist or parquet:/path/to/dir")
    ck.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="data.* fields, e.g. --set data.root=/data/fmnist")  # fmt: skip
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    from growpipe.api import train
    from growpipe.checkpoint import save_net
    from growpipe.errors import OutputError
    from growpipe.outputs import write_json
    from growpipe.prepare import prepare_run
    from growpipe.progress import EpochBar
    from growpipe.report import format_report, format_stage_table, format_topology_changes
    from growpipe.tracking import ui_command

    outputs = {
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
    from growpipe.errors import OutputError

    try:
        return write()
    except OutputError as e:
        failed.append(str(e))
        return None


def _check_outputs(outputs: dict[str, Any]) -> None:
    """Refuse, before any work, output paths the command could not write or must not replace."""
    from growpipe.outputs import check_outputs
    from growpipe.prepare import refuse

    refuse(check_outputs(outputs))


def _grow_request(args: argparse.Namespace) -> dict[str, object]:
    import yaml

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
    import json

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
    from growpipe.plots import plot_accuracy_vs_compute

    out = plot_accuracy_vs_compute(ev, path, title)
    print(f"plot: {out}")
    return out


def _cmd_evaluate(args: argparse.Namespace) -> int:
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
    from growpipe.baseline import classical_bar
    from growpipe.config import load_config
    from growpipe.errors import DataError
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
    import yaml

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


BENCHES = {
    "compare": "compare.py",
    "serve": "serve.py",
    "data": "data.py",
    "elastic": "elastic.py",
    "growth": "growth.py",
    "guard": "guard.py",
    "lstm-pooling": "lstm_pooling.py",
    "lstm-speed": "lstm_speed.py",
    "pipeline": "pipeline.py",
    "scale": "scale.py",
    "precision": "precision.py",
    "reference": "reference.py",
    "text-ablation": "text_ablation.py",
    "text-bar": "text_bar.py",
    "text-ceiling": "text_ceiling.py",
    "text-sets": "text_sets.py",
}


def _cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    script = Path(__file__).resolve().parents[2] / "bench" / BENCHES[args.name]
    if not script.is_file():
        raise ConfigError(f"bench: {script} not found; growpipe bench runs the scripts of a source checkout")
    return subprocess.call([sys.executable, str(script), *args.args])


def _cmd_mlflow(args: argparse.Namespace) -> int:
    from growpipe.tracking import replay

    if args.mlflow_command == "serve":
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
    from growpipe.data import PREFIXES, REGISTRY, load_data

    if args.data_command == "list":
        for name, (_, desc) in REGISTRY.items():
            print(f"  {name:<14} {desc}")
        for prefix, (_, desc) in PREFIXES.items():
            print(f"  {prefix + '...':<14} {desc}")
        return 0
    from growpipe.config import apply_overrides, build_config

    raw = apply_overrides({"data": {"name": args.name}}, args.overrides)
    bundle = load_data(build_config(raw, "data check").data)
    print(bundle.summary())
    counts = bundle.train.y.bincount(minlength=bundle.num_classes).tolist()
    print(f"train samples per class: {counts}")
    return 0


def _sweep_stop(signum: int) -> None:
    """A sweep stops as Tune stops on Ctrl-C (gracefully, saving what a resume needs): SIGTERM becomes SIGINT,
    which Tune handles while trials run (and this module's handler, raising KeyboardInterrupt, otherwise)."""
    import signal

    if signum == signal.SIGTERM:
        signal.raise_signal(signal.SIGINT)
    else:
        raise KeyboardInterrupt("signal SIGINT")


def main(argv: Sequence[str] | None = None, *, exits: bool | None = None) -> int:
    """Entry point of the `growpipe` console script; the exit code. `exits` (default: when argv is None, the
    console script; the jobs/ entry points say so too): the process ends here (see _exit_when_stopped)."""
    code = _run(argv)
    if argv is None if exits is None else exits:
        _exit_when_stopped(code)
    return code


def _exit_when_stopped(code: int) -> None:
    """The console script ends here: exit handlers (Ray's shutdown, temporary folders) run now, with a signal
    meanwhile ending the process at once as stopped; then the process exits without the interpreter's
    teardown, which a half-started Ray's C++ threads can crash and during which signals are not handled."""
    import atexit

    from growpipe import signals

    if not signals.received():
        signals.exit_at_once_on_signal()
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(argv: Sequence[str] | None) -> int:
    from growpipe import signals

    args = build_parser().parse_args(argv)
    handlers = {
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
    restore = signals.install(_sweep_stop if args.command == "sweep" else None)
    try:
        code = handlers[args.command](args)
        signals.check()  # a stop whose KeyboardInterrupt was swallowed where it landed still ends as a stop
        return code
    except KeyboardInterrupt:
        return _stopped(args.command)
    except GrowpipeError as e:
        if signals.received():  # the run ended because it was being stopped
            return _stopped(args.command)
        print(f"growpipe {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, BAD_INPUT) else 1
    finally:
        restore()


def _stopped(command: str) -> int:
    """Say that the command was stopped, kill what it started that still runs; 130 (SIGINT) or 143 (SIGTERM)."""
    from growpipe import signals

    signals.exit_at_once_on_signal()  # a second Ctrl-C / SIGTERM while this cleans up ends the process at once

    print(f"growpipe {command}: stopped by {signals.describe()}", file=sys.stderr)
    signals.end_descendants()
    return signals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
