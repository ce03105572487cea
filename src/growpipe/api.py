"""The Python API: what the `growpipe` command does, for a program (the command is a thin layer over it).

import growpipe

cfg = growpipe.load_config("configs/demo.yaml", ["train.epochs=4", "name=api-demo", "checkpoint.overwrite=true"])
run = growpipe.train(cfg, runtime="local")           # or "ray" (embedded Ray, or address=...)
print(run.result["test_accuracy"], run.net.depth)
growpipe.grow("api-demo", kind="layer", width=128)     # a running job on the cluster, by its run name
ev = growpipe.evaluate("runs/demo/checkpoint", ["eval.thresholds=[0.9]"])
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from growpipe.config import RunConfig, check_run_name, load_config, parse_grow_request
from growpipe.evaluation import evaluate_net, load_for_evaluation
from growpipe.local import train_local
from growpipe.loop.result import RunResult
from growpipe.outputs import Kind
from growpipe.prepare import PreparedRun, prepare_run
from growpipe.progress import EpochBar
from growpipe.runtime.cluster_record import record_cluster

__all__ = ["RunResult", "evaluate", "grow", "load_config", "train"]


def train(
    config: RunConfig | PreparedRun | str | Path | dict[str, Any] | None = None,
    runtime: str = "ray",
    address: str | None = None,
    progress: Callable[[str], None] | None = print,
    keep_net: bool = True,
    bar: EpochBar | None = None,
    resume: str | None = None,
    outputs: dict[str, tuple[str | None, Kind]] | None = None,
    overrides: list[str] | None = None,
) -> RunResult:
    """Train (and grow) the net a config describes: a RunConfig, a YAML path, a mapping, or None (every
    default), with `overrides` (key=value) applied. Returns its result JSON and, with `keep_net`, the trained
    net in this process.

    runtime "ray": on a Ray cluster (`address`, $RAY_ADDRESS, else an embedded local Ray), the engine chosen
    by the config (the local-learning pipeline; for method bp GPipe, 1F1B or Ray Train DDP); "local": the
    reference trainer in this process. `resume`: a checkpoint directory to continue from (in the MLflow run
    of that checkpoint's run). `outputs`: the files the caller will write afterwards (flag -> (path, kind)).
    Everything is checked before the run, the config's own problems included (growpipe.prepare.prepare_run;
    a PreparedRun is taken as already prepared). On Ray the cluster's address is recorded in
    tracking.workdir/clusters/NAME.json for growpipe grow. Raises a GrowpipeError (its message one line per problem)
    when the run cannot start or fails; a new run whose name already has checkpoints is refused unless
    checkpoint.overwrite."""
    prepared = config if isinstance(config, PreparedRun) else prepare_run(
        config, overrides, resume=resume, runtime=runtime, address=address, outputs=outputs,
        say=progress or print)  # fmt: skip
    cfg = prepared.cfg
    if runtime == "local":
        return train_local(cfg, progress, resume=prepared.resume)
    from growpipe.runtime.pipeline import Pipeline  # lazy: ray (about 1 s), which a local run never imports

    with Pipeline(cfg, address, resume=prepared.resume) as p:
        import ray  # lazy: as Pipeline

        record_cluster(cfg.tracking.workdir, p.run_name, ray.get_runtime_context().gcs_address)
        result = p.train(progress, bar=bar, keep_net=keep_net)
        return RunResult(result, p.final_net() if keep_net else None)


def grow(run: str, request: dict[str, Any] | None = None, *, address: str | None = None, timeout_s: float = 600.0,
         say: Callable[[str], None] | None = None, **fields: Any) -> dict[str, Any]:  # fmt: skip
    """Ask running job `run` to append a block (`request` and/or fields: kind, group, width, input_size);
    returns what was added (block, blocks, epoch, batch, stage). The cluster asked: `address`, else
    $RAY_ADDRESS, else the one recorded when the run started (RUNS/clusters/NAME.json), else the newest on this
    machine; `say` gets the line naming it. The request is validated before the cluster is reached; a
    refusal raises InputError with the run's reason."""
    from growpipe.runtime.client import connect_existing, request_growth  # lazy: ray, as Pipeline in train

    ask = {**(request or {}), **{k: v for k, v in fields.items() if v is not None}}
    check_run_name(run, "--run")
    parse_grow_request(ask)
    (say or (lambda _line: None))(connect_existing(address, run))
    return request_growth(run, ask, timeout_s)


def evaluate(checkpoint: str | Path, overrides: list[str] | None = None,
             outputs: dict[str, tuple[str | None, Kind]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every exit and the adaptive trade-off of a checkpoint's net on its test split (`overrides`: eval.*,
    data.root, data.download, data.limit_test as key=value; `outputs`: the files the caller will write,
    checked with the rest before the data is read: see growpipe.evaluation.load_for_evaluation)."""
    net, bundle, cfg = load_for_evaluation(checkpoint, overrides, outputs)
    ev = evaluate_net(net, bundle, cfg.eval, early_exit=True)
    ev.update(method=cfg.method, dataset=cfg.data.name, blocks=net.depth)
    return ev
