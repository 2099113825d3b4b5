"""The product cites only itself: docs/CONTRACT.md is the contract, and nothing the product ships points at a design
document that does not ship with it, nor links outside the repository.

- no file of the product names a "DESIGN" document (a "DESIGN §N" citation, "DESIGN.md", …);
- every Markdown link is relative, stays inside the repository and names a file or folder that exists;
- every http(s) URL in the product names a loopback/private address, a reserved test domain, or an XML/JSON-Schema
  namespace identifier — never a page a reader would have to fetch.

Recorded runs under reports/published/ are kept as the harness of their day wrote them: their links and addresses are
not scanned, but their words are (one checker message of the day, "followed DESIGN §2 paths", now reads as the checker
words it today, "followed CONTRACT §5 paths").
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()
SKIP_PREFIXES = ("reports/published/", "reports/runs/")
SKIP_PARTS = {"node_modules", ".venv", ".git", "__pycache__"}
# Lock files a package manager writes: their registry and funding addresses are pins a tool reads, not links to
# a page a reader follows.
SKIP_NAMES = {"package-lock.json", "go.sum"}
TEXT_SUFFIXES = {".md", ".py", ".json", ".toml", ".yml", ".yaml", ".go", ".ts", ".js", ".mjs", ".sql", ".sh",
                 ".txt", ".cfg", ".ini", ".html", ".j2", ""}

DESIGN = re.compile(r"\bDESIGN\b")
MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
URL = re.compile(r"https?://([A-Za-z0-9.\-\[\]:]+)")
# Identifiers that look like URLs but are never fetched: the SVG namespace and JSON Schema's $schema.
NAMESPACE_HOSTS = {"www.w3.org", "json-schema.org"}
TEST_TLDS = (".invalid", ".test", ".example", ".localhost")
TEST_DOMAINS = {"example.com", "example.org", "example.net", "localhost"}


def product_files(skip_prefixes: tuple[str, ...] = SKIP_PREFIXES) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    files = []
    for rel in sorted(set(out)):
        if rel.startswith(skip_prefixes) or SKIP_PARTS & set(Path(rel).parts) or Path(rel).name in SKIP_NAMES:
            continue
        path = REPO / rel
        if path.resolve() == THIS or not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        files.append(path)
    return files


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


def design_citations(files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        for n, line in enumerate(read(path).splitlines(), 1):
            if DESIGN.search(line):
                hits.append(f"{rel(path)}:{n}: {line.strip()[:120]}")
    return hits


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def bad_links(files: list[Path], text_of=read) -> list[str]:
    hits = []
    root = REPO.resolve()
    for path in files:
        if path.suffix != ".md":
            continue
        for n, line in enumerate(text_of(path).splitlines(), 1):
            for m in MD_LINK.finditer(line):
                target = m.group(1) or m.group(2)
                where = f"{rel(path)}:{n}: {target}"
                if re.match(r"^[a-z][a-z0-9+.\-]*:", target, re.I):
                    hits.append(f"{where} (an absolute link: the product links only inside itself)")
                    continue
                local = target.split("#", 1)[0]
                if not local:
                    continue
                resolved = (path.parent / local).resolve()
                if root not in resolved.parents and resolved != root:
                    hits.append(f"{where} (outside the repository)")
                elif not resolved.exists():
                    hits.append(f"{where} (no such file)")
    return hits


def host_is_harmless(host: str) -> bool:
    host = host.strip("[]").split(":")[0] if not host.startswith("[") else host[1:host.find("]")]
    host = host.rstrip(".").lower()
    if not host or "." not in host and host != "localhost":
        return True  # a placeholder ("http://x", "http://evil/")
    if host in NAMESPACE_HOSTS or host in TEST_DOMAINS or host.endswith(TEST_TLDS):
        return True
    if any(host.endswith("." + d) for d in TEST_DOMAINS):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    # A literal address is test data (a URL the harness must flag in a message), never a page to read.
    return ip is not None


def outside_urls(files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        for n, line in enumerate(read(path).splitlines(), 1):
            for m in URL.finditer(line):
                if not host_is_harmless(m.group(1)):
                    hits.append(f"{rel(path)}:{n}: {m.group(0)}")
    return hits


def test_no_design_citation_anywhere_in_the_product():
    hits = design_citations(product_files(skip_prefixes=("reports/runs/",)))
    assert not hits, "cite docs/CONTRACT.md, not a design document that does not ship:\n" + "\n".join(hits)


def test_markdown_links_stay_inside_the_repository():
    hits = bad_links(product_files())
    assert not hits, "\n".join(hits)


def test_no_url_to_a_page_outside_the_repository():
    hits = outside_urls(product_files())
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("text, finds", [
    ("see DESIGN §2 for the states", True),
    ("the brief (DESIGN.md) says", True),
    ("Fault names match DESIGN: cut", True),
    ("see CONTRACT §5 for the states", False),
    ("a DESIGNER's note", False),
])
def test_the_design_rule_can_fail(tmp_path, text, finds):
    f = tmp_path / "x.md"
    f.write_text(text + "\n")
    assert bool(DESIGN.search(f.read_text())) is finds


def test_the_link_rules_can_fail():
    page = REPO / "docs" / "a-page-that-is-never-written.md"
    text = ("[ok](CONTRACT.md) [web](https://github.com/x/y) [up](../../../etc/passwd) "
            "[gone](no-such-page.md) [anchor](#the-pipeline)\n")
    hits = bad_links([page], text_of=lambda path: text)
    assert len(hits) == 3, hits
    assert any("absolute" in h for h in hits) and any("outside" in h for h in hits) and any("no such" in h for h in hits)
    assert not host_is_harmless("docs.python.org")
    assert not host_is_harmless("github.com")
    for ok in ("127.0.0.1:8080", "localhost", "www.w3.org", "json-schema.org", "evil", "cdn.example.com",
               "api.test", "example.invalid", "10.0.0.5"):
        assert host_is_harmless(ok), ok
