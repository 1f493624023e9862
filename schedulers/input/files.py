"""Input files: reading a file a user hands us (a config, a trace, a step-time override) so that a
bad one costs one error line, never a traceback, unbounded memory or unbounded time.

Invariants (tests/spotlight/test_bad_input.py feeds every command files that break each one):
- only a regular file is opened: a FIFO, a device or a socket is refused by its `stat` before
  `open` (opening a FIFO waits for a writer forever; /dev/zero would be read to `max_bytes`), and
  the opened file is checked again, so one swapped in meanwhile is refused too (`open_regular`);
- at most `max_bytes` are ever read, whatever the file claims to be (both by the one bounded reader,
  `schedulers.input.bounded_read`, which the JSON Spotlight reads back goes through too);
- text is strict UTF-8 without NUL bytes; anything else is "not a text file";
- YAML is read by `_Loader`: PyYAML's safe loader, refusing anchors and aliases (a 332-byte alias
  bomb expands to gigabytes), nesting deeper than `MAX_DEPTH` (100k `[` would overflow the
  recursive composer), duplicate mapping keys (YAML says they are an error; PyYAML keeps the last),
  and integers longer than `MAX_INT_DIGITS` digits;
- JSON is read with the same duplicate-key and depth rules (the depth by `bounded_read.depth_over`),
  and without NaN or Infinity;
- every message is one line starting with the file name, and values are quoted by `short`, at most
  `QUOTE_CHARS` characters; `error_line` makes the line a command prints of it, with every control
  character of a key or file name quoted in it escaped (a newline there must not forge a second
  error line, an escape sequence must not reach the terminal).

An `InputFileError` carries that line; callers re-raise it as their own error type (ConfigError,
TraceError) so that the CLI reports it like any other bad input.
"""

from __future__ import annotations

import json
import reprlib
import unicodedata
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from schedulers.input import bounded_read
from schedulers.input.bounded_read import MAX_DEPTH, NotRegular, TooLarge, depth_over, read_bounded, size_text

MAX_INT_DIGITS = 100
"""Longest integer literal read from YAML: every integer setting is far below 10**100, and Python
refuses to parse more than 4,300 digits anyway (with a ValueError, not a YAML error)."""
QUOTE_CHARS = 200
"""Most characters of a value quoted in an error line (issue 13: a 312 MB error line)."""
LINE_CHARS = 300
"""Most characters of an error line, its `spotlight: error: ` prefix included (`error_line`)."""

_REPR = reprlib.Repr()
_REPR.maxstring = QUOTE_CHARS
_REPR.maxother = QUOTE_CHARS
_REPR.maxlong = 60
_REPR.maxlevel = 3


SEED_MAX = 2**32 - 1
"""Largest run seed: numpy's legacy seeding takes < 2**32, `seeding.derive_seed` packs keys as
signed 64-bit integers and torch's `manual_seed` takes < 2**64, so [0, 2**32) suits every RNG."""


class InputError(ValueError):
    """Bad input from a user — a config, a trace, a price table, a flag, a URI: `str(err)` is the one
    line they see. Every package's input errors derive from it (the run config's `ConfigError`,
    `TraceError`, `PriceError`, ...), so the command line reports all of them alike."""


class ConfigError(InputError):
    """A bad config value (a field of a run config, a simulator or step-time setting, a flag); the
    run config's `spotlight.config.ConfigError` is this class."""


class InputFileError(InputError):
    """A file that cannot be read as the input it should be; `str(err)` is one line naming it."""


def short(value: Any, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` cut to at most `limit` characters, for error lines. Never raises: a huge
    integer, which `repr` refuses beyond 4,300 digits, is described by its size."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # int too large to convert to a string
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable>"
    text = " ".join(text.split())  # one line, whatever the value holds
    return text if len(text) <= limit else text[:limit - 3] + "..."


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
"""Unicode categories `error_line` escapes: C0, DEL and C1 controls (Cc), format characters such as
the bidi overrides U+202A..E and U+2066..9 and the zero-width ones (Cf), the line and paragraph
separators U+2028/9 (Zl, Zp: `str.splitlines` splits at them), surrogates, private-use and
unassigned code points."""


TAIL_CHARS = 60
"""How much of a long line's end `error_line` keeps (the value a message quotes comes last)."""
_CUT = " ... "


def printable(text: str) -> str:
    """`text` with every character of the `_ESCAPED` categories as a visible escape (`\\n`, `\\x1b`,
    `\\u2028`): what a terminal shows of text read from input or a store, never a second line or
    an escape sequence."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif unicodedata.category(ch) in _ESCAPED:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def error_line(message: str, prefix: str = "spotlight: error: ", limit: int = LINE_CHARS) -> str:
    """`prefix + message` as one printable line of at most `limit` characters: every character of
    the `_ESCAPED` categories becomes a visible escape (`\\n`, `\\x1b`, `\\u2028`), so that a newline
    or an escape sequence in a key, a value or a file name quoted from input shows as text rather
    than forging a second line or reaching the terminal. `spotlight.cli` prints every error line
    through it; text that `short` quoted already (repr escapes these too) comes out unchanged."""
    line = prefix + printable(message)
    if len(line) <= limit:
        return line
    # Cut from the middle: the start says where (the file, the field), the end what was given.
    tail = min(TAIL_CHARS, limit // 4)
    return line[:limit - tail - len(_CUT)] + _CUT + line[-tail:]


def _not_regular(err: NotRegular, what: str) -> InputFileError:
    """The line of a path that is not a regular file: "is a folder" or "KIND, not a regular file"."""
    if err.kind == "a folder":
        return InputFileError(f"{err.path}: is a folder (expected a {what} file)")
    if err.kind == "not a regular file":
        return InputFileError(f"{err.path}: not a regular file (expected a {what} file)")
    return InputFileError(f"{err.path}: {err.kind}, not a regular file (expected a {what} file)")


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file (a symlink to one is): a
    folder, a FIFO, a device or a socket is an InputFileError line, at once — `open` of a FIFO
    would wait for a writer forever. The mode is checked by `stat` before `open` and again on the
    opened file (opened non-blocking, so a FIFO swapped in between opens at once and is refused
    too). The OSError of a file that cannot be opened (missing, no permission) is the caller's
    to word. Every file a user hands a command (a config, a trace, a price table, a step-time
    or prompt file) is opened here."""
    try:
        return bounded_read.open_regular(_file_name(path))
    except NotRegular as err:
        raise _not_regular(err, what) from None


def _file_name(path: str | Path) -> Path:
    """`path`, unless it holds a NUL byte (a config value can hold one): no file has that name, and
    `os.stat` would raise a ValueError of its own."""
    if "\0" in str(path):
        raise InputFileError(f"{short(str(path))}: not a file name (it holds a NUL byte)")
    return Path(path)


def read_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The file's bytes (`bounded_read.read_bounded`), or InputFileError: a folder or anything but a
    regular file, larger than `max_bytes`. The OSError of a file that cannot be opened (missing, no
    permission) is the caller's to word."""
    path = _file_name(path)
    try:
        return read_bounded(path, max_bytes)
    except NotRegular as err:
        raise _not_regular(err, what) from None
    except TooLarge:
        raise InputFileError(f"{path}: larger than {size_text(max_bytes)} (expected a {what} file of at most "
                             "that size)") from None


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The file's text, or InputFileError: missing, a folder or anything but a regular file
    (`open_regular`), larger than `max_bytes`, not UTF-8 text. `what` names the input in messages
    ("config", "trace", ...)."""
    path = Path(path)
    try:
        data = read_bytes(path, what, max_bytes)
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such {what} file") from None
    except OSError as err:
        raise InputFileError(f"{path}: cannot read {what} ({err.strerror or type(err).__name__})") from None
    if b"\0" in data:
        raise InputFileError(f"{path}: a binary file, not text (expected a {what} file)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(f"{path}: not a UTF-8 text file (byte {err.start}; expected a {what} file)") from None


def check(ok: bool, name: str, expected: str, got: Any) -> None:
    """`name: expected EXPECTED, got VALUE` (quoted short) unless `ok`: a config value's one-line error."""
    if not ok:
        raise ConfigError(f"{name}: expected {expected}, got {short(got)}")


# ---- YAML ---------------------------------------------------------------------------------------


class _Refused(yaml.MarkedYAMLError):
    """Something `_Loader` refuses, with the line it is on."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases, deep nesting, duplicate keys or huge integers.

    The pure-Python SafeLoader, not the libyaml one: the refusals hook into `compose_node`, which
    runs node by node as the scanner reads, so a refused document stops at its first offence."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(None, None, "YAML anchors and aliases are not accepted (write each value out)",
                           event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<`: the base class merges these
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base class says so with its line
                    break
                if duplicate:
                    raise _Refused(None, None, f"duplicate key {short(key)} (each key may appear once)",
                                   key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int":
            digits = sum(c.isalnum() for c in node.value)  # hex, octal and binary digits too
            if digits > MAX_INT_DIGITS:
                raise _Refused(None, None, f"an integer of {digits} digits (expected at most {MAX_INT_DIGITS})",
                               node.start_mark)
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as err:  # e.g. a date 2024-13-45: datetime's ValueError
            raise _Refused(None, None, f"cannot read this value ({short(str(err))})", node.start_mark) from None


def load_yaml(path: str | Path, what: str, max_bytes: int) -> Any:
    """The YAML document in `path` (module docstring for what is refused); an empty document is
    refused too, since a file left empty by mistake would otherwise mean "all defaults"."""
    return parse_yaml(read_text(path, what, max_bytes), str(path), what)


def parse_yaml(text: str, source: str, what: str) -> Any:
    """YAML text that did not come from a file (a message), read as `load_yaml` reads a file's;
    errors start with `source`."""
    path = source
    try:
        loader = _Loader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise InputFileError(f"{path}: {_yaml_problem(err)}") from None
    except RecursionError:  # not expected past MAX_DEPTH; kept so that no input can give a traceback
        raise InputFileError(f"{path}: nested too deeply (expected at most {MAX_DEPTH} levels)") from None
    if data is None:
        raise InputFileError(f"{path}: empty {what} file (expected a mapping of fields)")
    return data


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if isinstance(err, _Refused):
        return f"{where}{problem}"
    return f"{where}not valid YAML ({' '.join(str(problem).split())[:QUOTE_CHARS]})"


# ---- JSON ---------------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputFileError(f"duplicate key {short(key)} (each key may appear once)")
        out[key] = value
    return out


def parse_json(text: str, path: str | Path) -> Any:
    """The JSON document `text` read from `path`: duplicate keys and nesting deeper than
    `MAX_DEPTH` refused, NaN and Infinity (not JSON) refused; errors name the file (and the line for
    syntax errors)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_not_json)
    except json.JSONDecodeError as err:
        raise InputFileError(f"{path}:{err.lineno}: not JSON: {err.msg}") from None
    except InputFileError as err:
        raise InputFileError(f"{path}: {err}") from None
    except RecursionError:  # json's C scanner raises it past ~1,000 levels, before using much memory
        raise InputFileError(f"{path}: nested too deeply (expected at most {MAX_DEPTH} levels)") from None
    except ValueError as err:  # an integer literal over Python's 4,300-digit limit
        raise InputFileError(f"{path}: not JSON: {short(str(err))}") from None
    if depth_over(text, MAX_DEPTH):
        raise InputFileError(f"{path}: nested too deeply (expected at most {MAX_DEPTH} levels)")
    return data


def _not_json(name: str) -> Any:
    raise InputFileError(f"{name} is not a JSON number (expected finite numbers)")
