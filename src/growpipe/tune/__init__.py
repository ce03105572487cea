"""Ray Tune sweeps over growpipe runs: sweep files (spec), the trial functions (trials), the driver (sweep)
and the stored per-exit predictions threshold sweeps re-read (predictions). Nothing here is imported by
the rest of growpipe."""
