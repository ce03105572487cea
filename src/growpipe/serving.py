"""A trained (grown) net as an MLflow model: a pyfunc whose `predict` runs adaptive early exit.

    model = mlflow.pyfunc.load_model("models:/NAME/1")      # or runs:/RUN_ID/model
    out = model.predict(x, params={"threshold": 0.9, "confidence": "max_prob"})
    out["prediction"], out["exit_depth"], out["confidence"]

`x` holds inputs of the data's shape as read, before standardisation (images as floats in [0, 1], tables as
their numbers, token ids for text), a batch at a time; the model standardises them with the training
split's statistics stored in its checkpoint (data.normalize). `threshold` 1.0 (the default) takes the full
path; lower lets a sample leave at the first exit that confident. `mlflow models serve -m models:/NAME/1`
serves the same function over HTTP.
The model carries the growpipe package (code_paths) and its checkpoint (a one-shard growpipe checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np


class GrowpipeModel(mlflow.pyfunc.PythonModel):
    """Adaptive early-exit inference over a growpipe checkpoint."""

    def load_context(self, context: Any) -> None:
        from growpipe.serve.predictor import Predictor

        self.predictor = Predictor.load(context.artifacts["checkpoint"])

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import pandas as pd

        params = params or {}
        out = self.predictor.predict(model_input, float(params.get("threshold", 1.0)),
                                     str(params.get("confidence", "max_prob")))  # fmt: skip
        return pd.DataFrame({k: out[k] for k in ("prediction", "exit_depth", "confidence")})


def save_model(path: str | Path, checkpoint: str | Path, net: Any) -> Path:
    """Write the MLflow model directory for a saved checkpoint of `net` (with signature and input example)."""
    import torch
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    import growpipe

    info = net.info
    dtype = np.dtype(np.int64 if info.dtype == "long" else np.float32)
    signature = ModelSignature(
        inputs=Schema([TensorSpec(dtype, (-1, *info.shape))]),
        outputs=Schema([ColSpec("long", "prediction"), ColSpec("long", "exit_depth"), ColSpec("float", "confidence")]),
        params=ParamSchema([ParamSpec("threshold", "double", 1.0), ParamSpec("confidence", "string", "max_prob")]),
    )
    example = np.zeros((2, *info.shape), dtype=dtype)
    requirements = [f"torch=={torch.__version__.split('+')[0]}", "numpy", "pandas", "pydantic>=2.6", "pyyaml"]
    mlflow.pyfunc.save_model(
        str(path),
        python_model=GrowpipeModel(),
        artifacts={"checkpoint": str(checkpoint)},
        code_paths=[str(Path(growpipe.__file__).parent)],
        signature=signature,
        input_example=example,
        pip_requirements=requirements,
    )
    return Path(path)
