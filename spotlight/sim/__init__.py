"""The trace-replay simulator: the fleet engine with a modelled executor on a simulated clock
(`simulator`, `modelled_executor`), the two baselines that behave differently (`restart`, `oracle`),
the step-time and progress models, and the report (table, plots)."""
