"""The MLflow pyfunc of a trained growpipe net, as models-from-code: MLflow copies this file into the model and
runs it at load (`python_model=<this file>`), so no Python object is cloudpickled. `growpipe.serving` writes the
model; its `predict` answers through the shared inference (`growpipe.serve.predictor.Predictor`).

No `from __future__ import annotations` here: MLflow reads predict's type hints as objects. The input hint is
np.ndarray, a type MLflow does not infer a schema from: the model's signature (a tensor of the net's input
shape, the params threshold and confidence) is given when it is written.
"""

from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from growpipe.serve.predictor import Predictor

OUTPUT_COLUMNS = ("prediction", "exit_depth", "confidence")


class GrowpipeModel(PythonModel):
    """Adaptive early-exit inference over the growpipe checkpoint the model carries (artifact `checkpoint`)."""

    def load_context(self, context: Any) -> None:
        self.predictor = Predictor.load(context.artifacts["checkpoint"])

    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Per input row (raw, as the data reads it): prediction, exit depth (1-based) and confidence."""
        params = params or {}
        out = self.predictor.predict(model_input, float(params.get("threshold", 1.0)),
                                     str(params.get("confidence", "max_prob")))  # fmt: skip
        return pd.DataFrame({k: out[k] for k in OUTPUT_COLUMNS})


mlflow.models.set_model(GrowpipeModel())
