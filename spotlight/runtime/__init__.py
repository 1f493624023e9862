"""Where the roles run: the learner, the rollout worker, and the runtimes that drive them through the
fleet engine (`schedulers.fleet`) — in this process (`local`) or as Ray actors (`ray_runtime`)."""
