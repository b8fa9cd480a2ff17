"""``quicksilver fleet config``: the balancer's HAProxy configuration, checked by HAProxy
itself (the fleet running, with real nodes, is tests/e2e/test_fleet.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from server.fleet import (
    MAX_NETNS_NODES,
    Fleet,
    FleetError,
    FleetOptions,
    Node,
    haproxy_config,
    make_links,
    netns_available,
    remove_leftover_links,
)
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


# -- the nodes in network namespaces (`fleet up --netns`) --


def netns_fleet(nodes: int = 2) -> Fleet:
    for tool in ("redis-server", "haproxy", "ip"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            missing(f"{tool} is not installed (apt-get install redis-server haproxy iproute2)")
    return Fleet(FleetOptions(nodes=nodes, port=0, namespaces=True))


def test_each_node_gets_a_namespace_joined_by_a_link_local_30(tmp_path: Path) -> None:
    links = make_links(3, subnet=7, fleet=12, pid=0x4ABCDE)
    assert [link.netns for link in links] == ["qs-4abcde-2-1", "qs-4abcde-2-2", "qs-4abcde-2-3"]
    assert [(link.host_address, link.ns_address) for link in links] == [
        ("169.254.7.1", "169.254.7.2"),
        ("169.254.7.5", "169.254.7.6"),
        ("169.254.7.9", "169.254.7.10"),
    ]
    last = make_links(MAX_NETNS_NODES, subnet=254, fleet=9, pid=0x400000)[-1]
    assert (last.host_address, last.ns_address) == ("169.254.254.249", "169.254.254.250")
    assert max(len(last.host_if), len(last.ns_if)) <= 15  # Linux's limit on a name
    with pytest.raises(FleetError):
        make_links(MAX_NETNS_NODES + 1, subnet=1, fleet=0)

    link = links[0]
    assert link.up_commands() == [
        ["ip", "netns", "add", "qs-4abcde-2-1"],
        ["ip", "link", "add", "qs-4abcde-2h1", "type", "veth", "peer", "name", "qs-4abcde-2n1"],
        ["ip", "link", "set", "qs-4abcde-2n1", "netns", "qs-4abcde-2-1"],
        ["ip", "addr", "add", "169.254.7.1/30", "dev", "qs-4abcde-2h1"],
        ["ip", "link", "set", "qs-4abcde-2h1", "up"],
        ["ip", "-n", "qs-4abcde-2-1", "addr", "add", "169.254.7.2/30", "dev", "qs-4abcde-2n1"],
        ["ip", "-n", "qs-4abcde-2-1", "link", "set", "qs-4abcde-2n1", "up"],
        ["ip", "-n", "qs-4abcde-2-1", "link", "set", "lo", "up"],
    ]  # and no route: only this end of the link reaches the node
    assert link.down_commands() == [
        ["ip", "link", "del", "qs-4abcde-2h1"],
        ["ip", "netns", "del", "qs-4abcde-2-1"],
    ]


def test_a_netns_fleet_runs_each_node_in_its_namespace_and_redis_on_the_links() -> None:
    fleet = netns_fleet()
    try:
        first, second = fleet.links
        assert first.host_address.startswith("169.254.")
        for node, link in zip(fleet.nodes, fleet.links, strict=True):
            argv = fleet.node_procs[node.name].argv
            assert argv[:4] == ["ip", "netns", "exec", link.netns]
            assert argv[4] == sys.executable
            assert argv[argv.index("--host") + 1] == node.host == link.ns_address
            password = fleet.redis_password
            store = f"redis://:{password}@{link.host_address}:{fleet.redis_port}/0"
            assert argv[argv.index("--store") + 1] == store
            assert "--insecure-no-auth" in argv  # the balancer's address is no loopback
        redis = fleet.redis.argv
        # on loopback and this end of each link only, with the fleet's own password
        bind = redis[redis.index("--bind") + 1 : redis.index("--requirepass")]
        assert bind == ["127.0.0.1", first.host_address, second.host_address]
        assert len(password) == 32 and redis[redis.index("--requirepass") + 1] == password
        assert "--protected-mode" not in redis
        other = netns_fleet()
        shutil.rmtree(other.run_dir)
        assert other.redis_password != password
        config = haproxy_config(fleet.nodes)
        for node in fleet.nodes:
            assert f"server {node.name} {node.host}:{node.port} check" in config
        assert fleet.url.startswith("ws://127.0.0.1:")  # the balancer stays here
    finally:
        shutil.rmtree(fleet.run_dir)


def test_a_loopback_fleet_has_no_namespaces() -> None:
    for tool in ("redis-server", "haproxy"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            missing(f"{tool} is not installed")
    fleet = Fleet(FleetOptions(nodes=2, port=0))
    try:
        assert fleet.links == []
        assert all(n.host == "127.0.0.1" for n in fleet.nodes)
        assert fleet.node_procs["node1"].argv[0] == sys.executable
        assert "--insecure-no-auth" not in fleet.node_procs["node1"].argv
        assert fleet.redis_password == "" and "--requirepass" not in fleet.redis.argv
        assert fleet.redis_url == f"redis://127.0.0.1:{fleet.redis_port}/0"
    finally:
        shutil.rmtree(fleet.run_dir)


def needs_netns() -> None:
    if not netns_available():
        missing("network namespaces need root and iproute2 (ip netns add)")


# Inside the namespace: listen on its end of the link, say who it is to one client,
# then wait to be signalled.
LISTENER = """
import os, socket, sys, time
with socket.create_server((sys.argv[1], 8765)) as server:
    print("listening", flush=True)
    conn, (peer, _) = server.accept()
    conn.sendall(f"{os.getpid()} {peer}".encode())
    conn.close()
    time.sleep(60)
"""


def test_a_link_carries_tcp_into_its_namespace_and_goes_with_the_fleet() -> None:
    needs_netns()
    fleet = netns_fleet(nodes=1)
    [link] = fleet.links
    try:
        fleet.make_links()
        argv = [*link.exec_prefix(), sys.executable, "-c", LISTENER, link.ns_address]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None and proc.stdout.readline() == "listening\n"
                with socket.create_connection((link.ns_address, 8765), timeout=5) as conn:
                    pid, peer = conn.recv(100).decode().split()
                # ip netns exec execs: the child is the command itself, signals reach it
                assert int(pid) == proc.pid
                exe = os.path.realpath(f"/proc/{proc.pid}/exe")
                assert exe == os.path.realpath(sys.executable)
                assert peer == link.host_address  # from this end of the link
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == -signal.SIGTERM
            finally:
                proc.kill()
    finally:
        fleet.delete_links()
        shutil.rmtree(fleet.run_dir)
    assert link.netns not in ip("netns", "list")
    assert link.host_if not in ip("-o", "link", "show")


def test_the_links_of_a_fleet_that_died_are_deleted_at_the_next_start() -> None:
    needs_netns()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    [link] = make_links(1, subnet=253, fleet=0, pid=int(dead.stdout))
    try:
        for argv in link.up_commands()[:2]:  # a namespace and a veth left half made
            subprocess.run(argv, check=True)
        assert link.netns in ip("netns", "list") and link.host_if in ip("-o", "link", "show")
        assert {link.netns, link.host_if} <= set(remove_leftover_links())
        assert link.netns not in ip("netns", "list")
        assert link.host_if not in ip("-o", "link", "show")
    finally:
        for argv in link.down_commands():
            subprocess.run(argv, capture_output=True)


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
