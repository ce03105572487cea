"""The `growpipe` command's arguments: one sub-parser per command, and the bench scripts `growpipe bench` runs.

Only argparse and the version at module level: `growpipe --help` (and every argument error) is answered from here
alone."""

from __future__ import annotations

import argparse

from growpipe.version import __version__

EPILOG = "Config: YAML validated field by field (see configs/); --set key=value overrides any field."
# growpipe bench NAME -> the script of bench/ it runs (NAME's choices here, the script in cli_commands)
BENCHES = {
    "checkpoint-cost": "checkpoint_cost.py",
    "compare": "compare.py",
    "compiled-probe": "compiled_probe.py",
    "serve": "serve.py",
    "data": "data.py",
    "elastic": "elastic.py",
    "growth": "growth.py",
    "grow-latency": "grow_latency.py",
    "grow-vs-scratch": "grow_vs_scratch.py",
    "guard": "guard.py",
    "heldout-sets": "heldout_sets.py",
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
                    "pipeline: Ray pipeline vs sequential, BP, torch GPipe; checkpoint-cost: a checkpoint per "
                    "epoch outside training, asynchronous vs synchronous vs off; compiled-probe: Ray Compiled Graphs "
                    "against object-ref hand-offs between stage actors (overhead, recompile seconds); "
                    "reference: accuracy and seconds/epoch per learning rule; growth: accuracy across growth, "
                    "the frozen-prefix cache, adaptive exits; elastic: a node lost and joined on a 3-raylet "
                    "cluster (seconds to shrink and to spread out, samples/s); grow-latency: a grow request's "
                    "answer per engine (p50 / p95 seconds); data: stage 0's reader per format "
                    "against its block, peak RSS against dataset size; text-ablation: the seeds' text settings one "
                    "at a time; text-sets: short-text and binary sets derived from 20 Newsgroups; heldout-sets: two "
                    "text sets from files PyPI packages ship (movie-review sentences, snippet sources); text-bar: the "
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
