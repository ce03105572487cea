"""growpipe serve: a Ray Serve application answering with a (growing) net; the inference it shares with
the MLflow model (predictor)."""
