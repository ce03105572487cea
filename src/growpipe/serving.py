"""A trained (grown) net as an MLflow model directory: a pyfunc whose `predict` runs adaptive early exit.

    model = mlflow.pyfunc.load_model("models:/NAME/1")      # or models:/MODEL_ID
    out = model.predict(x, params={"threshold": 0.9, "confidence": "max_prob"})
    out["prediction"], out["exit_depth"], out["confidence"]

`x` holds inputs of the data's shape as read, before standardisation (images as floats in [0, 1], tables as
their numbers, token ids for text), a batch at a time; the model standardises them with the training
split's statistics stored in its checkpoint (data.normalize). `threshold` 1.0 (the default) takes the full
path; lower lets a sample leave at the first exit that confident. `growpipe mlflow serve models:/NAME/1`
serves the same function over HTTP.
The model is written as models-from-code (growpipe/mlflow_model.py, nothing cloudpickled) and carries the
growpipe package (code_paths) and its checkpoint (a one-shard growpipe checkpoint). growpipe.tracking logs it
as a LoggedModel of the run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from growpipe.errors import ConfigError

MODEL_CODE = Path(__file__).with_name("mlflow_model.py")
"""The pyfunc's code file (read by path: importing it would set MLflow's current model in this process)."""

QUIET_MLFLOW = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_LOGGING_LEVEL": "WARNING"}
"""MLflow settings while growpipe writes, uploads or fetches a model: no progress bars in a run's output, and
in the scoring server it starts no INFO lines (MLflow reads the level at import)."""


def quiet_mlflow() -> contextlib.AbstractContextManager[None]:
    """QUIET_MLFLOW in the environment for the duration (MLflow reads it per call); the caller's values kept."""
    return environment({k: v for k, v in QUIET_MLFLOW.items() if k not in os.environ})


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the duration, the variables as they were afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def save_model(path: str | Path, checkpoint: str | Path, net: Any, example: Any) -> Path:
    """Write the MLflow model directory for a saved checkpoint of `net`: signature, and `example` (a few raw
    rows of the data, DataBundle.example_rows) as the input example."""
    import mlflow.models.model
    import mlflow.pyfunc
    import torch  # lazy: growpipe.tracking imports this module and stays free of torch
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    info = net.info
    dtype = np.dtype(np.int64 if info.dtype == "long" else np.float32)
    signature = ModelSignature(
        inputs=Schema([TensorSpec(dtype, (-1, *info.shape))]),
        outputs=Schema([ColSpec("long", "prediction"), ColSpec("long", "exit_depth"), ColSpec("float", "confidence")]),
        params=ParamSchema([ParamSpec("threshold", "double", 1.0), ParamSpec("confidence", "string", "max_prob")]),
    )
    requirements = [f"torch=={torch.__version__.split('+')[0]}", "numpy", "pandas", "pydantic>=2.6", "pyyaml"]
    current = mlflow.models.model.__mlflow_model__  # running the code file sets it: this process's is kept
    try:
        with quiet_mlflow():
            mlflow.pyfunc.save_model(
                str(path),
                python_model=str(MODEL_CODE),
                artifacts={"checkpoint": str(checkpoint)},
                code_paths=[str(Path(__file__).parent)],  # the growpipe package
                signature=signature,
                input_example=np.asarray(example, dtype=dtype).reshape(-1, *info.shape),
                pip_requirements=requirements,
            )
    finally:
        mlflow.models.model.__mlflow_model__ = current
    return Path(path)


def scoring_server_command(model_uri: str, host: str, port: int) -> list[str]:
    """`mlflow models serve -m MODEL_URI --env-manager local` on `host`:`port`, run by this Python."""
    return [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
            "--host", host, "--port", str(port)]  # fmt: skip


def scoring_server_env(environ: dict[str, str], tracking_uri: str) -> dict[str, str]:
    """The environment MLflow's scoring server needs: this virtualenv's scripts first on PATH (MLflow starts
    the server as `exec uvicorn ...` in bash, found on PATH: without an activated virtualenv it is not there),
    the tracking store that resolves models:/ URIs, and no download bars."""
    scripts = sysconfig.get_path("scripts")
    path = [scripts, *(p for p in environ.get("PATH", "").split(os.pathsep) if p and p != scripts)]
    return {**QUIET_MLFLOW, **environ, "PATH": os.pathsep.join(path), "MLFLOW_TRACKING_URI": tracking_uri}


def serve_model(model_uri: str, tracking_uri: str, host: str, port: int) -> NoReturn:
    """Become MLflow's scoring server for `model_uri` (this process is replaced): checked first, so a model
    URI that does not resolve or a port in use is one line (ConfigError) before anything starts."""
    import mlflow.models

    env = scoring_server_env(dict(os.environ), tracking_uri)
    try:
        with environment({k: env[k] for k in ("MLFLOW_TRACKING_URI", *QUIET_MLFLOW)}):  # MLflow resolves with these
            mlflow.models.get_model_info(model_uri)
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{model_uri}: no MLflow model there in {tracking_uri} ({reason}); give models:/NAME/VERSION "
                          "or models:/MODEL_ID of that store (--tracking-uri chooses another)") from None  # fmt: skip
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"port {port} on {host} is not free ({e.strerror}); choose another with --port") from None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, scoring_server_command(model_uri, host, port), env)
