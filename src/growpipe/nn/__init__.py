"""Pure-PyTorch model code: blocks, learning rules, the growable net. Never imports Ray."""
