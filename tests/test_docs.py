"""The docs hold together: every relative link and anchor resolves, each reference table names
what its source of truth holds (the policy pack's specs, the stack config's keys), and the README
stays one screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
README_MAX_LINES = 80
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(_slug(line.lstrip("#")))
    return found


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def broken_links(page: Path) -> list[str]:
    """``target`` for each relative link of ``page`` whose file or ``#anchor`` does not exist."""
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists() or (
            anchor and where.suffix == ".md" and anchor not in _anchors(where)
        ):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#real-heading) [gone](c.md) [anchor](b.md#nope) [web](https://x)\n")
    assert broken_links(page) == ["c.md", "b.md#nope"]


def _first_column_names(page: Path, section: str) -> set[str]:
    text = page.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z0-9-]+)`", line.split("|")[1]))
    return names


def test_the_policy_table_lists_every_policy_of_the_pack() -> None:
    from policies.pack import POLICIES

    listed = _first_column_names(REPO / "docs" / "policies.md", "The policies")
    companions = {p.advisory_name for p in POLICIES if p.advisory_name}
    assert listed == {p.name for p in POLICIES} | companions


@pytest.fixture(scope="module")
def stack_keys() -> set[str]:
    """Every key a section accepts, as the parser of the shipped stacks declares it."""
    from infra.config import reader
    from infra.config.stack import _TOP_KEYS, load_stack_file

    seen: set[str] = set(_TOP_KEYS)
    original = reader.Section.__init__

    def recording(self, problems, path, raw, keys):  # type: ignore[no-untyped-def]
        keys = tuple(keys)
        seen.update(keys)
        original(self, problems, path, raw, keys)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader.Section, "__init__", recording)
        for stack in ("dev", "prod"):
            load_stack_file(REPO / f"Pulumi.{stack}.yaml", image_tag="t")
    return seen


def _named(key: str, text: str) -> bool:
    """Whether ``key`` is written in a code span of ``text`` (`key`, `ray-tpu:key`, `{key, x}`)."""
    spans = " ".join(re.findall(r"`[^`\n]+`", text))
    return re.search(rf"[`{{,:. ]{re.escape(key)}[`}},.: \[]", spans) is not None


@pytest.mark.parametrize(
    ("key", "text", "named"),
    [
        ("rayImage", "| `ray-tpu:rayImage` | string |", True),
        ("cidrBlock", "list of `{cidrBlock, displayName}`", True),
        ("zone", "| `zone` | string |", True),
        ("zone", "the zone of the slice, `zones`", False),
        ("teams", "teams share the slices", False),
    ],
    ids=["namespaced", "in-braces", "plain", "longer-word", "prose-only"],
)
def test_a_key_counts_only_in_a_code_span(key: str, text: str, named: bool) -> None:
    assert _named(key, text) is named


def test_the_stack_reference_names_every_key(stack_keys: set[str]) -> None:
    reference = "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    missing = sorted(k for k in stack_keys if not _named(k, reference))
    assert len(stack_keys) > 40  # the parser really was recorded
    assert missing == []


def test_the_readme_is_one_screen_and_links_every_docs_page() -> None:
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= README_MAX_LINES
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in _links(readme)}
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")}
    assert sorted(str(p.relative_to(REPO)) for p in pages - linked) == []
