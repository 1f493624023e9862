"""Words for the terminal, shared by every floor of `spotlight/` (a bottom-floor module: it imports
nothing of the project, so the trainer, the runtimes and the simulator can all use it)."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`count` and its noun, in the plural unless it is 1: "1 iteration", "2 iterations"."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"
