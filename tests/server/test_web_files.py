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


def test_root_is_the_page_when_it_exists() -> None:
    page = web_file("/")
    assert page is None or page == WEB_ROOT / "index.html"
