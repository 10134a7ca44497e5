"""The keys unirank sets in a job's store have one home, one module per protocol
(:mod:`unirank.storekeys`), and one naming style, ``unirank/<protocol>/...`` (issue 33: seven
places, three styles: ``unirank/join/count``, ``/unirank/init_0``, ``unirank.rdzv.job``, and
Horovod's ``horovod/host/`` without a ``unirank`` part)."""

from __future__ import annotations

import re
from pathlib import Path

from unirank.storekeys import hang, init, join, timeline

SRC = Path(__file__).resolve().parents[1] / "src" / "unirank"
#: a store key's text: ``"unirank/...`` (also in an f-string), ``"/unirank/``, ``"unirank.x.y``
KEY_TEXT = re.compile(r"""f?["'](?:/?unirank/[a-z]|unirank\.(?:rdzv|node)\.)""")
#: modules that spell keys out, and why
NOT_YET: dict[str, str] = {}


def _keys() -> list[str]:
    """Every key constant and prefix of the modules, and one key of each function."""
    found = [getattr(m, name) for m in (hang, init, join, timeline) for name in m.__all__
             if isinstance(getattr(m, name), str) and name != "ABORT_PREFIX"]  # a value's
    return [*found,
            hang.progress_key(3), hang.stacks_key(2, 3), hang.live_key(3), init.init_prefix(1),
            init.group_prefix(2), init.rank_claim_key(3), join.join_key(3), join.seen_key(3),
            timeline.record_key(3)]


def test_every_key_is_in_the_one_style() -> None:
    keys = _keys()
    assert len(keys) > 20
    bad = [k for k in keys if not re.fullmatch(r"unirank/[a-z]+(/[A-Za-z0-9._-]+)*/?", k)]
    assert bad == []
    assert init.init_prefix(0) == "unirank/init/0" and join.join_key(3) == "unirank/join/3"


def test_no_module_outside_storekeys_spells_a_key_out() -> None:
    found = []
    for path in SRC.rglob("*.py"):
        relative = str(path.relative_to(SRC))
        if relative.startswith("storekeys/") or relative in NOT_YET:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if KEY_TEXT.search(code) and "``" not in code and "File " not in code:
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []
