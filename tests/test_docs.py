"""The user documentation stays navigable and names the real test command.

Every relative link in README.md and docs/*.md must point to a file or folder that exists and,
when it has one, to a heading anchor of that Markdown file (GitHub's slugs). README must give the
exact test command that CI (.ci/run) runs, and link every page of docs/. No page shows a path of
the machine it was written on (:func:`machine_paths` says the rule).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def links(text: str) -> list[str]:
    """The link targets of a Markdown text (not those inside code)."""
    found: list[str] = []
    for line in prose_lines(text):
        found += _LINK.findall(_INLINE_CODE.sub("", line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_slug_follows_github() -> None:
    assert slug("The join at scale: `benchmarks/scale.py`") == "the-join-at-scale-benchmarksscalepy"
    assert slug("With ignite, Lightning and Accelerate") == "with-ignite-lightning-and-accelerate"
    assert slug("`unirank run`") == "unirank-run"


def test_links_are_found_outside_code() -> None:
    text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md#x)\n"
    assert links(text) == ["a.md", "d.md#x"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken: list[str] = []
    for target in links(page.read_text(encoding="utf-8")):
        if _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def ci_test_command() -> str:
    """The command .ci/run ends with: its last line that is not a comment or shell set-up."""
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    commands = [line for line in lines if not line.startswith(("set ", "cd "))]
    assert commands, ".ci/run runs no command"
    return commands[-1]


def test_readme_gives_the_ci_test_command() -> None:
    command = ci_test_command()
    assert "pytest" in command
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert command in [line.strip() for line in readme], (
        f"README.md must give the exact test command of .ci/run on a line of its own: {command}"
    )


def test_readme_links_every_docs_page() -> None:
    targets = {t.partition("#")[0] for t in links((ROOT / "README.md").read_text("utf-8"))}
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in targets]
    assert not missing, f"README.md does not link: {', '.join(missing)}"


#: absolute paths of the machine a page was written on: a superuser's or a named user's home
#: (but ``/home/me/``), this workspace's ``/work/``, pytest's temporary folders
_MACHINE_PATH = re.compile(
    r"(?<![\w.~-])(?:/root/|/work/|/tmp/pytest|/Users/(?!me/)[\w.-]+/|/home/(?!me/)[\w.-]+/)")


def machine_paths(text: str) -> list[str]:
    """``line N: path`` for every absolute machine path of a page (prose and code alike).

    The rule: a page shows no path of the machine it was written on. ``/home/me/`` is the one
    home a page may show, standing for the reader's (``/home/me/venv/bin/python``: the
    interpreter of your own environment); ``/tmp/<name>`` folders a page made up for an example
    (``/tmp/hangdoc``) and the folders unirank itself makes (``/tmp/unirank-run-...``) are
    illustrative; system paths (``/usr/lib/python3.11``, ``/etc/hosts``) are the same
    everywhere. Forbidden: ``/root/``, ``/work/``, ``/tmp/pytest...``, ``/home/<user>/`` and
    ``/Users/<user>/`` other than ``me``."""
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"line {number}: {m.group(0)}" for m in _MACHINE_PATH.finditer(line)]
    return found


def test_machine_paths_are_found() -> None:
    text = ("run /home/me/venv/bin/python\n"
            "  File \"/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py\"\n"
            "see /work/shared/facts.md, /tmp/pytest-of-root/x and /home/alice/proj\n"
            "/tmp/hangdoc/train.py, /usr/lib/python3.11/threading.py, ~/root/x, a/work/b\n")
    assert machine_paths(text) == ["line 2: /root/", "line 3: /work/", "line 3: /tmp/pytest",
                                   "line 3: /home/alice/"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(page: Path) -> None:
    found = machine_paths(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} shows a machine's own path: " + "; ".join(found)
