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

BATCH = 512


class GrowpipeModel(mlflow.pyfunc.PythonModel):
    """Adaptive early-exit inference over a growpipe checkpoint."""

    def load_context(self, context: Any) -> None:
        from growpipe.checkpoint import load_net

        self.net, _, self.cfg = load_net(context.artifacts["checkpoint"])

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import pandas as pd
        import torch

        from growpipe.data.moments import standardise
        from growpipe.nn.inference import Exited
        from growpipe.nn.packet import Packet

        params = params or {}
        threshold = float(params.get("threshold", 1.0))
        kind = str(params.get("confidence", "max_prob"))
        info = self.net.info
        x = np.asarray(model_input.to_numpy() if hasattr(model_input, "to_numpy") else model_input)
        x = torch.as_tensor(x.reshape(-1, *info.shape), dtype=torch.long if info.dtype == "long" else torch.float32)
        if info.normalize:
            x = standardise(x, info.normalize, 1)
        # real early exit: a sample that confident at an exit leaves there, the blocks above never compute it
        full_path = threshold >= 1.0  # (a saturated softmax reaches 1.0: the default must mean the full path)
        rows = torch.arange(len(x))
        parts = [self.net.early_exit(Packet(x=x[i : i + BATCH], rows=rows[i : i + BATCH]), None if full_path
                                     else threshold, kind) for i in range(0, len(x), BATCH)]  # fmt: skip
        out = Exited.cat(parts)
        return pd.DataFrame({"prediction": out.prediction.numpy(), "exit_depth": out.depth.numpy(),
                             "confidence": out.confidence.numpy()})  # fmt: skip


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
