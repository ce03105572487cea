"""The Ray Serve application: replicas that answer classification requests with a net, reloading it in place.

    POST /predict   {"inputs": [[...], ...], "threshold": 0.9, "confidence": "max_prob"}
                 -> {"prediction": [...], "exit_depth": [...], "confidence": [...], "version": {...}}
    GET  /version   the version every answer of this replica carries (run, checkpoint, epoch, blocks)

Which net a replica serves is its deployment's `user_config` ({"source": a checkpoint directory or an MLflow
model URI, ...}); a new version is deployed as a new user_config, which Serve applies replica by replica
through `reconfigure` without restarting them (a lightweight update). `reconfigure` loads the new net beside
the old one and swaps it in one assignment: a request is answered wholly by one version. A version that fails
to load is logged and refused; the replica keeps serving the previous one.

Requests are batched (`@serve.batch`, counted in rows); every row runs real early exit
(growpipe.serve.predictor), so a sample confident at block k never runs the blocks above it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from ray import serve

from growpipe.errors import GrowpipeError, InputError
from growpipe.serve.predictor import Predictor
from growpipe.serve.request import PredictRequest, parse_body, parse_request

log = logging.getLogger("ray.serve")
INGRESS = "NetServer"
MAX_BATCH_ROWS = 1024


def load_version(user_config: dict[str, Any]) -> Predictor:
    """The net a user_config names: a checkpoint directory, or an MLflow model (downloaded, its checkpoint)."""
    source = user_config["source"]
    if user_config.get("kind") != "model":
        return Predictor.load(source)
    from mlflow.artifacts import download_artifacts

    local = Path(download_artifacts(artifact_uri=source, dst_path=tempfile.mkdtemp(prefix="growpipe-model-"),
                                    tracking_uri=user_config.get("tracking_uri")))  # fmt: skip
    found = sorted(p.parent for p in local.rglob("manifest.json"))
    if not found:
        raise GrowpipeError(f"{source}: the model holds no growpipe checkpoint (artifacts/checkpoint)")
    return Predictor.load(found[0])


@serve.deployment(name=INGRESS, max_ongoing_requests=64, health_check_period_s=5)
class NetServer:
    """A replica: one loaded net (the version its user_config names), batched early-exit answers."""

    def __init__(self) -> None:
        self.current: tuple[str, Predictor] | None = None  # (source, its net): swapped in one assignment
        self.refused: dict[str, str] = {}

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Load the version `user_config` names and swap it in; a failure keeps the previous version (and
        fails only a replica that has none yet, which Serve then replaces)."""
        source = user_config["source"]
        if self.current is not None and source == self.current[0]:
            return
        t0 = time.perf_counter()
        try:
            loaded = load_version(user_config)
        except Exception as e:
            if self.current is None:
                raise
            self.refused[source] = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            log.warning("growpipe: refused %s (%s); still serving %s", source, self.refused[source], self.current[0])
            return
        self.current = (source, loaded)  # a request takes self.current once: old net or new, never a mix
        log.info("growpipe: serving %s (%d blocks), loaded in %.2f s", source, loaded.version.blocks,
                 time.perf_counter() - t0)  # fmt: skip

    def status(self) -> dict[str, Any]:
        """What this replica serves and what it refused (the follower reads it)."""
        assert self.current is not None
        source, predictor = self.current
        return {"source": source, "version": predictor.version.to_dict(), "refused": dict(self.refused)}

    async def predict(self, request: dict[str, Any] | PredictRequest) -> dict[str, Any]:
        """The Python handle's entry: a request's fields as a dict (or a PredictRequest); InputError when bad."""
        req = request if isinstance(request, PredictRequest) else parse_request(request)
        assert self.current is not None
        predictor = self.current[1]
        x, side = predictor.inputs(req.inputs, req.side)
        return await self._answer((predictor, x, side, req.threshold, req.confidence))

    async def __call__(self, http: Any) -> Any:
        from starlette.responses import JSONResponse

        path = http.url.path.rstrip("/").rpartition("/")[2]
        if http.method == "GET" and path in ("version", ""):
            return JSONResponse(self.status())
        if http.method != "POST" or path != "predict":
            return JSONResponse({"error": f"{http.method} {http.url.path}: use POST /predict or GET /version"},
                                status_code=404)  # fmt: skip
        try:
            return JSONResponse(await self.predict(parse_body(await http.body())))
        except InputError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    @serve.batch(max_batch_size=MAX_BATCH_ROWS, batch_wait_timeout_s=0.002, batch_size_fn=lambda items: sum(
        len(item[1]) for item in items))  # fmt: skip
    async def _answer(self, items: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Requests batched together: those with the same net and options run as one early-exit pass."""
        import torch

        out: list[dict[str, Any]] = [{}] * len(items)
        groups: dict[tuple[int, float, str], list[int]] = {}
        for i, (predictor, _, _, threshold, kind) in enumerate(items):
            groups.setdefault((id(predictor), float(threshold), kind), []).append(i)
        for members in groups.values():  # the same net: the same input shape and side groups
            predictor, _, side, threshold, kind = items[members[0]]
            x = torch.cat([items[i][1] for i in members])
            joined = {k: torch.cat([items[i][2][k] for i in members]) for k in side}
            answers = predictor.answers(predictor.early_exit(x, joined, threshold, kind),
                                        [len(items[i][1]) for i in members])  # fmt: skip
            for i, answer in zip(members, answers, strict=True):
                out[i] = answer
        return out


def build_app(args: dict[str, Any]) -> Any:
    """The application (Serve's import path growpipe.serve.app:build_app); `args` may hold `replicas`."""
    return NetServer.bind()
