"""The classical bar beside a run: TF-IDF + logistic regression for text, logistic regression on standardised
features for tables and images (scikit-learn), fitted on exactly the rows the run trains on (data.limit_train
subsampling and the data.val_fraction hold-out included) and scored on the rows it tests on."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from growpipe.config import FeatureGroupsSpec, RunConfig
from growpipe.data import DataBundle, Split, batch_at, load_data
from growpipe.errors import GrowpipeError
from growpipe.loop.callbacks import RunCallback
from growpipe.report import format_bar

TEXT_BAR = "tfidf+logreg"
FEATURE_BAR = "standardised+logreg"
TEXT_MODEL = ("TfidfVectorizer(sublinear_tf, ngram_range=(1, 2), min_df=2, max_features=500000) + "
              "LogisticRegression(C=10, saga, tol=1e-3, random_state=seed)")  # fmt: skip
FEATURE_MODEL = "StandardScaler (fit on train) + LogisticRegression(C=1, lbfgs, max_iter={iterations})"
LBFGS_WORK = 15_000_000_000
"""What one fit of the feature bar may cost, in rows x features x classes per lbfgs iteration summed over its
iterations: the iteration cap of a set that large (Fashion-MNIST: 60,000 x 784 x 10 gets 31, about 15 s on two
busy cores, 0.843; 200 iterations take two minutes for 0.838). Smaller sets get up to LBFGS_MOST."""
LBFGS_FEWEST, LBFGS_MOST = 30, 200
MAX_BAR_BYTES = 2 << 30
"""Largest train + test feature matrix (float32) the bar reads into memory from data read from disk per batch."""
READ_ROWS = 1024
"""Rows read per batch from data read from disk per batch."""


class ClassicalBar(RunCallback):
    """eval.baseline: the run's classical bar, drawn in the loop's process once the run finished (so it never
    competes with training for the cores), in the result JSON as `baseline`. Data it cannot handle, or
    cannot read here, is said in one line and the run goes on without it."""

    def __init__(self, cfg: RunConfig, say: Callable[[str], None]):
        self.cfg, self.say = cfg, say

    def result_fields(self) -> dict[str, Any]:
        try:
            bar = classical_bar(self.cfg)
        except GrowpipeError as e:  # e.g. a cluster node without the data: the run's result stands
            bar = {"skipped": str(e).splitlines()[0]}
        except Exception as e:  # noqa: BLE001 - the bar is an extra: its own failure must not cost the run
            first = (str(e).splitlines() or [""])[0]
            bar = {"skipped": f"the bar failed ({type(e).__name__}: {first}); the run's result stands without it"}
        if "skipped" in bar:
            self.say(format_bar(bar))
        return {"baseline": bar}


def groups_refusal(scheme: str) -> str | None:
    """Why the bar cannot be drawn for data cut into these feature groups (None: it can). Bands, channels and
    columns are cuts of the same rows: the bar takes the whole input. Chunks cut a token sequence the net
    reads in parts, which a bag of words does not compare with."""
    if scheme == "chunks":
        return ("data.feature_groups.scheme=chunks: sequence-feature groups have no classical bar (a bag of words "
                "sees every chunk at once); growpipe baseline --set data.feature_groups.scheme=none draws one on the "
                "whole text")  # fmt: skip
    return None


def memory_refusal(streamed: bool, rows: int, features: int) -> str | None:
    """Why data read from disk per batch cannot be read whole for the bar (None: it fits MAX_BAR_BYTES)."""
    need = 4 * rows * features
    if not streamed or need <= MAX_BAR_BYTES:
        return None
    return (f"the data is read from disk per batch and its {rows:,} rows x {features:,} features need "
            f"{need / 2**30:.1f} GiB in memory (the bar reads at most {MAX_BAR_BYTES / 2**30:.0f} GiB); "
            "growpipe baseline --set data.limit_train=N draws one on a subsample")  # fmt: skip


def classical_bar(cfg: RunConfig) -> dict[str, Any]:
    """The bar of the run `cfg` describes: {kind, model, accuracy, seconds, load_seconds, train_rows, test_rows}
    ({"skipped": why} for data it cannot handle). Data errors raise as load_data raises them."""
    if why := groups_refusal(cfg.data.feature_groups.scheme):
        return {"skipped": why}
    start = time.perf_counter()
    spec = cfg.data.model_copy(update={"feature_groups": FeatureGroupsSpec()})  # same rows, whole inputs
    bundle = load_data(spec, cfg.seed, keep_text=True)
    features = int(np.prod(bundle.input_shape))
    if why := memory_refusal(bundle.train.streamed, len(bundle.train) + len(bundle.test), features):
        return {"skipped": why}
    if bundle.kind == "text":
        xtr, ytr, xte, yte = text_rows(bundle)
        kind, model, fit = TEXT_BAR, TEXT_MODEL, partial(fit_text, seed=cfg.seed)
    else:
        (xtr, ytr), (xte, yte) = feature_rows(bundle.train), feature_rows(bundle.test)
        iterations = lbfgs_iterations(len(ytr), features, bundle.num_classes)
        kind, model = FEATURE_BAR, FEATURE_MODEL.format(iterations=iterations)
        fit = partial(fit_features, iterations=iterations)
    loaded = time.perf_counter()
    predict = fit(xtr, ytr)
    accuracy = float(np.mean(predict(xte) == yte))
    return {
        "kind": kind,
        "model": model,
        "accuracy": round(accuracy, 4),
        "seconds": round(time.perf_counter() - loaded, 2),
        "load_seconds": round(loaded - start, 2),
        "train_rows": len(ytr),
        "test_rows": len(yte),
    }


def text_rows(bundle: DataBundle) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw train texts and labels, test texts and labels of a text bundle loaded with keep_text."""
    assert bundle.train.text is not None and bundle.test.text is not None
    return bundle.train.text, bundle.train.y.numpy(), bundle.test.text, bundle.test.y.numpy()


def feature_rows(split: Split) -> tuple[np.ndarray, np.ndarray]:
    """A split's inputs flattened to (rows, features) float32 and its labels; data read from disk per batch
    is read through once (rows data.skip_bad_files leaves out are left out here too)."""
    if not split.streamed:
        return split.x.reshape(len(split), -1).numpy(), split.y.numpy()
    xs, ys = [], []
    for b in range(-(-len(split) // READ_ROWS)):
        packet = batch_at(split, READ_ROWS, b)
        xs.append(packet.x.reshape(packet.batch_size, -1).numpy())
        ys.append(packet.labels().numpy())
    return np.concatenate(xs), np.concatenate(ys)


def fit_text(texts: np.ndarray, labels: np.ndarray, seed: int = 0) -> Any:
    """TEXT_MODEL fitted on `texts` (saga's sample order drawn from `seed`): its predict function (raw texts ->
    class ids)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2, max_features=500_000, dtype=np.float32),
        LogisticRegression(C=10.0, solver="saga", tol=1e-3, max_iter=200, random_state=seed),
    )
    return _quietly_fitted(model, texts, labels).predict


def lbfgs_iterations(rows: int, features: int, classes: int) -> int:
    """The feature bar's iteration cap: LBFGS_WORK spread over iterations of this size, within
    [LBFGS_FEWEST, LBFGS_MOST] (digits converges in 32 of its 200)."""
    return int(min(LBFGS_MOST, max(LBFGS_FEWEST, LBFGS_WORK // max(rows * features * classes, 1))))


def fit_features(x: np.ndarray, labels: np.ndarray, iterations: int = LBFGS_MOST) -> Any:
    """FEATURE_MODEL fitted on `x` (at most `iterations` lbfgs steps): its predict function."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=iterations))
    return _quietly_fitted(model, x, labels).predict


def _quietly_fitted(model: Any, x: Any, y: np.ndarray) -> Any:
    """`model` fitted; a solver stopped at its iteration cap gives the bar as it stands (see LBFGS_WORK; a
    ConvergenceWarning would only alarm)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(x, y)
