"""Per-worker error files in torchrun's format, with unirank's sub-second time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unirank.errorfile import ERROR_FILE_VAR, exit_status, read_failure, record_exception


def test_records_the_first_exception_only(tmp_path: Path) -> None:
    path = tmp_path / "0" / "error.json"
    environ = {ERROR_FILE_VAR: str(path)}
    try:
        raise ValueError("first")
    except ValueError as exc:
        record_exception(exc, environ)
    record_exception(RuntimeError("later, while unwinding"), environ)
    data = json.loads(path.read_text())
    assert data["message"]["message"] == "ValueError: first"
    assert "raise ValueError" in data["message"]["extraInfo"]["py_callstack"]
    record = read_failure(path)
    assert record is not None
    assert int(record.time) == int(data["message"]["extraInfo"]["timestamp"])


def test_clean_exit_and_missing_variable_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    record_exception(SystemExit(0), {ERROR_FILE_VAR: str(path)})
    record_exception(SystemExit(None), {ERROR_FILE_VAR: str(path)})
    assert not path.exists()
    record_exception(SystemExit(2), {ERROR_FILE_VAR: str(path)})
    assert path.exists()
    record_exception(RuntimeError("x"), {})  # no variable: nothing to do, no error


def test_the_failure_time_of_torchelastic_files(tmp_path: Path) -> None:
    """A file written by torch.distributed.elastic's @record has only a whole-second time: the
    file's own (sub-second) modification time orders failures instead."""
    import os

    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "ValueError: x", "extraInfo": {
        "py_callstack": "", "timestamp": "1700000000"}}}))
    os.utime(path, (1700000000.25, 1700000000.25))
    record = read_failure(path)
    assert record is not None
    assert (record.message, record.exit_code, record.time) == ("ValueError: x", 1, 1700000000.25)
    assert read_failure(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert read_failure(tmp_path / "bad.json") is None


def test_a_requeue_exit_is_not_recorded(tmp_path: Path) -> None:
    """SystemExit(79) stopped the rank to be requeued: not a failure, no record."""
    path = tmp_path / "error.json"
    record_exception(SystemExit(79), {ERROR_FILE_VAR: str(path)})
    assert not path.exists()


def test_a_record_of_a_lost_peer_is_told_apart(tmp_path: Path) -> None:
    """gloo's words for a peer that went away mark the record as a consequence."""
    own, lost = tmp_path / "own.json", tmp_path / "lost.json"
    record_exception(SystemExit(3), {ERROR_FILE_VAR: str(own)})
    record_exception(RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:6062"), {ERROR_FILE_VAR: str(lost)})
    own_record, lost_record = read_failure(own), read_failure(lost)
    assert own_record is not None and lost_record is not None
    assert (own_record.exit_code, own_record.lost_peer) == (3, False)
    assert (lost_record.exit_code, lost_record.lost_peer) == (1, True)


#: SystemExit codes whose exit status CPython computes in its own way
SYSTEM_EXIT_CODES = ("256", "-1", "'text'", "None", "True", "2 ** 70", "335")


def _cpython_status(code: str) -> int:
    """The exit status of ``python -c 'raise SystemExit(CODE)'``."""
    return subprocess.run([sys.executable, "-c", f"raise SystemExit({code})"],
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL).returncode


@pytest.mark.parametrize("code", SYSTEM_EXIT_CODES)
def test_exit_status_is_cpython_s(code: str) -> None:
    assert exit_status(eval(code)) == _cpython_status(code)


@pytest.mark.parametrize("code", SYSTEM_EXIT_CODES)
def test_the_record_says_the_exit_status_cpython_gives(code: str, tmp_path: Path) -> None:
    """No record for a clean exit (status 0, or 79 to be requeued: 335 & 0xFF); else the
    status the process ends with, not the code as raised."""
    path = tmp_path / "error.json"
    record_exception(SystemExit(eval(code)), {ERROR_FILE_VAR: str(path)})
    status = _cpython_status(code)
    if status in (0, 79):
        assert not path.exists()
        return
    record = read_failure(path)
    assert record is not None and record.exit_code == status, record


def test_a_record_may_name_the_exit_code_the_process_ends_with(tmp_path: Path) -> None:
    """The hang detector ends its process with os._exit(86) after recording a RuntimeError:
    the record says 86, so a rank stopped while exiting is shown with it."""
    path = tmp_path / "error.json"
    record_exception(RuntimeError("hung"), {ERROR_FILE_VAR: str(path)}, exit_code=86)
    failure = read_failure(path)
    assert failure is not None
    assert (failure.exit_code, failure.message) == (86, "RuntimeError: hung")


def test_an_exceptions_notes_end_its_message(tmp_path: Path) -> None:
    """The hang watcher's note (torch's collective timeout) is the record's last line: the
    failure summary's ``error:`` line."""
    from unirank.hang.failure import add_hang_note

    path = tmp_path / "error.json"
    exc = RuntimeError("Timed out waiting 4000ms for recv operation to complete")
    add_hang_note(exc, "ranks 0, 2 wait in all_reduce #2; rank 1 has not entered it")
    add_hang_note(exc, None)  # no hang: nothing added
    record_exception(exc, {ERROR_FILE_VAR: str(path)})
    failure = read_failure(path)
    assert failure is not None
    assert failure.message == ("unirank: the ranks hung: ranks 0, 2 wait in all_reduce #2; "
                               "rank 1 has not entered it")
    message = json.loads(path.read_text())["message"]["message"]
    assert message.startswith("RuntimeError: Timed out waiting 4000ms"), message
