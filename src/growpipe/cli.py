"""The `growpipe` command: train, grow, sweep, partition, evaluate, baseline, serve, data, bench.

This module runs a command: its arguments (cli_parser), its handler (cli_commands), then its exit code: 0, 2 for
bad input, 1 for a failed run, 130/143 when stopped by a signal."""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Sequence

# Only argparse, errors and signals at module level: `growpipe --help` and a mistyped argument are answered before
# any handler loads, and each handler imports its own dependencies (torch, Ray, MLflow, pandas: seconds) when it runs.
from growpipe import signals
from growpipe.cli_parser import BENCHES, EPILOG, build_parser
from growpipe.errors import BAD_INPUT, GrowpipeError

__all__ = ["BENCHES", "EPILOG", "build_parser", "main"]


def _sweep_stop(signum: int) -> None:
    """A sweep stops as Tune stops on Ctrl-C (gracefully, saving what a resume needs): SIGTERM becomes SIGINT,
    which Tune handles while trials run (and this module's handler, raising KeyboardInterrupt, otherwise)."""
    if signum == signal.SIGTERM:
        signal.raise_signal(signal.SIGINT)
    else:
        raise KeyboardInterrupt("signal SIGINT")


def main(argv: Sequence[str] | None = None, *, exits: bool | None = None) -> int:
    """Entry point of the `growpipe` console script; the exit code. `exits` (default: when argv is None, the
    console script; the jobs/ entry points say so too): the process ends here (see _exit_when_stopped)."""
    code = _run(argv)
    if argv is None if exits is None else exits:
        _exit_when_stopped(code)
    return code


def _exit_when_stopped(code: int) -> None:
    """The console script ends here: exit handlers (Ray's shutdown, temporary folders) run now, with a signal
    meanwhile ending the process at once as stopped; then the process exits without the interpreter's
    teardown, which a half-started Ray's C++ threads can crash and during which signals are not handled."""
    if not signals.received():
        signals.exit_at_once_on_signal()
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from growpipe.cli_commands import HANDLERS  # lazy: after parsing: --help and argument errors never load it

    restore = signals.install(_sweep_stop if args.command == "sweep" else None)
    try:
        code = HANDLERS[args.command](args)
        signals.check()  # a stop whose KeyboardInterrupt was swallowed where it landed still ends as a stop
        return code
    except KeyboardInterrupt:
        return _stopped(args.command)
    except GrowpipeError as e:
        if signals.received():  # the run ended because it was being stopped
            return _stopped(args.command)
        print(f"growpipe {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, BAD_INPUT) else 1
    finally:
        restore()


def _stopped(command: str) -> int:
    """Say that the command was stopped, kill what it started that still runs; 130 (SIGINT) or 143 (SIGTERM)."""
    signals.exit_at_once_on_signal()  # a second Ctrl-C / SIGTERM while this cleans up ends the process at once

    print(f"growpipe {command}: stopped by {signals.describe()}", file=sys.stderr)
    signals.end_descendants()
    return signals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
