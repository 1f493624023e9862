"""The one bounded reader (`schedulers.input.bounded_read`): its refusals — not a regular file, over the
size limit, nested too deeply — are the same rule whether a user's input file
(`schedulers.input.files`) or JSON read back from a run folder (`cloud.bounded_json`) meets them;
each caller only words them."""

import os

import pytest

from cloud.bounded_json import JsonRefused, load_file
from schedulers.input import bounded_read
from schedulers.input.bounded_read import NotRegular, TooLarge, depth_over, read_bounded, size_text
from schedulers.input.files import InputFileError, parse_json, read_text


def test_a_file_over_the_limit_is_refused_by_every_reader(tmp_path):
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * 98 + '"')  # 100 bytes
    assert read_bounded(big, 100) == big.read_bytes()
    with pytest.raises(TooLarge, match=r"big\.json: larger than 99 bytes$"):
        read_bounded(big, 99)
    with pytest.raises(InputFileError, match=r"big\.json: larger than 99 bytes \(expected a trace file of at most"):
        read_text(big, "trace", 99)
    with pytest.raises(JsonRefused, match=r"^big\.json: larger than 99 bytes$"):
        load_file(big, max_bytes=99)
    assert size_text(1 << 20) == "1 MiB" and size_text(8 << 20) == "8 MiB" and size_text(4096) == "4096 bytes"


def test_a_file_that_grows_past_its_stat_is_still_bounded(tmp_path, monkeypatch):
    """At most max_bytes + 1 bytes are read whatever the size said: a file that grew is refused."""
    f = tmp_path / "grows.json"
    f.write_bytes(b"[" * 10)
    real = os.fstat

    def small(fd):
        st = real(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 0,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(bounded_read.os, "fstat", small)
    with pytest.raises(TooLarge):
        read_bounded(f, 5)


def test_what_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((tmp_path, "a folder"), (fifo, "a FIFO (named pipe)"), ("/dev/zero", "a character device")):
        with pytest.raises(NotRegular) as err:
            read_bounded(path, 10)
        assert err.value.kind == kind
        with pytest.raises(JsonRefused, match="not a regular file$"):
            load_file(path, max_bytes=10)
        with pytest.raises(InputFileError, match="(is a folder|, not a regular file) \\(expected a trace file\\)$"):
            read_text(path, "trace", 10)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "nope", 10)


def test_one_depth_rule_for_input_files_and_data_read_back(tmp_path):
    ok, deep = "[" * 64 + "]" * 64, "[" * 65 + "]" * 65
    assert not depth_over(ok, 64) and depth_over(deep, 64)
    assert not depth_over('["' + "[" * 100 + '"]', 64)  # brackets inside a string are text
    assert parse_json(ok, "t.json") is not None
    with pytest.raises(InputFileError, match=r"^t\.json: nested too deeply \(expected at most 64 levels\)$"):
        parse_json(deep, "t.json")
    (tmp_path / "s.json").write_text(deep)
    with pytest.raises(JsonRefused, match=r"^s\.json: nested deeper than 64 levels$"):
        load_file(tmp_path / "s.json", max_bytes=1 << 20)
