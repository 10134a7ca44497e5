"""``unirank bench``'s pure parts, without processes: sizes, layouts and bus-bandwidth factors as
nccl-tests counts them, option validation, the progress bar, and the table/CSV/JSON against the
golden files in ``tests/fixtures/bench/``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from _procs import assert_snippet_runs
from unirank.bench import report
from unirank.bench.config import make_config
from unirank.bench.ops import DTYPES, OP_NAMES, OPS, algbw, busbw, layout
from unirank.bench.progress import CLEAR, Progress, bar_line
from unirank.bench.report import Device, Header, Row
from unirank.bench.sizes import human_size, parse_size, sweep
from unirank.errors import ConfigError

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


# --- sizes ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "size"), [
    ("4096", 4096), ("4K", 4096), ("4k", 4096), ("256M", 256 << 20), ("1G", 1 << 30),
    ("1.5M", 3 << 19), (" 8 K ", 8192), ("1", 1), ("2T", 2 << 40), (".5K", 512),
])
def test_parse_size_reads_binary_units_as_nccl_tests(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "K", "4X", "4KB", "-4K", "4 K B", "1e3", "0", "0.1"])
def test_parse_size_refuses_with_one_line_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text, "--max-bytes")
    message = str(info.value)
    assert message.startswith(f"--max-bytes={text!r}: ")
    assert "\n" not in message


def test_sweep_multiplies_while_at_most_max() -> None:
    assert sweep(4096, 65536, 2) == [4096, 8192, 16384, 32768, 65536]
    assert sweep(1000, 100000, 10) == [1000, 10000, 100000]
    assert sweep(4096, 60000, 4) == [4096, 16384]
    assert sweep(8, 8, 2) == [8]


def test_human_size() -> None:
    assert [human_size(s) for s in (3, 4096, 1536, 256 << 20, 1 << 30)] == \
        ["3", "4K", "1.5K", "256M", "1G"]


# --- layouts and bandwidths -------------------------------------------------------------------

def test_layout_counts_buffers_as_nccl_tests() -> None:
    # (op, size, itemsize, nranks) -> (count column, send, recv, size column)
    cases = {
        ("all_reduce", 4096, 4, 2): (1024, 1024, 1024, 4096),
        ("broadcast", 4100, 4, 3): (1025, 1025, 1025, 4100),
        ("all_gather", 4096, 4, 2): (512, 512, 1024, 4096),
        ("reduce_scatter", 4096, 4, 2): (512, 1024, 512, 4096),
        ("all_to_all", 4096, 4, 2): (512, 1024, 1024, 4096),
        # blocks are 16-byte aligned: 1024/3 = 341 -> 340 floats, the total shrinks
        ("all_gather", 4096, 4, 3): (340, 340, 1020, 4080),
        ("all_to_all", 4096, 1, 3): (1360, 4080, 4080, 4080),
        ("reduce_scatter", 4096, 8, 3): (170, 510, 170, 4080),
        ("all_gather", 16, 4, 8): (0, 0, 0, 0),
    }
    for (name, size, itemsize, n), want in cases.items():
        got = layout(OPS[name], size, itemsize, n)
        assert (got.count, got.send, got.recv, got.nbytes) == want, name


def test_busbw_factors_are_nccl_tests_ones() -> None:
    one_second = 8e9  # 8e9 bytes in 1 s: algbw 8 GB/s
    assert algbw(int(one_second), 1.0) == 8.0
    factors = {name: busbw(OPS[name], int(one_second), 1.0, 4) / 8.0 for name in OP_NAMES}
    assert factors == pytest.approx({"all_reduce": 1.5, "all_gather": 0.75,
                                     "reduce_scatter": 0.75, "broadcast": 1.0,
                                     "all_to_all": 0.75})
    assert busbw(OPS["all_reduce"], 1000, 1e-6, 1) == 0.0  # one rank moves nothing
    assert algbw(1000, 0.0) == 0.0


def test_op_columns() -> None:
    assert [(OPS[n].redop, OPS[n].root) for n in OP_NAMES] == [
        ("sum", -1), ("none", -1), ("sum", -1), ("none", 0), ("none", -1)]
    assert [DTYPES[d].nccl_name for d in ("float32", "float16", "bfloat16", "float64")] == \
        ["float", "half", "bfloat16", "double"]


# --- options ----------------------------------------------------------------------------------

def _config(**overrides: str) -> object:
    values = dict(op="all_reduce", dtype="float32", min_bytes="4K", max_bytes="256M",
                  step_factor="2", iters="20", warmup="5")
    values.update(overrides)
    return make_config(**values)  # type: ignore[arg-type]


def test_config_defaults_and_all() -> None:
    config = _config(op="all", max_bytes="64K")
    assert config.ops == OP_NAMES  # type: ignore[attr-defined]
    assert config.sizes == [4096, 8192, 16384, 32768, 65536]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("option", "value", "names"), [
    ("op", "allreduce", "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, all"),
    ("dtype", "fp32", "float32, float16, bfloat16, float64, int32, int64, int8, uint8"),
])
def test_bad_choice_names_the_valid_ones(option: str, value: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(**{option: value})
    assert str(info.value) == \
        f"--{option}={value!r}: not a valid choice HINT: choose one of {names}"


@pytest.mark.parametrize(("field", "value", "option"), [
    ("iters", "0", "--iters"), ("warmup", "x", "--warmup"), ("step_factor", "1", "--step-factor"),
    ("min_bytes", "1M", "--min-bytes"),
])
def test_bad_numbers_are_one_line(field: str, value: str, option: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(**{field: value, "max_bytes": "4K"} if field == "min_bytes" else {field: value})
    assert str(info.value).startswith(f"{option}={value!r}: ")


# --- progress ---------------------------------------------------------------------------------

def test_bar_line() -> None:
    assert bar_line(0, 10, "all_reduce 4K", width=10) == \
        "unirank bench [----------]  0/10  all_reduce 4K"
    assert bar_line(5, 10, "x", width=10) == "unirank bench [#####-----]  5/10  x"
    assert bar_line(10, 10, "x", width=10) == "unirank bench [##########] 10/10  x"


def test_progress_draws_in_place_and_erases_itself() -> None:
    stream = io.StringIO()
    bar = Progress(stream, total=2, enabled=True)
    bar.show("a")
    bar.step()
    bar.hide()
    bar.show("b")
    bar.close()
    assert stream.getvalue() == (CLEAR + bar_line(0, 2, "a") + CLEAR
                                 + CLEAR + bar_line(1, 2, "b") + CLEAR)
    quiet = io.StringIO()
    off = Progress(quiet, total=2, enabled=False)
    off.show("a")
    off.close()
    assert quiet.getvalue() == ""


# --- the report against golden files ----------------------------------------------------------

def test_fit_is_nccl_tests_number_format() -> None:
    assert [report.fit(v, 6) for v in (0.0123, 12.345, 1234.5, 12345.6, 123456.7, 1.2e7)] == \
        ["  0.01", " 12.35", "1234.5", " 12346", "123457", " 1e+07"]
    assert report.fit(1.23e8, 7) == "1.2e+08"


def sample() -> tuple[Header, list[Row]]:
    """A fixed two-op, two-size result (the golden files are its rendering)."""
    devices = (Device(0, 4242, "node1", "cpu", "-", "CPU x86_64"),
               Device(1, 777, "node2", "cuda:0", "0000:1b:00", "NVIDIA H100 80GB HBM3"))
    header = Header(version="0.1.0", torch_version="2.13.0+cpu", backend="gloo", world_size=2,
                    command="unirank bench -n 2 --op all --max-bytes 8K", dtype="float32",
                    min_bytes=4096, max_bytes=8192, step_factor=2, warmup=5, iters=20,
                    devices=devices)
    rows = [
        Row("all_reduce", 4096, 1024, "float", "sum", -1, 173.734, 0.023576, 0.023576, 0,
            144.88, 4.3216),
        Row("all_reduce", 8192, 2048, "float", "sum", -1, 12345.6, 0.000664, 0.000664, 0,
            132.74, 1234.5),
        Row("broadcast", 4096, 1024, "float", "none", 0, 93.78, 0.043677, 0.043677, 3, 78.67,
            4.32),
        Row("broadcast", 8192, 2048, "float", "none", 0, 81.42, 0.10061, 0.10061, 0, 75.56,
            9.77),
    ]
    return header, rows


@pytest.mark.parametrize(("name", "render"), [
    ("table.txt", lambda h, r: report.render_text(h, r)),
    ("rows.csv", lambda h, r: report.render_csv(r)),
    ("report.json", lambda h, r: report.render_json(h, r)),
])
def test_renderings_match_golden_files(name: str, render: object) -> None:
    header, rows = sample()
    assert render(header, rows) == (GOLDEN / name).read_text()  # type: ignore[operator]


def test_table_rows_are_nccl_tests_columns_then_ours() -> None:
    header, rows = sample()
    text = report.render_text(header, rows)
    data = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert data[0] == ["4096", "1024", "float", "sum", "-1", "173.73", "0.02", "0.02", "0",
                       "144.88", "4.32"]
    names = next(line for line in text.splitlines() if "busbw" in line).split()
    assert names == ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                     "#wrong", "median", "memcpy"]
    footers = [line for line in text.splitlines() if "Avg bus bandwidth" in line]
    assert footers == ["# Avg bus bandwidth    : 0.01212", "# Avg bus bandwidth    : 0.0721435"]
    assert "# Out of bounds values : 3 FAILED" in text.splitlines()


def test_json_sums_and_averages() -> None:
    header, rows = sample()
    document = json.loads(report.render_json(header, rows))
    assert document["out_of_bounds"] == 3
    assert document["average_bus_bandwidth"]["broadcast"] == pytest.approx(0.0721435)
    assert [d["hostname"] for d in document["devices"]] == ["node1", "node2"]


def test_the_cli_and_the_pure_parts_do_not_import_torch() -> None:
    assert_snippet_runs(
        "import sys\n"
        "import unirank.cli.bench, unirank.bench.config, unirank.bench.report\n"
        "import unirank.bench.plot, unirank.bench.progress\n"
        "from unirank.cli.main import build_parser\n"
        "build_parser('bench').parse_args(['bench', '--op', 'all'])\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules\n"
    )
