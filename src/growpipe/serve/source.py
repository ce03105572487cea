"""What `growpipe serve` answers with: a run's newest complete checkpoint (followed as the run writes new
ones), a checkpoint directory, or an MLflow model. Each is checked here, before Serve starts: a name that
resolves to nothing is one line (exit 2)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from growpipe.checkpoint import CheckpointStore, open_checkpoint
from growpipe.errors import CheckpointError, ConfigError

MODEL_SCHEMES = ("models:/", "runs:/")


@dataclass(frozen=True)
class Source:
    """A resolved source: `ref` is what a replica loads (a checkpoint directory, local or a pyarrow.fs URI, or
    an MLflow model URI), `run_store` the run's checkpoint folder when following a run."""

    kind: str  # run | checkpoint | model
    ref: str
    tracking_uri: str | None = None
    run_store: CheckpointStore | None = None

    def user_config(self) -> dict[str, Any]:
        """What the deployment's user_config carries: the version to load (its reconfigure loads it)."""
        return {"source": self.ref, "kind": "model" if self.kind == "model" else "checkpoint",
                "tracking_uri": self.tracking_uri}  # fmt: skip


def resolve(run: str | None, checkpoint: str | None, model: str | None, checkpoint_uri: str,
            tracking_uri: str | None) -> Source:  # fmt: skip
    """Check the one source the user gave; ConfigError / CheckpointError naming the option otherwise."""
    given = [name for name, v in (("--run", run), ("--checkpoint", checkpoint), ("--model", model)) if v]
    if len(given) != 1:
        raise ConfigError("serve: give exactly one of --run NAME, --checkpoint DIR, --model URI"
                          + (f" (got {', '.join(given)})" if given else ""))  # fmt: skip
    if run:
        store = CheckpointStore(checkpoint_uri, run)
        return Source("run", newest_whole(store), tracking_uri, store)
    if checkpoint:
        store, target, _ = open_checkpoint(checkpoint)
        try:  # every shard's hash, and loadable with weights_only: a replica would fail on what fails here
            store.verify(target, load=True)
        except CheckpointError as e:
            raise CheckpointError(f"--checkpoint: {e}") from None
        return Source("checkpoint", target, tracking_uri)
    assert model is not None
    if not model.startswith(MODEL_SCHEMES):
        raise ConfigError(f"--model: {model!r} is not an MLflow model URI (models:/NAME/VERSION, runs:/RUN_ID/model)")
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
        if not db.is_file():  # MLflow would create an empty store there
            raise ConfigError(f"--tracking-uri: no MLflow store at {db}; give the store the run logged to")
    try:
        from mlflow.artifacts import download_artifacts

        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # its table checks are not news
        download_artifacts(artifact_uri=f"{model_files(model, tracking_uri)}/MLmodel", tracking_uri=tracking_uri)
    except Exception as e:  # MLflow raises its own and OSError subclasses for an unknown name/version/run
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--model: {model} does not resolve in MLflow store {tracking_uri} ({first[:200]})") from None
    return Source("model", model, tracking_uri)


def model_files(model: str, tracking_uri: str | None) -> str:
    """Where an MLflow model URI's files are, resolved in the store at `tracking_uri` (MLflow resolves a
    models:/ URI through the process-wide registry URI instead, whatever store it is given):
    models:/NAME/VERSION, models:/NAME@ALIAS, models:/MODEL_ID; runs:/ URIs as they are."""
    if not model.startswith("models:/"):
        return model.rstrip("/")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    path = model.removeprefix("models:/").strip("/")
    if "@" in path:
        name, alias = path.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    elif "/" in path:
        name, number = path.split("/", 1)
        version = client.get_model_version(name, number)
    else:
        return client.get_logged_model(path).artifact_location
    return client.get_model_version_download_uri(version.name, version.version)


def newest_whole(store: CheckpointStore, claims: Any = None, say: Callable[[str], None] | None = None) -> str:
    """The newest complete checkpoint of a run that every load accepts (each shard hashing to its manifest,
    loadable with weights_only); CheckpointError naming --run when there is none. With `claims`
    (growpipe.serve.deploy.Claims) it is held before it is checked, so the run cannot prune it from then on;
    a damaged one is skipped with a line through `say`, one pruned before it could be held silently."""
    problem = None
    for _ in range(10):  # a run writing checkpoints faster than they are held: list them again
        complete = store.complete()
        if not complete:
            raise CheckpointError(
                f"--run: run {store.run_name!r} has no complete checkpoint in {store.root}; check the name (growpipe "
                "train prints it) and --checkpoint-uri (the run's checkpoint.uri)"
            )
        pruned = False
        for ref in reversed(complete):
            if claims is not None and not claims.hold(ref.path):
                pruned = True
                continue
            try:
                store.verify(ref.path, load=True)
            except CheckpointError as e:  # damaged, or (not held) pruned by the run meanwhile
                problem = e
                if claims is not None:
                    claims.release(ref.path)
                    (say or _no_line)(f"skip   {ref.path.rpartition('/')[2]}: {e}")
                continue
            return ref.path
        if not pruned:
            break
    raise CheckpointError(f"--run: no checkpoint of run {store.run_name!r} is whole ({problem})")


def _no_line(_line: str) -> None:
    pass
