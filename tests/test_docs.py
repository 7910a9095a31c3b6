"""The README and docs/ as a newcomer meets them: the README is short and opens with the two commands
that work on a fresh machine, every relative link (and its #anchor) in README.md and docs/ leads
somewhere, docs/index.md lists every page, and every `mlharness ...` example in the README is accepted
by the CLI's argument parser (parsed, not run)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 8000

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(])*?\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def fenced_blocks(text: str) -> list[str]:
    return [m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] for m in FENCE.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, https:, mailto: ...


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.relative_to(root)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.relative_to(root)}: {target}: no heading with that anchor in {dest.name}")
    return problems


def test_every_relative_link_resolves() -> None:
    problems = [p for page in pages() for p in broken_links(page)]
    assert problems == []


def test_the_link_check_sees_a_dead_link_and_a_dead_anchor(tmp_path: Path) -> None:
    """The checker itself: a dead file, a dead anchor and a link inside code (not a link) on one page."""
    (tmp_path / "there.md").write_text("# A page\n\n## Harness keys\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#harness-keys) [gone](missing.md) [bad](there.md#nope)\n"
                    "`[code](not-a-link.md)` [web](https://example.org/x.md)\n```\n[block](nor-this.md)\n```\n")
    problems = [p.split(": ", 1)[1] for p in broken_links(page, tmp_path)]
    assert problems == ["missing.md: no such file", "there.md#nope: no heading with that anchor in there.md"]


def test_readme_is_short() -> None:
    size = len(README.read_text())
    assert size <= README_LIMIT, f"README.md is {size} characters; the limit is {README_LIMIT} (move detail to docs/)"


def test_readme_opens_with_make_run_and_make_test() -> None:
    text = README.read_text()
    after_title = text.split("\n", 1)[1].lstrip("\n")
    assert after_title.startswith("```"), "the README's first thing after its title is the commands block"
    first = fenced_blocks(text)[0]
    commands = [line.split("#", 1)[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_docs_index_lists_every_page() -> None:
    index = DOCS / "index.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in relative_links(index)}
    missing = [str(p.relative_to(REPO)) for p in sorted(DOCS.rglob("*.md"))
               if p != index and p.resolve() not in listed]
    assert missing == [], f"docs/index.md does not list: {missing}"


def readme_commands() -> list[str]:
    """Every `mlharness ...` line of the README's code blocks, without its comment or trailing `&`."""
    found = []
    for block in fenced_blocks(README.read_text()):
        for line in block.splitlines():
            if not line.startswith("mlharness "):
                continue
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            if words[:1] == ["mlharness"]:
                found.append(shlex.join(words))
    return found


def test_readme_has_mlharness_examples() -> None:
    assert len(readme_commands()) >= 5


@pytest.mark.parametrize("command", readme_commands())
def test_readme_example_parses(command: str) -> None:
    """Accepted by `mlharness`'s own parser (harness/cli.py build_parser); nothing is run."""
    from mlharness.cli import build_parser

    try:
        args = build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:
        pytest.fail(f"`{command}`: the parser refused it (exit {exc.code})")
    assert callable(args.func)
