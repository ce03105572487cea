"""Where a resumed run continues: the checkpoint it starts from and the MLflow run it logs into, decided once
(growpipe.prepare.prepare_run applies it for every entry point, local and Ray alike; a Tune trial calls
continue_from for the checkpoint Tune hands it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from growpipe.checkpoint import CheckpointRef, CheckpointStore
from growpipe.config import RunConfig, apply_overrides, build_config, check_run_name, load_config
from growpipe.envvars import extra_overrides
from growpipe.errors import CheckpointError
from growpipe.saved_config import config_differences
from growpipe.workdir import absolute


def plan_resume(config: str | None, overrides: list[str], resume: str,
                say: Callable[[str], None] | None = None) -> tuple[RunConfig, CheckpointRef | None]:  # fmt: skip
    """The run config and the newest whole checkpoint of run `resume` ("auto": the config's name); the
    config logs into the MLflow run the checkpoint's run had (see continuing_mlflow_run). Newer damaged
    checkpoints are set aside, said in one line through `say` (newest_whole_checkpoint).

    Without --config the checkpoint's own config is used (--set may change tracking, runtime, checkpoint,
    eval fields, train.epochs, grow.max_blocks, grow.init and grow.eval_at_growth: RESUMABLE_DIFFERENCES);
    with --config, any other difference is refused, naming the field. `auto` starts fresh when the run has no
    checkpoint; a named run must have one.
    """
    given = load_config(config, overrides)
    name = given.name if resume == "auto" else check_run_name(resume, "--resume")
    if not name:
        raise CheckpointError("--resume auto: the config has no name: to find its run by; set name: (or --resume NAME)")
    store = CheckpointStore(absolute(given.checkpoint.uri), name, given.checkpoint.keep)
    found = newest_whole_checkpoint(store, f"--resume {name}")
    if found is None:
        if resume == "auto":
            return given.model_copy(update={"name": name}), None
        raise CheckpointError(
            f"--resume {name}: no complete checkpoint of run {name!r} in {store.root}; "
            "check the run name and checkpoint.uri (or use --resume auto to start fresh)"
        )
    ref, manifest, damaged = found
    saved_cfg = build_config(manifest["config"], f"{ref.path}/manifest.json")
    saved = saved_cfg.model_dump(mode="json")  # with defaults
    cfg = given if config else build_config(apply_overrides(saved, [*(overrides or []), *extra_overrides()]),
                                            f"{ref.path}/manifest.json + --set")  # fmt: skip
    diff = config_differences(saved, cfg.model_dump(mode="json"))
    if diff:
        raise CheckpointError(
            f"--resume {name}: the config does not match checkpoint {ref.path}: {diff[0]}"
            + (f" (and {len(diff) - 1} more)" if len(diff) > 1 else "")
            + "; resume without --config (the checkpoint's own), --set the field to the checkpoint's value, or "
            "start a run with another name"
        )
    if manifest.get("joint") and cfg.total_epochs() != saved_cfg.total_epochs():
        raise CheckpointError(
            f"--resume {name}: checkpoint {ref.path} is in its joint phase (grow.joint), which ends the run: "
            "train.epochs cannot change now; resume with its train.epochs, or from a checkpoint before the phase"
        )
    if damaged:  # set aside once the resume is decided, so no restore of the resumed run takes one
        aside = True
        for path in damaged:
            try:
                store.set_aside(path)
            except OSError:  # a read-only folder: the resumed run's checkpoints are numbered past them anyway
                aside = False
        more = f" (and {len(damaged) - 1} more newer one(s))" if len(damaged) > 1 else ""
        (say or print)(f"resume {name}: the newest checkpoint is damaged ({next(iter(damaged.values()))}){more}; "
                       + ("set aside as manifest.json.damaged, " if aside else "")
                       + f"going back to {ref.path.rpartition('/')[2]}")  # fmt: skip
    return continuing_mlflow_run(cfg.model_copy(update={"name": name}), manifest, name), ref


def newest_whole_checkpoint(store: CheckpointStore,
                            flag: str) -> tuple[CheckpointRef, dict[str, Any], dict[str, str]] | None:  # fmt: skip
    """(the newest complete checkpoint every load will accept: each shard there, hashing to its manifest's
    SHA-256 and loadable with weights_only; its manifest; the newer damaged ones, path -> why), or None when
    the run has no complete checkpoint. CheckpointError naming `flag` when none is whole."""
    damaged: dict[str, str] = {}
    for ref in reversed(store.complete()):
        try:
            return ref, store.verify(ref.path, load=True), damaged
        except CheckpointError as e:
            damaged[ref.path] = str(e)
    if damaged:
        raise CheckpointError(f"{flag}: no checkpoint of the run is whole (newest: {next(iter(damaged.values()))})")
    return None


def continue_from(cfg: RunConfig, checkpoint: str, run_name: str | None = None) -> RunConfig:
    """`cfg` for a run (named `run_name`, default cfg.name) that starts from checkpoint directory `checkpoint`:
    logging into the MLflow run the checkpoint's run had when it is this run's own checkpoint. Its blocks are
    rebuilt from the checkpoint's specs whatever `cfg` says of their architecture (and the blocks it grows
    take the heads of the block below). Checks the checkpoint as a load will (every shard's hash, loadable
    with weights_only): CheckpointError when damaged."""
    name = run_name or cfg.name or ""
    manifest = CheckpointStore(cfg.checkpoint.uri, name, cfg.checkpoint.keep).verify(checkpoint, load=True)
    return continuing_mlflow_run(cfg, manifest, name)


def continuing_mlflow_run(cfg: RunConfig, manifest: dict[str, Any], run_name: str) -> RunConfig:
    """`cfg` logging into the MLflow run the checkpoint's run had, so a resumed run goes on in it (a Tune trial
    started from another trial's checkpoint, or a config that names its own run_id, keeps its own)."""
    ours = manifest.get("run") == run_name
    if not (cfg.tracking.mlflow and manifest.get("mlflow_run_id") and not cfg.tracking.run_id and ours):
        return cfg
    return cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"run_id": manifest["mlflow_run_id"]})})
