"""Exceptions with messages that name the problem and the fix.

They take one string argument, so they pickle cleanly across Ray actors.
"""


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


class PipelineError(GrowpipeError, RuntimeError):
    """A pipeline run could not start or did not finish."""


class InputError(PipelineError, ValueError):
    """Bad input met by a run on the cluster (the data its worker read, a grow request, a run name)."""


BAD_INPUT = (ConfigError, DataError, ShapeError, CheckpointError, InputError)
"""Errors that mean the user's input is wrong (exit code 2); any other failure of a run exits with 1."""
