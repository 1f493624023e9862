"""A config section: a dataclass whose fields declare their types and ranges, read from plain
data (a YAML mapping) by pydantic, every refusal one `ConfigError` line naming the dotted field.

`@section` makes a class a pydantic dataclass — still a stdlib dataclass, so `dataclasses.replace`,
`asdict` and `fields` work as before — that (tests/spotlight/test_config.py checks each):
- refuses unknown keys (`train.lrr: unknown field (expected one of steps, ...)`);
- refuses inf and nan in every float field (issue 13: `train.lr: .inf` trained 89% of the weights
  into NaN);
- takes scalars strictly, as a field annotates them: `StrictInt` refuses 3.0, "3" and true,
  `StrictFloat` takes an integer but no string, `StrictStr` no number, `StrictBool` no 0/1;
- checks each field's range where the field declares it (`limited(30, gt=0, le=1_000_000)`).

Checks that involve several fields stay in the section's `__post_init__`, which raises
`ConfigError("field: expected ..., got ...")` naming the field relative to its section. Whether a
section is built from a mapping (`build`) or constructed directly (`TrainConfig(steps=0)`,
`dataclasses.replace`), the error is a `ConfigError` whose line is `problem`'s: pydantic's first
error (an unknown key before any value), its location as the dotted name
(`reward.components[1].weight`), then `expected WHAT, got VALUE`, the value quoted by `short`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Callable, TypeVar

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic.dataclasses import is_pydantic_dataclass

from schedulers.input.files import ConfigError, short

T = TypeVar("T")

CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
"""Every section's pydantic config. Not `strict=True`: a strict dataclass takes only instances of
itself, so a nested section could not be read from its mapping; strictness is the scalar types'
(`StrictInt`, ...) instead."""

_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden", "invalid_key")
_TYPES = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "true or false",
          "finite_number": "a finite number", "list_type": "a list", "tuple_type": "a list"}
_LOWER = {"greater_than": ">", "greater_than_equal": ">="}
_UPPER = {"less_than": "less than", "less_than_equal": "at most"}


@typing.dataclass_transform(field_specifiers=(dataclasses.field, Field))
def section(cls: type[T]) -> type[T]:
    """`cls` as a config section (module docstring): a pydantic dataclass with `CONFIG`, whose
    constructor raises `ConfigError` with `problem`'s line instead of pydantic's ValidationError."""
    cls = pydantic_dataclass(cls, config=CONFIG)
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as err:
            raise ConfigError(problem(err, cls)) from None

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def limited(default: Any = dataclasses.MISSING, *, unit: str = "", expected: str | None = None, note: str = "",
            **constraints: Any) -> Any:
    """A field's default and its constraints (`Field`'s: gt, ge, lt, le, min_length, max_length,
    pattern), with the words of their errors: `unit` follows an upper bound ("at most 3,600 s"),
    `note` a lower bound ("an integer >= 2 (GRPO needs a group)"), and `expected` replaces the words
    of every constraint of the field ("an integer in [0, 4294967295]")."""
    words = {k: v for k, v in (("unit", unit), ("expected", expected), ("note", note)) if v}
    factory = constraints.pop("default_factory", None)
    given = {"default_factory": factory} if factory is not None else {"default": default}
    return Field(**given, json_schema_extra=words or None, **constraints)


def build(cls: Callable[..., T], data: Any) -> T:
    """Section `cls` from `data` (a mapping of its fields), or `ConfigError` with `problem`'s line.

    A plain dataclass (`spotlight.sim.step_time.StepTimes`) checks its own values in its
    `__post_init__`; of it, only unknown keys are refused here."""
    if is_pydantic_dataclass(cls):
        try:
            return cls.__pydantic_validator__.validate_python(data)  # type: ignore[attr-defined]
        except ValidationError as err:
            raise ConfigError(problem(err, cls)) from None
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of {cls.__name__} fields, got {short(data)}")
    unknown = next((k for k in data if k not in names), None)
    if unknown is not None:
        raise ConfigError(f"{_key(unknown)}: unknown field (expected one of {', '.join(names)})")
    return cls(**data)


def problem(err: ValidationError, cls: type) -> str:
    """The one line of pydantic's first error in building section `cls`: an unknown key's before
    any value's (as a reader fixes a file top down, a misspelt key first)."""
    errors = err.errors(include_url=False)
    first = next((e for e in errors if e["type"] in _UNKNOWN), errors[0])
    kind, loc, ctx = first["type"], first["loc"], first.get("ctx") or {}
    if kind in _UNKNOWN:
        owner, _ = _field(cls, loc[:-1] + ("",))
        fields = ", ".join(getattr(owner, "__pydantic_fields__", {}))
        return f"{_name(loc[:-1], _key(loc[-1]))}: unknown field (expected one of {fields})"
    if kind in ("value_error", "assertion_error"):  # a section's __post_init__: its line names the field in it
        return _name(loc, str(ctx["error"]))
    _, info = _field(cls, loc)
    words = (info.json_schema_extra if info is not None else None) or {}
    nullable = info is not None and isinstance(loc[-1], str) and type(None) in typing.get_args(info.annotation)
    if kind in _TYPES:
        expected = _TYPES[kind] if not (kind == "float_type" and isinstance(first["input"], int)) else "a finite number"
        expected += " or null" if nullable else ""
    elif kind == "literal_error":
        expected = "one of " + ctx["expected"].replace(" or ", ", ")
    elif kind in ("dataclass_type", "dataclass_args_type"):
        expected = f"a mapping of {ctx.get('class_name', 'section')} fields"
    elif "expected" in words:
        expected = str(words["expected"])
    elif kind in _LOWER:
        bound = ctx["gt" if kind == "greater_than" else "ge"]
        expected = ("a positive integer" if kind == "greater_than" and bound == 0 and isinstance(bound, int) else
                    f"{'an integer' if isinstance(bound, int) else 'a number'} {_LOWER[kind]} {bound:g}")
        expected += str(words.get("note", "")) + (" or null" if nullable else "")
    elif kind in _UPPER:
        bound = ctx["lt" if kind == "less_than" else "le"]
        expected = f"{_UPPER[kind]} {amount(bound)}{words.get('unit', '')}"
    else:  # a constraint without words of its own (a string's length or pattern): pydantic's
        expected = first["msg"][0].lower() + first["msg"][1:]
    return f"{_name(loc)}: expected {expected}, got {short(first['input'])}"


def amount(limit: int | float) -> str:
    """A bound as errors write it: 1,000,000 (an integral one, 1e6 included), else 0.5 or 1e-06."""
    return f"{int(limit):,}" if float(limit).is_integer() else f"{limit:g}"


def _key(key: Any) -> str:
    """A key of the input as an error names it: itself, or quoted short when long or not a string."""
    return key if isinstance(key, str) and len(key) <= 100 else short(key)


def _name(loc: tuple[Any, ...], rest: str = "") -> str:
    """The dotted name of `loc` (`reward.components[1].weight`), then `rest` (a field's name in it)."""
    name = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".")
    return f"{name}.{rest}" if name and rest else name or rest


def _field(cls: type, loc: tuple[Any, ...]) -> tuple[type, Any]:
    """The section holding the field `loc` names, and that field's pydantic FieldInfo (None when
    `loc` leaves the sections: a list item, a tuple position, an unknown key)."""
    owner, info, tp = cls, None, cls
    for key in loc:
        if isinstance(key, int):  # an item of a list field: its element type
            tp = next(iter(typing.get_args(tp)), None)
            continue
        if not is_pydantic_dataclass(tp):
            return owner, info
        owner, info = tp, tp.__pydantic_fields__.get(key)
        if info is None:
            return owner, None
        tp = info.annotation
    return owner, info
