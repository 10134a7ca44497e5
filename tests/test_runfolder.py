"""Every path of a run and an attempt from one place (:mod:`unirank.runfolder`): a new run
never deletes an earlier run's logs, and a worker is told its attempt folder rather than
taking it apart from TORCHELASTIC_ERROR_FILE (issue 33: under plain python with that variable
set, the hang report went to ``/hang``)."""

from __future__ import annotations

import os
from pathlib import Path

from _procs import Runner
from unirank.contract import HangSettings
from unirank.hang.watcher import Watcher
from unirank.runfolder import (
    AttemptFolder,
    RunFolder,
    attempt_folder_of,
    make_run_folder,
    read_evicted,
    read_spare_nodes,
    read_spares,
    write_evicted,
    write_spares,
)
from unirank.supervisor.rdzv.client import aside_of, spares_told
from unirank.supervisor.rdzv.spec import to_line


def _watcher(environ: dict[str, str]) -> Watcher:
    return Watcher(rank=0, world_size=1, node="n", settings=HangSettings(60.0, None, 5.0),
                   connect=lambda: None, environ=environ)


def test_plain_python_with_an_error_file_gets_no_attempt_folder() -> None:
    environ = {"TORCHELASTIC_ERROR_FILE": "/tmp/mine/error.json"}
    assert attempt_folder_of(environ) == ""
    assert _watcher(environ).attempt_folder() == ""  # was "/": reports in /hang


def test_a_told_worker_uses_what_it_was_told_and_torchrun_s_layout_is_read() -> None:
    told = {"UNIRANK_ATTEMPT_DIR": "/logs/r_x/attempt_2",
            "TORCHELASTIC_ERROR_FILE": "/elsewhere/error.json"}
    assert _watcher(told).attempt_folder() == "/logs/r_x/attempt_2"
    torchrun = {"TORCHELASTIC_ERROR_FILE": "/logs/none_ab12/attempt_1/3/error.json"}
    assert attempt_folder_of(torchrun) == "/logs/none_ab12/attempt_1"
    assert attempt_folder_of({}) == ""


def test_an_attempt_s_paths() -> None:
    attempt = RunFolder("/logs/job_x").attempt(1)
    assert attempt == AttemptFolder("/logs/job_x/attempt_1")
    assert attempt.error_file(3) == "/logs/job_x/attempt_1/3/error.json"
    assert attempt.fault_file(0) == "/logs/job_x/attempt_1/0/fault.txt"
    assert (attempt.log_file(2, 1), attempt.log_file(2, 2)) == (
        "/logs/job_x/attempt_1/2/stdout.log", "/logs/job_x/attempt_1/2/stderr.log")
    assert attempt.filtered_file(2) == "/logs/job_x/attempt_1/filtered_stderr.log"
    assert attempt.timeline_file == "/logs/job_x/attempt_1/timeline.json"
    assert attempt.waiting_mark == "/logs/job_x/attempt_1/ranks-waiting"
    assert attempt.hang_folder == "/logs/job_x/attempt_1/hang"


def test_the_same_run_id_twice_gives_two_folders(tmp_path: Path) -> None:
    first = make_run_folder(str(tmp_path / "logs"), "none")
    second = make_run_folder(str(tmp_path / "logs"), "none")
    assert first != second
    assert os.path.basename(first.path).startswith("none_")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(
        [os.path.basename(first.path), os.path.basename(second.path)])


TALK = 'import os\nprint("run", os.environ["RUN_TAG"], flush=True)\n'


def test_a_rerun_with_the_same_log_dir_and_run_id_keeps_the_earlier_run_s_logs(
        runner: Runner, tmp_path: Path) -> None:
    """Before, the second run's ``attempt_0`` replaced the first's (``shutil.rmtree``)."""
    runner.script("talk.py", TALK)
    logs = tmp_path / "logs"
    for tag in ("first", "second"):
        result = runner.run(["-n", "1", "--rdzv-id", "same", "--log-dir", str(logs),
                             "--redirects", "3", "talk.py"], env={"RUN_TAG": tag})
        assert result.returncode == 0, result.stderr
        assert f"unirank run: log files in {logs}/same_" in result.stderr, result.stderr
    found = sorted(p.read_text() for p in logs.glob("same_*/attempt_0/0/stdout.log"))
    assert found == ["run first\n", "run second\n"]


def test_every_attempt_file_is_named_in_runfolder_only() -> None:
    """The hang detector's files are AttemptFolder's paths; their names are spelt nowhere else
    in src/, and runfolder needs nothing of the hang package for them."""
    import ast
    from pathlib import Path

    from unirank.runfolder import AttemptFolder

    folder = AttemptFolder("/r/attempt_0")
    assert folder.waiting_mark == "/r/attempt_0/ranks-waiting"
    assert folder.hang_verdict == "/r/attempt_0/hang-verdict.json"
    assert folder.on_hang_asked == "/r/attempt_0/on-hang"
    assert folder.hang_reports(2) == ["/r/attempt_0/hang/report-2.txt",
                                      "/r/attempt_0/hang/report-2.json"]
    src = Path(__file__).resolve().parents[1] / "src" / "unirank"
    names = {"ranks-waiting", "hang-verdict.json", "on-hang", "hang"}
    elsewhere = []
    for path in src.rglob("*.py"):
        if path.name == "runfolder.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join":
                spelt = [a.value for a in node.args if isinstance(a, ast.Constant)]
                elsewhere += [f"{path.name}: {s}" for s in spelt if s in names]
            if isinstance(node, ast.Constant) and node.value in names - {"hang", "on-hang"}:
                elsewhere.append(f"{path.name}: {node.value}")
    assert elsewhere == []
    runfolder = (src / "runfolder.py").read_text()
    assert "from unirank.hang" not in runfolder


def test_the_last_eviction_is_recorded_in_the_run_folder_and_read_back(tmp_path: Path) -> None:
    root = RunFolder(str(tmp_path))
    assert AttemptFolder(root.attempt(3).path).run == root
    assert read_evicted(root.evicted_file) is None
    write_evicted(root.evicted_file, 2, [5, 4], "node evicted: rank 5 never entered x #1")
    write_evicted(root.evicted_file, 3, [1], "node evicted: rank 1 never entered y #2")
    assert read_evicted(root.evicted_file) == (3, (1,), "node evicted: rank 1 never entered y #2")
    assert os.listdir(tmp_path) == ["evicted.json"]  # replaced whole, nothing half-written left
    Path(root.evicted_file).write_text("{")
    assert read_evicted(root.evicted_file) is None


def test_the_spare_nodes_told_are_kept_by_name_and_counted(tmp_path: Path) -> None:
    """What the rendezvous tells (:func:`spares_told`), kept in the run's spares file: the
    count for rank 0's detector, the names for ``unirank top``; a count with no names (an
    older server) gives unknown names."""
    path = RunFolder(str(tmp_path)).spares_file
    write_spares(path, spares_told({"spares": 2, "names": ["nodeC (10.0.0.3)", "nodeD"]}))
    assert (read_spares(path), read_spare_nodes(path)) == (2, ("nodeC (10.0.0.3)", "nodeD"))
    write_spares(path, spares_told({"spares": 1}))
    assert (read_spares(path), read_spare_nodes(path)) == (1, ("",))
    write_spares(path, spares_told({"spares": 0, "names": []}))
    assert (read_spares(path), read_spare_nodes(path)) == (0, ())
    assert read_spare_nodes(str(tmp_path / "none")) is None
    assert os.listdir(tmp_path) == ["spares"]


def test_the_helper_s_lines_of_spares_and_slow_links_are_told_apart_from_news() -> None:
    """As the helper writes them (:func:`to_line`: keys sorted, ``names`` before ``spares``,
    ``node`` before ``slow_link``): kept aside, never taken for news (which stops workers)."""
    spares = to_line({"spares": 1, "names": ["nodeC"]}).decode()
    slow = to_line({"slow_link": "slow link: node vm (10.0.0.3): ...", "node": "vm"}).decode()
    assert aside_of(spares) == {"spares": 1, "names": ["nodeC"]}
    assert aside_of(slow) == {"slow_link": "slow link: node vm (10.0.0.3): ...", "node": "vm"}
    news = to_line({"event": 'node b said "spares" and "slow_link"', "kind": "lost"}).decode()
    assert aside_of(news) is None
    assert aside_of('{"spares": ') is None and aside_of('["spares"]') is None
