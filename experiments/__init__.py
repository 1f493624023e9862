"""Experiment configs (YAML) and the scripts that run studies over them."""
