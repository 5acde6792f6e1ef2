"""vitlab.base.records: the one JSONL reader and appender, its torn-line policy, and the newest code version's records."""

from __future__ import annotations

import json
import warnings

import pytest

from vitlab.base.records import (
    RecordFileError,
    TornLineWarning,
    append_record,
    code_version,
    of_newest_code,
    read_records,
)


def test_a_torn_last_line_is_left_out_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": 3, "b\xff')  # killed during the third append (garbage bytes)
    with pytest.warns(TornLineWarning) as caught:
        assert read_records(path, torn_fix="rerun it") == [{"a": 1}, {"a": 2}]
    w = caught[0].message
    assert (w.path, w.line, w.fix) == (str(path), 4, "rerun it")


def test_a_corrupt_line_in_the_middle_is_an_error_naming_its_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a"\n\n{"a": 4}\n')
    with pytest.raises(RecordFileError) as e:
        read_records(path)
    assert (e.value.path, e.value.line, isinstance(e.value, ValueError)) == (str(path), 3, True)


def test_a_line_that_is_json_but_no_record_is_an_error_even_last(tmp_path):
    """A torn record starts with "{" and never parses as a number: a last line that does is no tear."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(RecordFileError) as e:
        read_records(path, what="a results store")
    assert e.value.line == 2 and "results store" in e.value.fix


def test_an_empty_file_holds_no_records_and_a_missing_one_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n \n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_records(tmp_path / "empty.jsonl") == [] == read_records(tmp_path / "blank.jsonl")
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "none.jsonl")


def test_append_drops_a_torn_tail_first_so_no_tear_stays_in_the_middle(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    append_record(path, {"a": 1})  # the folder is made
    with open(path, "ab") as f:
        f.write(b'{"a": 2, "tor')
    with pytest.warns(TornLineWarning):
        append_record(path, {"a": 3})
    assert path.read_text() == '{"a": 1}\n{"a": 3}\n'
    with open(path, "a") as f:
        f.write('{"a": 4}')  # a whole record without its newline (written by hand): kept, closed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        append_record(path, {"b": 5, "a": 5}, sort_keys=True)
        assert read_records(path) == [{"a": 1}, {"a": 3}, {"a": 4}, {"a": 5, "b": 5}]
    assert path.read_text().splitlines()[-1] == json.dumps({"a": 5, "b": 5})


def test_of_newest_code_keeps_the_last_records_code_version_in_order():
    old = [{"row": i, "provenance": {"code_hash": "old"}} for i in range(3)]
    new = [{"row": i, "provenance": {"code_hash": "new"}} for i in range(2)]
    bare = {"row": 9}
    assert of_newest_code([old[0], new[0], old[1], new[1]]) == ([new[0], new[1]], "new")
    assert of_newest_code([new[0], *old]) == (old, "old")
    assert of_newest_code([]) == ([], None)
    assert of_newest_code([old[0], bare]) == ([bare], "None") and code_version(bare) == "None"
