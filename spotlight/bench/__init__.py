"""Benchmarks that print figures with ratios to a baseline measured in the same run."""
