"""The README and docs/ link to each other and to files of the repository: every relative link
must name a file that exists and, where it names a heading, a heading that file has (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "infra" / "README.md",
         ROOT / "benchmarks" / "adapters" / "README.md", ROOT / "hpd_core" / "adapters" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            lines.append(anchor(line.lstrip("#")))
    return set(lines)


def test_anchor_follows_github():
    assert anchor(" The README's CPU table, sessions 38 to 48") == "the-readmes-cpu-table-sessions-38-to-48"
    assert anchor("`hpd evaluate` and `hpd convert`") == "hpd-evaluate-and-hpd-convert"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for url in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in url or url.startswith("mailto:"):
            continue
        path, _, heading = url.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{url} (no such file)")
        elif heading and target.suffix == ".md" and heading not in anchors(target):
            broken.append(f"{url} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
