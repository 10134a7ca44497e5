"""``unirank bench`` with real processes: the nccl-tests table for all five collectives on two
spawned gloo ranks (#wrong 0), the same numbers in --json and --csv, the --plot PNG, one-line
errors, and under ``srun -N2`` on the testbed a table printed by rank 0 only."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import pytest

from _procs import free_port, launcher_free_environ, unavailable
from unirank.bench.ops import OP_NAMES, OPS
from unirank.bench.plot import MISSING
from unirank.bench.report import Device, Header, Row, render_text

if TYPE_CHECKING:
    from conftest import SlurmTestbed

UNIRANK = [sys.executable, "-m", "unirank"]
REPO = Path(__file__).resolve().parents[2]
SIZES = [4096, 8192, 16384, 32768, 65536]
#: matplotlib's first five line colours: one line per collective
LINE_COLOURS = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28),
                (0x94, 0x67, 0xBD)]


def bench(*args: str, env: Optional[Mapping[str, str]] = None, timeout: float = 240,
          program: tuple[str, ...] = ("-m", "unirank")) -> subprocess.CompletedProcess[str]:
    """``unirank bench ARGS`` without any launcher's variables, on a free port (``program``:
    what follows the interpreter instead of ``-m unirank``)."""
    clean = launcher_free_environ({"MASTER_PORT": str(free_port()), **(env or {})})
    return subprocess.run([sys.executable, *program, "bench", *args], env=clean,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def data_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


def from_json(document: dict[str, Any]) -> tuple[Header, list[Row]]:
    """The Header and Rows a --json file holds (to render them again)."""
    names = {f.name for f in fields(Header)} - {"devices"}
    header = Header(**{k: document[k] for k in names},
                    devices=tuple(Device(**d) for d in document["devices"]))
    return header, [Row(**r) for r in document["results"]]


@pytest.fixture(scope="module")
def all_ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                Path]:
    """One run of ``unirank bench -n 2 --op all --max-bytes 64K --json --csv``."""
    folder = tmp_path_factory.mktemp("bench")
    proc = bench("-n", "2", "--op", "all", "--max-bytes", "64K", "--iters", "5", "--warmup", "2",
                 "--json", str(folder / "out.json"), "--csv", str(folder / "out.csv"))
    assert proc.returncode == 0, proc.stderr
    return proc, folder


@pytest.mark.integration
def test_table_for_all_five_collectives_with_no_wrong_element(
        all_ops: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, _ = all_ops
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# unirank bench version ") and lines[0].endswith(" nranks 2")
    assert [line for line in lines if line.startswith("# Collective: ")] == \
        [f"# Collective: {op}" for op in OP_NAMES]
    rows = data_rows(proc.stdout)
    assert len(rows) == len(OP_NAMES) * len(SIZES)
    for index, row in enumerate(rows):
        op = OPS[OP_NAMES[index // len(SIZES)]]
        assert int(row[0]) == SIZES[index % len(SIZES)]
        assert row[2:5] == ["float", op.redop, str(op.root)]
        assert row[8] == "0", row  # #wrong
    assert sum(line.startswith("# Avg bus bandwidth    : ") for line in lines) == 5
    assert lines.count("# Out of bounds values : 0 OK") == 5
    assert lines[-1] == "# Collective test concluded: unirank bench -n 2 --op all --max-bytes " \
                        f"64K --iters 5 --warmup 2 --json {proc.args[-3]} --csv {proc.args[-1]}"
    assert "\r" not in proc.stderr  # no progress bar when stderr is not a terminal


@pytest.mark.integration
def test_json_holds_what_the_table_shows(
        all_ops: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, folder = all_ops
    document = json.loads((folder / "out.json").read_text())
    header, rows = from_json(document)
    assert render_text(header, rows) == proc.stdout
    assert document["out_of_bounds"] == 0 and document["world_size"] == 2
    assert [d["rank"] for d in document["devices"]] == [0, 1]
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0,
               "all_to_all": 0.5}  # nccl-tests' factors for two ranks
    for row in rows:
        assert row.algbw == pytest.approx(row.size / row.time_us / 1e3)
        assert row.busbw == pytest.approx(row.algbw * factors[row.op])
        assert row.memcpy_gbps > 0 and row.median_us > 0
    assert set(document["average_bus_bandwidth"]) == set(OP_NAMES)


@pytest.mark.integration
def test_csv_has_one_line_per_collective_and_size(
        all_ops: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, folder = all_ops
    with open(folder / "out.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    results = json.loads((folder / "out.json").read_text())["results"]
    assert [(r["op"], int(r["size"]), float(r["busbw"])) for r in table] == \
        [(r["op"], r["size"], r["busbw"]) for r in results]


@pytest.mark.integration
def test_plot_writes_a_png_with_one_line_per_collective(tmp_path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        unavailable("matplotlib is not installed: pip install -e '.[test]' (or 'unirank[plot]')")
    import matplotlib.image

    png = tmp_path / "busbw.png"
    proc = bench("-n", "2", "--op", "all", "--max-bytes", "16K", "--iters", "3", "--warmup",
                 "1", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[:2] == (600, 960)
    rgb = (pixels[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colours = set(map(tuple, rgb.tolist()))  # lines and legend: one colour per collective
    assert all(colour in colours for colour in LINE_COLOURS)


def test_plot_without_matplotlib_is_one_line(tmp_path: Path) -> None:
    blocker = ("import sys\n"
               "class NoMatplotlib:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] == 'matplotlib':\n"
               "            raise ModuleNotFoundError(name)\n"
               "sys.meta_path.insert(0, NoMatplotlib())\n"
               "from unirank.cli.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    proc = bench("--plot", str(tmp_path / "x.png"), program=("-c", blocker))
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", MISSING + "\n")
    assert MISSING == "unirank bench: --plot needs matplotlib: pip install 'unirank[plot]'"


@pytest.mark.parametrize(("args", "message"), [
    (("--op", "allreduce"), "unirank bench: error: --op='allreduce': not a valid choice HINT: "
     "choose one of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, all"),
    (("--backend", "mpi"), "unirank bench: error: --backend='mpi': not a valid choice HINT: "
     "choose one of auto, gloo, nccl"),
    (("--max-bytes", "2X"), "unirank bench: error: --max-bytes='2X': not a size HINT: give "
     "bytes with an optional K, M or G suffix (binary: 4K = 4096), e.g. 256M"),
])
def test_bad_options_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    proc = bench(*args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message + "\n")


@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["torchrun", "unirank run"])
def test_under_a_launcher_rank_0_alone_prints_the_table(launcher: str) -> None:
    port = str(free_port())
    program = {  # what follows the interpreter: the launcher, then `-m unirank`
        "torchrun": ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                     port, "-m", "unirank"),
        "unirank run": ("-m", "unirank", "run", "-n", "2", "-m", "unirank"),
    }[launcher]
    proc = bench("--max-bytes", "8K", "--iters", "2", "--warmup", "1", program=program,
                 env={"MASTER_PORT": port})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("# Collective test starting: ") == 1, proc.stdout
    assert [row[0] for row in data_rows(proc.stdout)] == ["4096", "8192"]
    assert proc.stdout.splitlines()[0].endswith(" nranks 2")


@pytest.mark.slurm
@pytest.mark.integration
def test_srun_two_nodes_table_from_rank_0_only(slurm_testbed: SlurmTestbed) -> None:
    result = slurm_testbed.srun(
        ["-N2", "--ntasks-per-node=1", "--label", f"--chdir={REPO}", *UNIRANK, "bench",
         "--max-bytes", "16K", "--iters", "3", "--warmup", "1"],
        timeout=120, env={"UNIRANK_INIT_TIMEOUT": "60"},
    )
    lines = result.stdout.splitlines()
    assert lines, result.stderr
    assert all(line.startswith("0: ") for line in lines), result.stdout  # nothing from rank 1
    table = "\n".join(line[3:] for line in lines) + "\n"
    assert [row[0] for row in data_rows(table)] == ["4096", "8192", "16384"]
    assert all(row[8] == "0" for row in data_rows(table))
    devices = [line.split() for line in table.splitlines() if line.startswith("#  Rank ")]
    assert [(d[2], d[8]) for d in devices] == [("0", "node1"), ("1", "node2")]
    assert table.count("# Avg bus bandwidth    : ") == 1
