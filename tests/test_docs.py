"""The README and docs/ as a newcomer meets them: the README is short and opens with the two commands
that work on a fresh machine, every relative link (and its #anchor) in README.md and docs/ (the
notes included) leads somewhere, docs/index.md lists every page, and every `mlharness ...` example in
the code blocks of the README and the reference pages is accepted by the CLI's argument parser; those
that only read (or write into the working folder) are also run for real. The dated notes under
docs/notes/ keep their commands as they were run, so their examples are not held to today's CLI."""
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


SHELL_ENDS = {"|", "&&", ";", ">", ">>", "2>&1"}
SUBSTITUTION = re.compile(r"\$\((mlharness [^)]*)\)")
OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
CHOICE = re.compile(r"\(([^()]*\|[^()]*)\)")
# Documented commands that only read, or write into the working folder (the test's tmp_path): run for real.
RUN_FOR_REAL = (("specs", "list"), ("specs", "schema"), ("zoo", "list"))


def reference_pages() -> list[Path]:
    """The README and the reference pages: docs/ less the dated notes."""
    return [README, *sorted(p for p in DOCS.glob("*.md"))]


def synopsis_forms(line: str) -> list[str]:
    """A usage synopsis as concrete commands: without its optional `[...]` parts, then with each one
    alone; a `(a | b)` choice once per alternative; `X...` once, and `a|b|c` values as the first."""
    choice = CHOICE.search(line)
    if choice:
        return [form for alternative in choice.group(1).split("|")
                for form in synopsis_forms(line[:choice.start()] + alternative.strip() + line[choice.end():])]
    groups = OPTIONAL.findall(line)
    base = OPTIONAL.sub("", line)
    forms = [base] + [OPTIONAL.sub(lambda m, keep=g: keep if m.group(1) == keep else "", line) for g in groups]
    return [re.sub(r"(\S+?)\|\S+", r"\1", form.replace("...", "")) for form in forms]


def commands_in(text: str) -> list[str]:
    """Every `mlharness ...` line of the text's code blocks: a `$ ` prompt and its comment dropped,
    `\\`-continued lines joined, cut at a pipe or redirection, a trailing `&` dropped. A `$(mlharness ...)`
    substitution is a command of its own and stands as one file in the outer one; a synopsis gives its
    forms (synopsis_forms)."""
    found: list[str] = []
    for block in fenced_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line.startswith("mlharness "):
                continue
            inner = SUBSTITUTION.findall(line)
            line = SUBSTITUTION.sub("substituted.yaml", line)
            for form in [*inner, *synopsis_forms(line.split(" #", 1)[0])]:
                words = shlex.split(form, comments=True)
                ends = [i for i, word in enumerate(words) if word in SHELL_ENDS]
                words = words[:ends[0]] if ends else words
                if words and words[-1] == "&":
                    words = words[:-1]
                command = shlex.join(words)
                if words[:1] == ["mlharness"] and command not in found:
                    found.append(command)
    return found


def documented_commands() -> list[tuple[str, str]]:
    return [(page.name, command) for page in reference_pages() for command in commands_in(page.read_text())]


def readme_commands() -> list[str]:
    return commands_in(README.read_text())


def test_readme_has_mlharness_examples() -> None:
    assert len(readme_commands()) >= 5


def test_command_extraction() -> None:
    """The extractor itself: a prompt, a continuation, a substitution, a pipe, a synopsis."""
    text = ("```\n$ mlharness run null --scenario Offline --quick   # a comment\n"
            "mlharness bricks $(mlharness zoo build --family squeezenet) \\\n    --time-cap 0.2\n"
            "mlharness results export --format csv | head\n"
            "mlharness report (--run ID | --bricks) --out DIR [--db FILE] [--format csv|html]\n"
            "mlharness serve m --grpc 127.0.0.1:8001 &\nnot mlharness run\n```\n`mlharness run x` in prose\n")
    assert commands_in(text) == [
        "mlharness run null --scenario Offline --quick",
        "mlharness zoo build --family squeezenet",
        "mlharness bricks substituted.yaml --time-cap 0.2",
        "mlharness results export --format csv",
        "mlharness report --run ID --out DIR",
        "mlharness report --run ID --out DIR --db FILE",
        "mlharness report --run ID --out DIR --format csv",
        "mlharness report --bricks --out DIR",
        "mlharness report --bricks --out DIR --db FILE",
        "mlharness report --bricks --out DIR --format csv",
        "mlharness serve m --grpc 127.0.0.1:8001",
    ]


@pytest.mark.parametrize(("page", "command"), documented_commands(), ids=lambda v: v)
def test_documented_example_parses(page: str, command: str) -> None:
    """Accepted by `mlharness`'s own parser (harness/cli.py build_parser); nothing is run."""
    from mlharness.cli import build_parser

    try:
        args = build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:
        pytest.fail(f"{page}: `{command}`: the parser refused it (exit {exc.code})")
    assert callable(args.func)


@pytest.mark.parametrize(("page", "command"),
                         [(page, c) for page, c in documented_commands()
                          if tuple(shlex.split(c)[1:3]) in RUN_FOR_REAL], ids=lambda v: v)
def test_documented_read_only_example_runs(page: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Run for real, in the test's own working folder (tmp_path), through the CLI's main."""
    from tests.support import run_cli

    assert run_cli(*shlex.split(command)[1:]) == 0, f"{page}: `{command}` failed: {capsys.readouterr().err}"
    assert capsys.readouterr().out.strip(), f"{page}: `{command}` printed nothing"
