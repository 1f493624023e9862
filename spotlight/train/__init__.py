"""The controller: the iteration loop (`trainer`), seed exploration's planning side (`exploration`),
checkpoints and their copies in a store, the running rollout's committed state, and the run's cost control."""
