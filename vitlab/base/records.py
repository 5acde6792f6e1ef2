"""JSONL records, one JSON object a line: the one reader (``read_records``) and appender (``append_record``) of every
record file vitlab keeps (a run's ``metrics.jsonl``, a sweep's, a tuning's and an MPP study's results store), and
the one selection of the records the newest code wrote (``of_newest_code``).

The torn-line policy, the same for every file: records are only ever appended, so a kill during an append can tear
the last line alone. A torn LAST line is left out with a ``TornLineWarning`` (the record it would have held is
written again: a resumed run restores it from its checkpoint, a rerun sweep or study reruns that row). Any other
line that is not one JSON object (a corrupt line in the middle, or a file that is no record file) is a
``RecordFileError`` naming the file and the line. Blank lines are skipped; an empty file holds no records. The
appender drops a torn last line before it writes, so a tear never ends up in the middle of a file. Torch-free.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["RecordFileError", "TornLineWarning", "read_records", "append_record", "code_version", "of_newest_code"]


class RecordFileError(ValueError):
    """A line of a JSONL record file that is not one JSON object and not a torn last line. Fields: ``path`` (the
    file), ``line`` (its 1-based number), ``problem`` (what the line holds instead), ``fix`` (what to do) and
    ``param`` (the parameter that named the file, e.g. "results"; None where the file is found, not given)."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str, fix: str, param: str | None = None) -> None:
        self.path, self.line, self.problem, self.fix, self.param = str(path), line, problem, fix, param
        super().__init__(f"{path}, line {line}: {problem}; {fix}")


class TornLineWarning(UserWarning):
    """The last line of a JSONL record file is not a whole record (a kill during its append) and was left out.
    Fields: ``path`` (the file), ``line`` (its 1-based number) and ``fix`` (how its record comes back)."""

    def __init__(self, path: str | os.PathLike, line: int, text: bytes, fix: str) -> None:
        self.path, self.line, self.fix = str(path), line, fix
        shown = text[:60].decode("utf-8", "replace")
        super().__init__(f"{path}, line {line}: the last line is not a whole record (a kill during its append?), "
                         f"left out: {shown!r}" + (f". {fix}" if fix else ""))


def _record(raw: bytes) -> object:
    """The JSON value of one line; ``ValueError`` (a ``UnicodeDecodeError`` or ``JSONDecodeError``) when it is none."""
    return json.loads(raw.decode("utf-8"))


def read_records(path: str | os.PathLike, torn_fix: str = "", what: str = "a JSONL record file",
                 param: str | None = None) -> list[dict]:
    """The records of the JSONL file ``path``, in file order, under the module's torn-line policy: blank lines
    skipped, a torn last line left out with a ``TornLineWarning`` (whose text ends with ``torn_fix``: how its record
    comes back), any other line that is not a JSON object a ``RecordFileError`` (``what`` names the kind of file in
    its fix, ``param`` the parameter that gave the file). Raises ``FileNotFoundError`` for a missing file: a caller
    that allows one checks first."""
    path = Path(path)
    lines = [(i, raw) for i, raw in enumerate(path.read_bytes().split(b"\n"), 1) if raw.strip()]
    records = []
    for k, (i, raw) in enumerate(lines):
        try:
            record = _record(raw)
        except ValueError as e:
            if k == len(lines) - 1:  # an interrupted append; the record is written again
                warnings.warn(TornLineWarning(path, i, raw, torn_fix), stacklevel=2)
                break
            raise RecordFileError(path, i, f"not a JSON record ({e}): {raw[:60].decode('utf-8', 'replace')!r}",
                                  _foreign(path, what, param) if k == 0 else "remove or repair that line (records "
                                  "are only appended, so a kill tears the last line alone)", param) from None
        if not isinstance(record, dict):  # a torn record starts with "{", so never parses as a number or a list
            raise RecordFileError(path, i, f"it holds a {type(record).__name__}, not a record",
                                  _foreign(path, what, param), param)
        records.append(record)
    return records


def _foreign(path: Path, what: str, param: str | None) -> str:
    """The fix for a file whose first record is none: it is no record file at all."""
    give = f"pass {param}=" if param else "give"
    return f"{path} is not {what}: {give} a .jsonl file that vitlab wrote, or a new file's name"


def append_record(path: str | os.PathLike, record: dict, sort_keys: bool = False) -> None:
    """Append ``record`` to the JSONL file ``path`` as one line (made with its folder where missing), under an
    exclusive ``flock`` so that appenders in several processes never interleave, flushed and fsynced. A torn last
    line (a kill during an earlier append) is dropped first, with a ``TornLineWarning``, so that it never stands in
    the middle of the file, where ``read_records`` would refuse it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=sort_keys) + "\n").encode()
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            _drop_torn_tail(f, path)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _drop_torn_tail(f, path: Path) -> None:
    """Truncate the open file ``f`` after its last newline when what follows it is no whole record (a torn append);
    a last line that is a whole record but lacks its newline (written by hand) gets one."""
    f.seek(0)
    data = f.read()
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    if not tail.strip():
        if tail:
            f.truncate(end)
        return
    try:
        _record(tail)
    except ValueError:
        warnings.warn(TornLineWarning(path, data.count(b"\n") + 1, tail, "It is dropped before this append"), stacklevel=3)
        f.truncate(end)
    else:
        f.write(b"\n")


def code_version(record: Mapping) -> str:
    """The code version that wrote ``record``: its ``provenance.code_hash`` (``vitlab.base.provenance.code_hash``), as a
    string ("None" for a record without one)."""
    return str((record.get("provenance") or {}).get("code_hash"))


def of_newest_code(records: Sequence[dict]) -> tuple[list[dict], str | None]:
    """The records written by the newest code version, in their order, and that version (``code_version``): the
    version of the last record, as records are only appended. ``([], None)`` for no records. A partial rerun after a
    code change thus never mixes an old row with a new one."""
    if not records:
        return [], None
    newest = code_version(records[-1])
    return [r for r in records if code_version(r) == newest], newest
