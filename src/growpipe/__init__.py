"""growpipe."""
