"""Authentication at the real server's handshake (in-process, tests/inproc.py; the
decisions themselves are unit-tested in tests/server/test_auth.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from server.app import ServerConfig
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
