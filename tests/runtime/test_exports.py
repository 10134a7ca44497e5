"""``import unirank as ur`` serves every runtime name lazily, and only then imports torch."""

from __future__ import annotations

import unirank
import unirank.runtime as runtime
from _procs import assert_snippet_runs


def test_every_lazy_name_is_exported_by_the_runtime() -> None:
    lazy = set(unirank._RUNTIME_NAMES)
    assert lazy == set(runtime.__all__)  # and every runtime export is served (AutoDataLoader)
    for name in sorted(lazy):
        assert getattr(unirank, name) is getattr(runtime, name), name


def test_dir_lists_the_public_names_only() -> None:
    names = dir(unirank)
    assert names == sorted(unirank.__all__)
    for private in ("Any", "annotations", "errors", "TYPE_CHECKING", "_RUNTIME_NAMES"):
        assert private not in names
    assert {"launch", "AutoDataLoader", "ConfigError", "DistEnv", "detect"} <= set(names)


def test_import_unirank_does_not_import_torch_until_a_runtime_name_is_used() -> None:
    code = (
        "import sys\nimport unirank as ur\n"
        "assert 'torch' not in sys.modules, 'import unirank imported torch'\n"
        "ur.get_rank\nassert 'torch' in sys.modules\n"
    )
    assert_snippet_runs(code)
