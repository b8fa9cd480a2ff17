"""The demo page's static files: only names inside clients/web are ever served."""

from __future__ import annotations

import pytest

from server.app import WEB_ROOT, web_file


@pytest.mark.parametrize(
    "path",
    [
        "/web/../server/app.py",
        "/web/%2e%2e/x.js",
        "/web/a/b.js",
        "/etc/passwd",
        "/web/",
        "/web/x.py",
    ],
)
def test_paths_outside_the_page_are_not_served(path: str) -> None:
    assert web_file(path) is None


def test_root_is_the_page() -> None:
    assert web_file("/") == WEB_ROOT / "index.html"


def test_every_file_of_the_page_is_served_by_its_name() -> None:
    """The other side of the refusals above: the page's own files do come back."""
    kinds = (".html", ".js", ".css", ".svg", ".json")  # what the server serves
    names = sorted(f.name for f in WEB_ROOT.iterdir() if f.is_file() and f.suffix in kinds)
    assert {"index.html", "app.js", "style.css"} <= set(names)
    for name in names:
        assert web_file(f"/web/{name}") == WEB_ROOT / name, name
    assert web_file("/web/missing.js") is None  # a good name, but no such file
