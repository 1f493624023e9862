"""The live run: the trainer's loop (`trainer`), the run folder's jobs (lock, store copies of
checkpoints and results, the running rollout's committed state) and the run's cost control. It stands
on `spotlight.runtime` (who executes the phases) and `spotlight.iteration` (their order)."""
