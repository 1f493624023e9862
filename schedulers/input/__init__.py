"""What the system reads from outside, bounded and checked before anything uses it: user files
(`files`: configs, prompt files, traces, price tables; `InputError`, `ConfigError` and the one-line
error format), any untrusted file or object read back (`bounded_read`: size and depth limits, typed
refusals), and config sections (`config_section`: pydantic dataclasses whose errors are those
lines). The lowest floor: `schedulers`, `cloud` and `spotlight` all read through it."""
