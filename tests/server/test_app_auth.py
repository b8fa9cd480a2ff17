"""Authentication at the real server's handshake (in-process, tests/inproc.py; the
decisions themselves are unit-tested in tests/server/test_auth.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.app import Limits, ServerConfig
from server.auth import AuthConfig, tls_context
from tests.inproc import serving, until

pytestmark = pytest.mark.models

KEY = "test-key-0123456789abcdef"
CONFIG = ServerConfig(auth=AuthConfig(api_keys=frozenset({KEY})))


async def refused(url: str, **kwargs: object) -> int:
    with pytest.raises(InvalidStatus) as err:
        await connect(url, **kwargs)  # type: ignore[arg-type]
    return err.value.response.status_code


def mint(base: str, key: str | None, ttl: int = 60) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"{base}/v1/token?ttl_s={ttl}", method="POST")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def answered(ws) -> None:  # type: ignore[no-untyped-def]
    await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
    assert (await until(ws, "ready"))["type"] == "ready"
    await ws.send(json.dumps({"type": "text", "text": "Hello?"}))
    assert (await asyncio.wait_for(until(ws, "reply_done"), 30))["text"]
    await ws.close()


async def test_with_keys_every_connection_presents_one() -> None:
    async with serving(config=CONFIG) as (url, app):
        assert await refused(url) == 401
        assert (
            await refused(url, additional_headers={"Authorization": "Bearer wrong-key-00000000"})
            == 401
        )
        await answered(await connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}))
        # a key never travels in a URL
        assert await refused(f"{url}?token={KEY}") == 401
        assert app.metrics.rejected.labels("missing_credentials")._value.get() == 1


async def test_a_minted_client_token_opens_one_session() -> None:
    async with serving(config=CONFIG) as (url, _):
        base = url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
        status, body = await asyncio.to_thread(mint, base, None)
        assert status == 401
        status, body = await asyncio.to_thread(mint, base, KEY)
        assert status == 200 and isinstance(body["token"], str)
        token = body["token"]
        await answered(await connect(f"{url}?token={token}"))
        assert await refused(f"{url}?token={token}") == 401  # single use
        # browsers pass it as a subprotocol; the server must pick one they offered
        _, again = await asyncio.to_thread(mint, base, KEY)
        ws = await connect(
            url, subprotocols=["quicksilver.v1", f"quicksilver.token.{again['token']}"]
        )  # type: ignore[list-item]
        assert ws.subprotocol == "quicksilver.v1"
        await answered(ws)


async def test_a_foreign_page_is_refused_and_the_own_page_is_not() -> None:
    async with serving() as (url, _):  # no keys: loopback only, origin still checked
        assert await refused(url, origin="https://evil.example") == 403
        host = url.split("//")[1].split("/")[0]
        await answered(await connect(url, origin=f"http://{host}"))  # type: ignore[arg-type]


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            *subject,
            *files,
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_serves_wss(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    config = ServerConfig(tls=tls_context(cert, key))
    async with serving(config=config) as (url, _):
        client = ssl.create_default_context(cafile=str(cert))
        await answered(await connect(url.replace("ws://", "wss://"), ssl=client))
        with pytest.raises(ssl.SSLError):  # a client that does not trust it gets nowhere
            await connect(url.replace("ws://", "wss://"), ssl=ssl.create_default_context())


# --- issue 40 ---------------------------------------------------------------------

OTHER = "other-key-0123456789abcdef"
TWO_KEYS = ServerConfig(auth=AuthConfig(api_keys=frozenset({KEY, OTHER})))


def http_base(url: str) -> str:
    return url.replace("ws://", "http://").rsplit("/v1/", 1)[0]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def start(url: str, key: str | None = None, **start: object) -> tuple[object, dict]:  # type: ignore[type-arg]
    ws = await connect(url, additional_headers=bearer(key) if key else {})
    await ws.send(json.dumps({"type": "start", "sample_rate": 16000, **start}))
    first = json.loads(await ws.recv())
    return ws, first


async def test_a_conversation_resumes_only_for_the_key_that_held_it() -> None:
    async with serving(config=TWO_KEYS) as (url, _):
        ws, ready = await start(url, KEY)
        await ws.send(json.dumps({"type": "text", "text": "My PIN is 4321."}))  # type: ignore[attr-defined]
        await asyncio.wait_for(until(ws, "reply_done"), 30)  # type: ignore[arg-type]
        await ws.close()  # type: ignore[attr-defined]
        await ws.wait_closed()  # type: ignore[attr-defined]
        resume = ready["resume_token"]
        thief, error = await start(url, OTHER, resume_token=resume)
        assert (error["type"], error["code"]) == ("error", "bad_resume_token")
        await thief.close()  # type: ignore[attr-defined]
        # the token is not used up: its owner resumes, with a client token it minted
        base = http_base(url)
        _, minted = await asyncio.to_thread(mint, base, KEY)
        owner, resumed = await start(f"{url}?token={minted['token']}", resume_token=resume)
        assert resumed["type"] == "ready" and resumed["resumed"] and resumed["history"] == 2
        await owner.close()  # type: ignore[attr-defined]


def get(base: str, path: str, host: str | None = None, **headers: str) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host or parts.netloc)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_status_routes_need_the_key_unless_metrics_no_auth() -> None:
    async with serving(config=CONFIG) as (url, _):
        base = http_base(url)
        for path in ("/healthz", "/readyz", "/stats", "/metrics"):
            status, body = await asyncio.to_thread(get, base, path)
            assert status == 401 and b"invalid_api_key" in body, (path, status)
            status, _ = await asyncio.to_thread(get, base, path, Authorization=f"Bearer {KEY}")
            assert status == 200, path
        assert (await asyncio.to_thread(get, base, "/"))[0] == 200  # the page is public
    open_metrics = ServerConfig(auth=AuthConfig(api_keys=frozenset({KEY}), metrics_no_auth=True))
    async with serving(config=open_metrics) as (url, _):
        for path in ("/healthz", "/readyz", "/stats", "/metrics"):
            assert (await asyncio.to_thread(get, http_base(url), path))[0] == 200


async def test_without_keys_a_rebinding_page_reads_no_route() -> None:
    async with serving() as (url, _):
        base = http_base(url)
        port = urllib.parse.urlsplit(base).port
        for path in ("/stats", "/healthz", "/metrics", "/", "/v1/token"):
            status, _ = await asyncio.to_thread(get, base, path, f"evil.example:{port}")
            assert status == 403, (path, status)
        assert (await asyncio.to_thread(get, base, "/stats"))[0] == 200
        assert (await asyncio.to_thread(get, base, "/healthz", f"localhost:{port}"))[0] == 200


async def test_a_token_is_not_spent_by_a_failed_upgrade_or_a_full_server() -> None:
    config = ServerConfig(
        auth=AuthConfig(api_keys=frozenset({KEY})), limits=replace(Limits(), max_sessions=1)
    )
    async with serving(config=config) as (url, app):
        base = http_base(url)
        _, minted = await asyncio.to_thread(mint, base, KEY)
        token = minted["token"]
        # a plain GET: no Upgrade headers
        status, _ = await asyncio.to_thread(get, base, f"/v1/voice?token={token}")
        assert status == 426
        # the server is full: the session is refused, the token stays unused
        first, _ = await start(url, KEY)
        full = await connect(f"{url}?token={token}")
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(full.recv(), 30)
        assert full.close_code == 1013
        (session,) = app.sessions
        await first.close()  # type: ignore[attr-defined]
        await asyncio.wait_for(session.closed.wait(), 30)
        await answered(await connect(f"{url}?token={token}"))
        assert await refused(f"{url}?token={token}") == 401  # now it is used


async def test_debug_logs_carry_no_credentials(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="websockets.server")
    async with serving(config=CONFIG) as (url, _):
        _, minted = await asyncio.to_thread(mint, http_base(url), KEY)
        token = minted["token"]
        ws = await connect(url, additional_headers=bearer(KEY))
        await ws.close()
        ws = await connect(url, subprotocols=["quicksilver.v1", f"quicksilver.token.{token}"])  # type: ignore[list-item]
        await ws.close()
        assert await refused(f"{url}?token={token}") == 401
        ws = await connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])  # type: ignore[list-item]
        await ws.close()
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "websockets.server")
    assert "Authorization: [redacted]" in logged and "token=[redacted]" in logged
    assert "quicksilver.token.[redacted]" in logged
    assert "openai-insecure-api-key.[redacted]" in logged
    assert KEY not in logged and token not in logged and token.split(".")[2] not in logged
