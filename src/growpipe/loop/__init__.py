"""The run lifecycle, written once for every runtime: the loop (loop.py) drives an Engine (engine.py) through
explicit states (states.py), asks policies for decisions (policies.py, growpipe.growth) and reports through
callbacks (callbacks.py). Nothing here imports Ray."""
