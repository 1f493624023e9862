"""cloud.codec: round trips bit for bit, and nothing but data and allowed types ever decodes."""

import enum
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from safetensors.torch import save as save_safetensors

from planted_pickle import Payload, pickled
from cloud.codec import FORMAT, DecodeError, decode, encode


def raw(tree: str) -> bytes:
    """An object with this JSON tree, written by hand as a forger would."""
    return save_safetensors({}, metadata={"format": FORMAT, "tree": tree})


class Colour(enum.IntEnum):
    RED = 0
    BLUE = 1


@dataclass(frozen=True)
class Point:
    x: int
    label: str
    data: torch.Tensor | None = None

    def __post_init__(self):
        if self.x < 0:
            raise ValueError("x must be >= 0")


def test_round_trip_of_every_supported_shape():
    t = torch.randn(3, 4)
    value = {
        "none": None, "flag": True, "n": -7, "big": 2**62, "f": 0.1, "nan": float("nan"), "inf": -float("inf"),
        "s": "héllo", "list": [1, [2, 3]], "tuple": (1, ("a", None)), "ints": {0: "zero", 5: (1, 2)},
        "dollar": {"$t": "not a tensor ref"}, "path": Path("/tmp/x"), "bytes": b"\x00\xff",
        "enum": Colour.BLUE, "point": Point(3, "p", t[:, 1]), "t": t, "view": t[1:],
        "bf16": torch.ones(2, dtype=torch.bfloat16), "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 5), "scalar": torch.tensor(3.5, dtype=torch.float64),
    }
    back = decode(encode(value, [Colour, Point]), [Colour, Point])
    assert back.keys() == value.keys()
    for key in value:
        a, b = value[key], back[key]
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        elif isinstance(a, Point):
            assert (a.x, a.label) == (b.x, b.label) and torch.equal(a.data, b.data)
        elif isinstance(a, float) and a != a:
            assert b != b
        else:
            assert a == b and type(a) is type(b), key
    assert back["enum"] is Colour.BLUE


def test_optimizer_state_round_trips():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    state = decode(encode(opt.state_dict()))
    fresh = torch.optim.Adam(model.parameters(), lr=1e-3)
    fresh.load_state_dict(state)
    for a, b in zip(opt.state_dict()["state"].values(), fresh.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_pickle_never_decodes_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blob = pickled({"optimizer": Payload(tmp_path / "PWNED")})
    with pytest.raises(DecodeError):
        decode(blob)
    assert not (tmp_path / "PWNED").exists()


def test_classes_must_be_allowed_both_ways():
    with pytest.raises(TypeError, match="not among the allowed types"):
        encode(Point(1, "a"))
    data = encode(Point(1, "a"), [Point])
    with pytest.raises(DecodeError, match="not among the allowed types"):
        decode(data)
    # A forged tree naming a class nobody allowed (here: os.system) is refused unbuilt.
    with pytest.raises(DecodeError, match="not among the allowed types"):
        decode(raw('{"$dc":"posix.system","f":{"command":"touch PWNED"}}'), [Point])


def test_constructor_checks_run_on_decode():
    name = f"{Point.__module__}.{Point.__qualname__}"
    assert decode(raw('{"$dc":"%s","f":{"x":1,"label":"a","data":null}}' % name), [Point]) == Point(1, "a")
    with pytest.raises(DecodeError, match="x must be >= 0"):
        decode(raw('{"$dc":"%s","f":{"x":-1,"label":"a","data":null}}' % name), [Point])
    with pytest.raises(DecodeError, match="do not match"):
        decode(raw('{"$dc":"%s","f":{"x":1,"label":"a","data":null,"extra":1}}' % name), [Point])
    with pytest.raises(DecodeError):
        decode(raw('{"$t":"7"}'))  # a tensor that is not there


@pytest.mark.parametrize("cut", [0, 4, 8, 20, -10, -1])
def test_truncated_bytes_are_refused(cut):
    data = encode({"t": torch.randn(16), "n": 1})
    with pytest.raises(DecodeError):
        decode(data[:cut])


def test_garbage_and_hostile_trees_are_refused():
    for junk in (b"", b"\x00" * 64, b"{}" * 10, os.urandom(256)):
        with pytest.raises(DecodeError):
            decode(junk)
    for deep in ("[" * 5000 + "0" + "]" * 5000, '{"a":' * 300 + "0" + "}" * 300):
        with pytest.raises(DecodeError, match="deep|unreadable"):
            decode(raw(deep))


def test_files_round_trip_and_truncated_files_are_refused(tmp_path):
    from cloud.codec import read_file, write_file

    value = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(5)}}, "groups": [{"betas": (0.9, 0.99)}]}
    write_file(value, tmp_path / "o.safetensors")
    back = read_file(tmp_path / "o.safetensors")
    assert back["groups"] == value["groups"] and torch.equal(back["state"][0]["exp_avg"], value["state"][0]["exp_avg"])
    data = (tmp_path / "o.safetensors").read_bytes()
    for cut in (0, 7, len(data) // 2, len(data) - 1):
        (tmp_path / "t.safetensors").write_bytes(data[:cut])
        with pytest.raises(DecodeError):
            read_file(tmp_path / "t.safetensors")
