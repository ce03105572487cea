"""Exceptions with messages that name the problem and the fix.

They take one string argument, so they pickle cleanly across Ray actors (NonFiniteError, built from parts,
says how to rebuild itself).
"""

from __future__ import annotations


class GrowpipeError(Exception):
    """Base class: a user-facing problem with a one-line (per item) explanation."""


class ConfigError(GrowpipeError, ValueError):
    """A config field is wrong; the message names the field and the fix."""


class DataError(GrowpipeError, ValueError):
    """A dataset is missing, empty or malformed."""


class DataNotFoundError(DataError):
    """The data is not where the config says (a path, directory or dataset that this node cannot reach)."""


class ShapeError(GrowpipeError, ValueError):
    """Blocks whose shapes do not chain."""


class CheckpointError(GrowpipeError, ValueError):
    """A checkpoint is missing, incomplete or does not match the config."""


class StageError(GrowpipeError, RuntimeError):
    """A pipeline stage failed or died; the message names the stage, its block and the original error."""


class StageLostError(StageError):
    """A stage actor (or its node) is gone; the run can recover from its last checkpoint."""


class OutputError(GrowpipeError, RuntimeError):
    """An output could not be written (no space left, a folder gone read-only); what was there is untouched."""


class NonFiniteError(StageError):
    """A training step met a non-finite loss or gradient (train.on_nonfinite: stop), or an epoch skipped every
    batch (skip_batch). The run ends (exit 1); it is never retried from a checkpoint.

    Built from its parts, each filled in by whoever knows it (`located`): the problem and the fix by the
    guard (growpipe.nn.guard), the block and batch by the block, the stage by a stage actor, the epoch by
    the run loop. The message is one line: "WHERE: PROBLEM at epoch E, batch B; HINT".
    """

    def __init__(self, problem: str, hint: str = "", where: str = "", epoch: int | None = None,
                 batch: int | None = None):  # fmt: skip
        self.problem, self.hint, self.where, self.epoch, self.batch = problem, hint, where, epoch, batch
        super().__init__(self._text())

    def _text(self) -> str:
        at = ", ".join(f"{k} {v}" for k, v in (("epoch", self.epoch), ("batch", self.batch)) if v is not None)
        return (f"{self.where}: " if self.where else "") + self.problem + (f" at {at}" if at else "") + (
            f"; {self.hint}" if self.hint else "")  # fmt: skip

    def located(self, where: str | None = None, epoch: int | None = None, batch: int | None = None) -> NonFiniteError:
        """The same error with the place filled in: `where` replaces the current one (a stage names its block
        more fully); epoch and batch are kept when already known."""
        return NonFiniteError(self.problem, self.hint, where if where is not None else self.where,
                              self.epoch if self.epoch is not None else epoch,
                              self.batch if self.batch is not None else batch)  # fmt: skip

    def __reduce__(self) -> tuple[type, tuple]:
        return (type(self), (self.problem, self.hint, self.where, self.epoch, self.batch))


class PipelineError(GrowpipeError, RuntimeError):
    """A pipeline run could not start or did not finish."""


class InputError(PipelineError, ValueError):
    """Bad input met by a run on the cluster (the data its worker read, a grow request, a run name)."""


BAD_INPUT = (ConfigError, DataError, ShapeError, CheckpointError, InputError)
"""Errors that mean the user's input is wrong (exit code 2); any other failure of a run exits with 1."""


def describe(e: BaseException) -> str:
    """A one-line description of an error raised anywhere in a run (a Ray task error by the one it carries)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, GrowpipeError | ValueError | RuntimeError) and not isinstance(e, GrowpipeError):
        return str(cause)
    if isinstance(e, GrowpipeError):
        return str(e)
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"
