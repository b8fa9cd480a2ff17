"""``quicksilver fleet config``: the balancer's HAProxy configuration, checked by HAProxy
itself (the fleet running, with real nodes, is tests/e2e/test_fleet.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cli.main import main
from server.fleet import Node, haproxy_config
from tests.speech import missing

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "deploy" / "haproxy.cfg"


def haproxy() -> str:
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(path).exists():
        missing("haproxy is not installed (apt-get install haproxy)")
    return path


def test_the_checked_in_config_is_what_fleet_config_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fleet", "config", "--nodes", "2"]) == 0
    assert capsys.readouterr().out == CHECKED_IN.read_text()


def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    nodes = [Node(f"node{i}", f"10.0.0.{i}", 8765) for i in range(1, 4)]
    generated = tmp_path / "three.cfg"
    generated.write_text(haproxy_config(nodes))
    for config in (CHECKED_IN, generated):
        check = subprocess.run(
            [haproxy(), "-c", "-f", str(config)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_the_config_checks_readiness_and_lets_drained_sessions_finish() -> None:
    config = haproxy_config([Node("a", "10.0.0.1", 8765), Node("b", "10.0.0.2", 8765)])
    assert "http-check send meth GET uri /readyz" in config
    assert "balance leastconn" in config
    assert "server a 10.0.0.1:8765 check" in config and "server b 10.0.0.2:8765 check" in config
    # marking a draining node down must not cut the sessions it is finishing
    assert "shutdown-sessions" not in config
    assert "timeout tunnel 1h" in config
