"""The Ray runtime: one actor per block (stage.py), a controller actor that owns the topology
(controller.py), and the driver-side handle (pipeline.py). Uses growpipe.nn; never imported by it."""

NAMESPACE = "growpipe"
"""Ray namespace of every growpipe actor, so a run's controller can be found by name."""
