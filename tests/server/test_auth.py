"""server/auth.py without sockets: keys, the bind check, client tokens and their ledger,
every credential source, the Origin check, the mint endpoints and ``quicksilver token``.
Time is passed in, so expiry is tested exactly, without sleeping."""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import logging
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from websockets.datastructures import Headers
from websockets.headers import parse_subprotocol

from server import auth
from server.auth import (
    Accepted,
    AuthConfig,
    Authenticator,
    AuthError,
    Rejected,
    TokenError,
    TokenLedger,
)

KEY = "k" * 8 + "-test-key-0001"  # 22 characters
OTHER_KEY = "another-test-key-0002"
NOW = 1_800_000_000.0  # unix seconds
SECRET = auth.derive_secret(KEY)
HOST = "127.0.0.1:8765"


def keyed(**kwargs: object) -> Authenticator:
    return Authenticator(AuthConfig(api_keys=frozenset({KEY}), **kwargs))  # type: ignore[arg-type]


def connect(
    authenticator: Authenticator,
    path: str = "/v1/voice",
    remote: str = "127.0.0.1",
    now: float = NOW,
    scope: str = "voice",
    **headers: str,
) -> auth.Decision:
    pairs = [("Host", HOST), *((k.replace("_", "-"), v) for k, v in headers.items())]
    return authenticator.authenticate(path, pairs, remote, now, scope)


def token(ttl: float = 60.0, secret: bytes = SECRET, **kwargs: object) -> str:
    value, _ = auth.mint_client_token(secret, NOW, ttl, **kwargs)  # type: ignore[arg-type]
    return value


def rejected(decision: auth.Decision, status: int, error: str) -> Rejected:
    assert isinstance(decision, Rejected), decision
    assert (decision.status, decision.error) == (status, error), decision
    return decision


# --- keys -------------------------------------------------------------------------


def test_keys_come_from_the_environment_comma_separated() -> None:
    env = {auth.ENV_VAR: f" {KEY} ,, {OTHER_KEY},"}
    assert auth.load_api_keys(env, None) == {KEY, OTHER_KEY}
    assert auth.load_api_keys({}, None) == frozenset()


def test_keys_come_from_a_file_with_comments_and_blank_lines(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(f"# production keys\n\n{KEY}\n  {OTHER_KEY}  # the kiosk\n   \n")
    assert auth.load_api_keys({}, file) == {KEY, OTHER_KEY}
    third = "third-key-from-env-0003"
    assert auth.load_api_keys({auth.ENV_VAR: third}, file) == {KEY, OTHER_KEY, third}


def test_a_missing_or_unreadable_key_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="does not exist"):
        auth.load_api_keys({}, tmp_path / "nope")
    with pytest.raises(AuthError, match="cannot read API key file"):
        auth.load_api_keys({}, tmp_path)  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(AuthError, match="cannot read API key file"):
        auth.load_api_keys({}, binary)


def test_short_keys_are_refused_without_echoing_them(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="at least 16") as caught:
        auth.load_api_keys({auth.ENV_VAR: f"{KEY},hunter2"}, None)
    assert "hunter2" not in str(caught.value)
    file = tmp_path / "keys"
    file.write_text("tooshort\n")
    with pytest.raises(AuthError, match="at least 16"):
        auth.load_api_keys({}, file)
    assert auth.load_api_keys({auth.ENV_VAR: "x" * 16}, None) == {"x" * 16}


def test_keys_with_spaces_or_non_ascii_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text("a key with spaces in it\n")
    with pytest.raises(AuthError, match="one word"):
        auth.load_api_keys({}, file)
    with pytest.raises(AuthError, match="one word"):
        auth.load_api_keys({auth.ENV_VAR: "clé-très-secrète-0001"}, None)


def test_api_keys_compare_whole() -> None:
    keys = frozenset({KEY, OTHER_KEY})
    assert auth.match_api_key(keys, KEY) == KEY
    assert auth.match_api_key(keys, OTHER_KEY) == OTHER_KEY
    for wrong in (KEY[:-1], KEY + "x", KEY.upper(), "", "\udcff"):
        assert auth.match_api_key(keys, wrong) is None


def test_a_key_id_names_a_key_without_revealing_it() -> None:
    assert auth.key_id(KEY) == auth.key_id(KEY) != auth.key_id(OTHER_KEY)
    assert KEY not in auth.key_id(KEY) and len(auth.key_id(KEY)) == 10


# --- binding ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "[::1]", "localhost", "LOCALHOST"]
)
def test_loopback_addresses_bind_without_keys(host: str) -> None:
    assert auth.check_bind(host, AuthConfig()) is None


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "", "::", "192.168.1.20", "10.0.0.7", "example.com", "fe80::1"]
)
def test_other_addresses_refuse_to_start_without_keys(host: str) -> None:
    message = auth.check_bind(host, AuthConfig())
    assert message is not None and "\n" not in message
    assert "--insecure-no-auth" in message and auth.ENV_VAR in message
    assert auth.check_bind(host, AuthConfig(insecure_no_auth=True)) is None
    assert auth.check_bind(host, AuthConfig(api_keys=frozenset({KEY}))) is None


def test_loopback_recognises_mapped_and_zoned_forms() -> None:
    assert auth.is_loopback("::ffff:127.0.0.1")
    assert auth.is_loopback("::1%lo")
    assert not auth.is_loopback("::ffff:192.168.1.2")
    assert not auth.is_loopback("localhost.example.com")
    assert not auth.is_loopback("128.0.0.1")


# --- client tokens ----------------------------------------------------------------


def test_a_token_round_trips_its_claims() -> None:
    value, expires_at = auth.mint_client_token(
        SECRET, NOW + 0.7, 600, scope="realtime", label="kiosk-3", token_id="abc123"
    )
    assert expires_at == int(NOW + 600.7)
    claims = auth.verify_client_token(value, [SECRET], NOW + 1)
    assert claims == auth.ClientToken("abc123", int(NOW), expires_at, "realtime", "kiosk-3")


def test_a_token_is_qs1_payload_signature_in_url_and_header_safe_characters() -> None:
    value = token(label="lobby screen")
    prefix, payload, signature = value.split(".")
    assert prefix == "qs1" and len(signature) == 43  # 32 bytes of HMAC-SHA256, unpadded
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert set(claims) == {"jti", "iat", "exp", "scope", "label"}
    # a valid subprotocol token (RFC 6455 4.1: an HTTP token), as browsers require
    offered = f"{auth.SUBPROTOCOL}, {auth.TOKEN_SUBPROTOCOL_PREFIX}{value}"
    assert parse_subprotocol(offered) == [auth.SUBPROTOCOL, auth.TOKEN_SUBPROTOCOL_PREFIX + value]


def test_each_token_has_its_own_id() -> None:
    ids = {auth.verify_client_token(token(), [SECRET], NOW).id for _ in range(50)}
    assert len(ids) == 50


def test_a_token_expires_exactly_at_its_expiry() -> None:
    value, expires_at = auth.mint_client_token(SECRET, NOW, 60)
    assert auth.verify_client_token(value, [SECRET], expires_at - 0.001)
    with pytest.raises(TokenError) as caught:
        auth.verify_client_token(value, [SECRET], expires_at)
    assert caught.value.code == "token_expired"


def flip(text: str, index: int) -> str:
    """Another base64url character at ``index``."""
    return text[:index] + ("A" if text[index] != "A" else "B") + text[index + 1 :]


@pytest.mark.parametrize("part", [1, 2])
@pytest.mark.parametrize("where", [0, 7, -1])
def test_a_tampered_token_is_refused(part: int, where: int) -> None:
    pieces = token().split(".")
    pieces[part] = flip(pieces[part], where % len(pieces[part]))
    with pytest.raises(TokenError) as caught:
        auth.verify_client_token(".".join(pieces), [SECRET], NOW)
    assert caught.value.code == "invalid_credentials"


def test_a_token_with_a_longer_expiry_forged_in_is_refused() -> None:
    prefix, payload, signature = token().split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["exp"] += 10**6
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="not signed"):
        auth.verify_client_token(f"{prefix}.{forged}.{signature}", [SECRET], NOW)


def test_a_token_signed_with_another_secret_is_refused() -> None:
    foreign = token(secret=auth.derive_secret(OTHER_KEY))
    with pytest.raises(TokenError, match="not signed"):
        auth.verify_client_token(foreign, [SECRET], NOW)
    # any of the configured secrets will do (two keys while one is rotated out)
    assert auth.verify_client_token(foreign, [SECRET, auth.derive_secret(OTHER_KEY)], NOW)


@pytest.mark.parametrize(
    "text", ["", "qs1", "qs1..", "qs2.abc." + "A" * 43, "qs1.abc.def", "qs1.a b." + "A" * 43]
)
def test_malformed_tokens_are_refused(text: str) -> None:
    with pytest.raises(TokenError) as caught:
        auth.verify_client_token(text, [SECRET], NOW)
    assert caught.value.code == "invalid_credentials"


def test_a_valid_token_with_anything_around_it_is_refused() -> None:
    value = token()
    for text in (value + "\n", " " + value, value + ".", "x" + value):
        with pytest.raises(TokenError):
            auth.verify_client_token(text, [SECRET], NOW)


def signed(payload: bytes, secret: bytes = SECRET) -> str:
    """A token around any payload, signed as the server signs (RFC 2104 HMAC-SHA256)."""
    body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    mac = hmac.new(secret, f"qs1.{body}".encode(), hashlib.sha256).digest()
    return f"qs1.{body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b"not json",
        b"\xff\xfe",
        b"[" * 100_000,
        b'{"jti": "a", "iat": 1, "exp": "soon"}',
        b'{"jti": "", "iat": 1, "exp": 2000000000}',
        b'{"jti": "a", "iat": true, "exp": 2000000000}',
        b'{"jti": "a", "iat": 1799999990, "exp": 1800000100, "scope": "admin"}',
        b'{"jti": "a", "iat": 1799999990, "exp": 1800000100, "label": 7}',
    ],
)
def test_a_signed_but_malformed_payload_is_refused(payload: bytes) -> None:
    assert auth.verify_client_token(
        signed(b'{"jti": "a", "iat": 1799999990, "exp": 1800000100}'), [SECRET], NOW
    )
    with pytest.raises(TokenError) as caught:
        auth.verify_client_token(signed(payload), [SECRET], NOW)
    assert caught.value.code == "invalid_credentials"


def test_a_token_living_longer_than_the_maximum_is_refused() -> None:
    long_lived = token(ttl=auth.MAX_TOKEN_TTL_S + 60)
    with pytest.raises(TokenError, match="longer than allowed"):
        auth.verify_client_token(long_lived, [SECRET], NOW)
    assert auth.verify_client_token(token(ttl=auth.MAX_TOKEN_TTL_S), [SECRET], NOW)


def test_minting_refuses_a_bad_scope_or_lifetime() -> None:
    with pytest.raises(ValueError, match="scope"):
        auth.mint_client_token(SECRET, NOW, 60, scope="admin")
    for ttl in (0, 0.5, -5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="at least"):
            auth.mint_client_token(SECRET, NOW, ttl)


# --- the ledger -------------------------------------------------------------------


def claims(token_id: str, expires_at: float) -> auth.ClientToken:
    return auth.ClientToken(token_id, int(NOW), int(expires_at))


def test_the_ledger_lets_each_token_in_once() -> None:
    ledger = TokenLedger()
    assert ledger.claim(claims("a", NOW + 60), NOW) == "ok"
    assert ledger.claim(claims("a", NOW + 60), NOW + 30) == "reused"
    assert ledger.claim(claims("b", NOW + 60), NOW + 30) == "ok"
    assert len(ledger) == 2


def test_the_ledger_forgets_ids_once_their_tokens_expired() -> None:
    ledger = TokenLedger()
    for i in range(100):
        ledger.claim(claims(f"t{i}", NOW + 10 + i), NOW)
    ledger.claim(claims("late", NOW + 1000), NOW + 59.5)
    assert len(ledger) == 100 - 50 + 1  # t0..t49 expired at NOW+10..NOW+59
    ledger.claim(claims("later", NOW + 2000), NOW + 1000)
    assert len(ledger) == 1


def test_a_full_ledger_refuses_rather_than_forgets() -> None:
    ledger = TokenLedger(max_entries=2)
    assert ledger.claim(claims("a", NOW + 10), NOW) == "ok"
    assert ledger.claim(claims("b", NOW + 20), NOW) == "ok"
    assert ledger.claim(claims("c", NOW + 20), NOW) == "full"
    assert ledger.claim(claims("a", NOW + 10), NOW) == "reused"  # still remembered
    assert ledger.claim(claims("c", NOW + 20), NOW + 10) == "ok"  # "a" expired: room again


# --- credential sources -----------------------------------------------------------


def test_an_api_key_in_the_authorization_header_is_accepted() -> None:
    decision = connect(keyed(), Authorization=f"Bearer {KEY}")
    assert decision == Accepted("api_key", key_id=auth.key_id(KEY), owner=auth.owner_of(KEY))
    assert connect(keyed(), Authorization=f"bearer   {KEY}  ") == decision
    assert KEY not in decision.describe()


def test_a_client_token_in_each_source_is_accepted() -> None:
    auth_ = keyed()
    by_header = connect(auth_, Authorization=f"Bearer {token()}")
    by_query = connect(auth_, path=f"/v1/voice?client=web&token={token()}")
    offered = f"{auth.SUBPROTOCOL}, {auth.TOKEN_SUBPROTOCOL_PREFIX}{token()}"
    by_subprotocol = connect(auth_, Sec_WebSocket_Protocol=offered)
    for decision in (by_header, by_query, by_subprotocol):
        assert isinstance(decision, Accepted) and decision.who == "client_token"
        assert decision.token is not None and decision.token.scope == "voice"


def test_the_accepted_token_names_itself_in_the_log_line_not_its_value() -> None:
    value = token(label="kiosk-3")
    decision = connect(keyed(), Authorization=f"Bearer {value}")
    assert isinstance(decision, Accepted) and decision.token is not None
    assert decision.describe() == f"client_token {decision.token.id} (kiosk-3)"
    assert value not in decision.describe()


def test_no_credential_is_a_401_that_says_how_to_present_one() -> None:
    refusal = rejected(connect(keyed()), 401, "missing_credentials")
    reply = refusal.reply()
    assert reply.body == {"error": "missing_credentials", "message": refusal.message}
    assert ("WWW-Authenticate", 'Bearer realm="quicksilver"') in reply.headers
    assert "Bearer" in refusal.message and "token" in refusal.message
    assert json.loads(reply.text()) == reply.body
    rejected(connect(keyed(), path="/v1/voice?token="), 401, "missing_credentials")
    rejected(connect(keyed(), Authorization="Basic dXNlcjpwYXNz"), 401, "missing_credentials")


@pytest.mark.parametrize("wrong", [KEY[:-1], OTHER_KEY, "x" * 40, "qs1.not.a-token"])
def test_a_wrong_key_or_token_is_a_401(wrong: str) -> None:
    rejected(connect(keyed(), Authorization=f"Bearer {wrong}"), 401, "invalid_credentials")
    rejected(connect(keyed(), path=f"/v1/voice?token={wrong}"), 401, "invalid_credentials")


def test_the_authorization_header_comes_first() -> None:
    good = token()
    rejected(
        connect(keyed(), path=f"/v1/voice?token={good}", Authorization="Bearer wrong-wrong-wrong"),
        401,
        "invalid_credentials",
    )
    decision = connect(keyed(), path="/v1/voice?token=garbage", Authorization=f"Bearer {KEY}")
    assert isinstance(decision, Accepted) and decision.who == "api_key"


def test_the_query_parameter_comes_before_the_subprotocol() -> None:
    offered = f"{auth.TOKEN_SUBPROTOCOL_PREFIX}{token()}"
    rejected(
        connect(keyed(), path="/v1/voice?token=garbage", Sec_WebSocket_Protocol=offered),
        401,
        "invalid_credentials",
    )


def test_an_api_key_in_a_url_or_subprotocol_is_refused() -> None:
    refusal = rejected(connect(keyed(), path=f"/v1/voice?token={KEY}"), 401, "key_in_url")
    assert KEY not in refusal.message
    offered = f"{auth.TOKEN_SUBPROTOCOL_PREFIX}{KEY}"
    rejected(connect(keyed(), Sec_WebSocket_Protocol=offered), 401, "key_in_url")


def test_an_expired_token_is_a_401() -> None:
    value, expires_at = auth.mint_client_token(SECRET, NOW, 60)
    rejected(
        connect(keyed(), now=expires_at, Authorization=f"Bearer {value}"), 401, "token_expired"
    )


def test_a_token_opens_one_session() -> None:
    authenticator, value = keyed(), token()
    assert isinstance(connect(authenticator, Authorization=f"Bearer {value}"), Accepted)
    again = connect(authenticator, now=NOW + 1, path=f"/v1/voice?token={value}")
    rejected(again, 401, "token_reused")


def test_a_token_for_another_endpoint_is_refused_and_not_used_up() -> None:
    authenticator, value = keyed(), token(scope="realtime")
    rejected(connect(authenticator, Authorization=f"Bearer {value}"), 401, "wrong_scope")
    decision = connect(authenticator, scope="realtime", Authorization=f"Bearer {value}")
    assert isinstance(decision, Accepted) and decision.who == "client_token"


def test_a_full_ledger_is_a_503() -> None:
    authenticator = Authenticator(AuthConfig(api_keys=frozenset({KEY})), TokenLedger(1))
    assert isinstance(connect(authenticator, Authorization=f"Bearer {token()}"), Accepted)
    rejected(connect(authenticator, Authorization=f"Bearer {token()}"), 503, "busy")


def test_tokens_minted_with_any_configured_key_are_accepted() -> None:
    both = Authenticator(AuthConfig(api_keys=frozenset({KEY, OTHER_KEY})))
    other = token(secret=auth.derive_secret(OTHER_KEY))
    assert isinstance(connect(both, Authorization=f"Bearer {other}"), Accepted)
    revoked = connect(
        keyed(), Authorization=f"Bearer {token(secret=auth.derive_secret(OTHER_KEY))}"
    )
    rejected(revoked, 401, "invalid_credentials")


def test_headers_may_be_websockets_headers_with_repeated_names() -> None:
    headers = Headers()
    headers["Host"] = HOST
    headers["Sec-WebSocket-Protocol"] = auth.SUBPROTOCOL
    headers["sec-websocket-protocol"] = auth.TOKEN_SUBPROTOCOL_PREFIX + token()
    decision = keyed().authenticate("/v1/voice", headers.raw_items(), "127.0.0.1", NOW)
    assert isinstance(decision, Accepted) and decision.who == "client_token"
    assert auth.subprotocols(headers.raw_items()) == [
        auth.SUBPROTOCOL,
        headers.get_all("Sec-WebSocket-Protocol")[1],
    ]
    # a plain dict works too, names in any case
    plain = {"host": HOST, "authorization": f"Bearer {KEY}"}
    assert isinstance(keyed().authenticate("/v1/voice", plain, "127.0.0.1", NOW), Accepted)


def test_the_server_selects_a_subprotocol_the_browser_offered() -> None:
    entry = auth.TOKEN_SUBPROTOCOL_PREFIX + token()
    assert auth.select_subprotocol([entry, auth.SUBPROTOCOL]) == auth.SUBPROTOCOL
    assert auth.select_subprotocol([entry]) == entry
    assert auth.select_subprotocol(["chat"]) is None
    assert auth.select_subprotocol([]) is None


# --- origins ----------------------------------------------------------------------


def test_a_client_without_origin_passes_the_origin_check() -> None:
    assert isinstance(connect(keyed(), Authorization=f"Bearer {KEY}"), Accepted)


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8765", "https://127.0.0.1:8765"])
def test_the_servers_own_origin_is_allowed(origin: str) -> None:
    decision = connect(keyed(), Origin=origin, Authorization=f"Bearer {KEY}")
    assert isinstance(decision, Accepted)


@pytest.mark.parametrize(
    "origin",
    ["https://evil.example", "http://127.0.0.1:9999", "http://127.0.0.1", "null", "garbage"],
)
def test_another_origin_is_forbidden_even_with_a_valid_key(origin: str) -> None:
    decision = connect(keyed(), Origin=origin, Authorization=f"Bearer {KEY}")
    assert rejected(decision, 403, "forbidden_origin").reply().headers == ()


def test_allow_listed_origins_are_allowed_in_the_form_browsers_send() -> None:
    authenticator = keyed(allowed_origins=("https://App.Example.com:443/", "http://kiosk:8080"))
    for origin in ("https://app.example.com", "http://kiosk:8080"):
        decision = connect(authenticator, Origin=origin, Authorization=f"Bearer {KEY}")
        assert isinstance(decision, Accepted), origin
    rejected(
        connect(authenticator, Origin="http://app.example.com", Authorization=f"Bearer {KEY}"),
        403,
        "forbidden_origin",
    )


def test_own_origin_follows_the_host_header() -> None:
    assert auth.own_origins("voice.example.com") == {
        "http://voice.example.com",
        "https://voice.example.com",
    }
    assert auth.own_origins("[::1]:8765") == {"http://[::1]:8765", "https://[::1]:8765"}
    assert auth.own_origins(None) == frozenset()
    assert auth.own_origins("bad host/") == frozenset()


@pytest.mark.parametrize(
    ("text", "origin"),
    [
        ("https://Example.COM", "https://example.com"),
        ("https://example.com:443", "https://example.com"),
        ("http://example.com:80/", "http://example.com"),
        ("http://example.com:8080", "http://example.com:8080"),
        ("http://[::1]:8765", "http://[::1]:8765"),
    ],
)
def test_origins_are_normalized(text: str, origin: str) -> None:
    assert auth.normalize_origin(text) == origin


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "https://example.com/page",
        "https://u:p@example.com",
        "https://x:99999",
        "https://bad host",
        "https://a.example?x=1",
        "",
    ],
)
def test_bad_origins_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        auth.normalize_origin(text)
    with pytest.raises(argparse.ArgumentTypeError):
        auth.origin_arg(text)


# --- without keys -----------------------------------------------------------------


def test_without_keys_loopback_clients_connect_with_no_credential() -> None:
    open_ = Authenticator(AuthConfig())
    assert connect(open_) == Accepted("loopback-open")
    assert connect(open_, remote="::1", Origin="http://127.0.0.1:8765") == Accepted("loopback-open")
    assert connect(open_).describe() == "loopback-open"  # type: ignore[union-attr]


def test_without_keys_other_machines_are_refused() -> None:
    rejected(connect(Authenticator(AuthConfig()), remote="192.168.1.5"), 403, "loopback_only")


def test_without_keys_a_rebound_host_name_is_refused() -> None:
    """DNS rebinding: a page re-points its own name at 127.0.0.1, so its Origin matches
    its Host; the Host is not a loopback name."""
    open_ = Authenticator(AuthConfig())
    decision = open_.authenticate(
        "/v1/voice",
        [("Host", "evil.example:8765"), ("Origin", "http://evil.example:8765")],
        "127.0.0.1",
        NOW,
    )
    rejected(decision, 403, "forbidden_host")
    rejected(open_.authenticate("/v1/voice", [], "127.0.0.1", NOW), 403, "forbidden_host")


def test_without_keys_other_pages_still_cannot_drive_the_server() -> None:
    decision = connect(Authenticator(AuthConfig()), Origin="https://evil.example")
    rejected(decision, 403, "forbidden_origin")


def test_insecure_no_auth_lets_anyone_in() -> None:
    open_ = Authenticator(AuthConfig(insecure_no_auth=True))
    decision = open_.authenticate("/v1/voice", [("Host", "10.0.0.2:8765")], "10.0.0.9", NOW)
    assert decision == Accepted("insecure-open")


def test_keys_win_over_insecure_no_auth() -> None:
    rejected(connect(keyed(insecure_no_auth=True)), 401, "missing_credentials")


# --- config -----------------------------------------------------------------------


def test_the_config_checks_its_lifetimes() -> None:
    with pytest.raises(AuthError, match="--token-ttl"):
        AuthConfig(client_token_ttl_s=auth.MAX_TOKEN_TTL_S + 1)
    with pytest.raises(AuthError, match="--token-ttl"):
        AuthConfig(client_token_ttl_s=0)
    assert not AuthConfig().enabled and AuthConfig(api_keys=frozenset({KEY})).enabled


def test_the_config_normalizes_its_origins() -> None:
    assert AuthConfig(allowed_origins=("HTTPS://a.example:443",)).allowed_origins == (
        "https://a.example",
    )
    with pytest.raises(ValueError):
        AuthConfig(allowed_origins=("a.example",))


# --- the mint endpoints -----------------------------------------------------------

CONFIG = AuthConfig(api_keys=frozenset({KEY}))
BEARER = {"Authorization": f"Bearer {KEY}"}


def mint(
    body: bytes = b"",
    path: str = auth.TOKEN_PATH,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    config: AuthConfig = CONFIG,
) -> auth.HttpReply:
    return auth.mint_response(
        config, method, path, BEARER if headers is None else headers, body, NOW
    )


def test_the_token_endpoint_mints_a_token_that_opens_a_session() -> None:
    reply = mint(b'{"ttl_s": 120, "label": "lobby"}')
    assert reply.status == 200 and set(reply.body) == {"token", "expires_at"}
    assert reply.body["expires_at"] == int(NOW + 120)
    assert ("Cache-Control", "no-store") in reply.headers
    decision = connect(Authenticator(CONFIG), Authorization=f"Bearer {reply.body['token']}")
    assert isinstance(decision, Accepted) and decision.token is not None
    assert decision.token.label == "lobby" and decision.token.expires_at == int(NOW + 120)


def test_the_token_endpoint_defaults_to_the_configured_lifetime() -> None:
    config = AuthConfig(api_keys=frozenset({KEY}), client_token_ttl_s=90)
    assert mint(config=config).body["expires_at"] == int(NOW + 90)
    assert mint(b"  \n").body["expires_at"] == int(NOW + auth.DEFAULT_TOKEN_TTL_S)


def test_the_lifetime_may_come_in_the_query_for_servers_that_cannot_read_a_body() -> None:
    assert mint(path=f"{auth.TOKEN_PATH}?ttl_s=30").body["expires_at"] == int(NOW + 30)
    assert mint(b'{"ttl_s": 45}', path=f"{auth.TOKEN_PATH}?ttl_s=30").body["expires_at"] == int(
        NOW + 45
    )
    assert mint(path=f"{auth.TOKEN_PATH}?ttl_s=soon").status == 400


def test_the_lifetime_is_clamped_to_the_maximum() -> None:
    reply = mint(b'{"ttl_s": 86400}')
    assert reply.status == 200
    assert reply.body["expires_at"] == int(NOW + auth.MAX_TOKEN_TTL_S)


@pytest.mark.parametrize("ttl", ["0", "-5", "0.5", '"60"', "true", "null", "1e999", "[60]"])
def test_a_bad_lifetime_is_a_400(ttl: str) -> None:
    reply = mint(f'{{"ttl_s": {ttl}}}'.encode())
    if ttl == "null":  # JSON null: no lifetime asked for, the default
        assert reply.status == 200
        return
    assert (reply.status, reply.body["error"]) == (400, "bad_ttl")


@pytest.mark.parametrize("body", [b"{", b"not json", b"\xff", b"[1, 2]", b'"text"', b"[" * 50_000])
def test_a_body_that_is_no_json_object_is_a_400(body: bytes) -> None:
    reply = mint(body)
    assert (reply.status, reply.body["error"]) == (400, "bad_json")


def test_unknown_fields_and_bad_labels_are_a_400() -> None:
    assert mint(b'{"ttl": 60}').body == {
        "error": "bad_request",
        "message": "unknown field(s): ttl",
    }
    assert mint(b'{"label": "x\\n"}').status == 400
    assert mint(json.dumps({"label": "x" * 65}).encode()).status == 400


def test_a_huge_body_is_a_413() -> None:
    reply = mint(b" " * (auth.MAX_MINT_BODY_BYTES + 1))
    assert (reply.status, reply.body["error"]) == (413, "too_large")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key-wrong-key"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
    ],
)
def test_minting_without_a_valid_key_is_a_401(headers: dict[str, str]) -> None:
    reply = mint(headers=headers)
    assert (reply.status, reply.body["error"]) == (401, "invalid_api_key")
    assert ("WWW-Authenticate", 'Bearer realm="quicksilver"') in reply.headers


def test_a_client_token_cannot_mint_more() -> None:
    reply = mint(headers={"Authorization": f"Bearer {token()}"})
    assert reply.status == 401


def test_minting_needs_post_and_a_mint_path_and_keys() -> None:
    wrong_method = mint(method="GET")
    assert wrong_method.status == 405 and ("Allow", "POST") in wrong_method.headers
    assert mint(path="/v1/tokens").status == 404
    no_keys = mint(config=AuthConfig())
    assert (no_keys.status, no_keys.body["error"]) == (404, "tokens_disabled")


def test_client_secrets_answer_in_openais_shape() -> None:
    session = {"type": "realtime", "model": "quicksilver", "instructions": "Be brief."}
    body = json.dumps(
        {"expires_after": {"anchor": "created_at", "seconds": 300}, "session": session}
    )
    reply = mint(body.encode(), path=auth.CLIENT_SECRETS_PATH)
    assert reply.status == 200 and set(reply.body) == {"value", "expires_at", "session"}
    assert reply.body["expires_at"] == int(NOW + 300) and reply.body["session"] == session
    claims = auth.verify_client_token(reply.body["value"], [SECRET], NOW)
    assert claims.scope == "realtime"
    voice = connect(Authenticator(CONFIG), Authorization=f"Bearer {reply.body['value']}")
    rejected(voice, 401, "wrong_scope")


def test_client_secrets_default_to_a_realtime_session() -> None:
    reply = mint(b"{}", path=auth.CLIENT_SECRETS_PATH)
    assert reply.body["session"] == {"type": "realtime"}
    assert reply.body["expires_at"] == int(NOW + auth.DEFAULT_TOKEN_TTL_S)
    clamped = mint(b'{"expires_after": {"seconds": 7200}}', path=auth.CLIENT_SECRETS_PATH)
    assert clamped.body["expires_at"] == int(NOW + auth.MAX_TOKEN_TTL_S)


@pytest.mark.parametrize(
    "body",
    [
        b'{"session": "realtime"}',
        b'{"expires_after": 60}',
        b'{"expires_after": {"anchor": "now", "seconds": 60}}',
        b'{"expires_after": {"seconds": -1}}',
        b'{"ttl_s": 60}',
    ],
)
def test_bad_client_secret_requests_are_a_400(body: bytes) -> None:
    assert mint(body, path=auth.CLIENT_SECRETS_PATH).status == 400


# --- command line -----------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quicksilver")
    sub = parser.add_subparsers(dest="command", required=True)
    auth.register(sub)
    serve = sub.add_parser("serve")
    auth.add_serve_arguments(serve)
    return parser.parse_args(argv)


def test_quicksilver_token_prints_a_token_the_server_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(auth.ENV_VAR, f"{KEY},{OTHER_KEY}")
    args = parse("token", "--ttl", "90", "--label", "kiosk")
    assert args.run(args) == 0
    out, err = capsys.readouterr()
    value = out.strip()
    assert "\n" not in value and "expires at" in err and "in 90 s" in err
    server = Authenticator(AuthConfig(api_keys=frozenset({KEY, OTHER_KEY})))
    # minted at the real time, so checked at the real time
    decision = server.authenticate(f"/v1/voice?token={value}", [("Host", HOST)], "::1", time.time())
    assert isinstance(decision, Accepted) and decision.token is not None
    assert decision.token.label == "kiosk"
    assert decision.token.expires_at - decision.token.issued_at in (90, 91)


def test_quicksilver_token_reads_a_key_file_and_clamps_the_lifetime(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv(auth.ENV_VAR, raising=False)
    file = tmp_path / "keys"
    file.write_text(f"{KEY}\n")
    args = parse("token", "--api-key-file", str(file), "--ttl", "99999", "--scope", "realtime")
    assert args.run(args) == 0
    value = capsys.readouterr().out.strip()
    payload = value.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["scope"] == "realtime"
    assert claims["exp"] - claims["iat"] in (auth.MAX_TOKEN_TTL_S, auth.MAX_TOKEN_TTL_S + 1)
    assert auth.verify_client_token(value, [SECRET], claims["iat"]).scope == "realtime"


def test_quicksilver_token_without_keys_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(auth.ENV_VAR, raising=False)
    args = parse("token")
    assert args.run(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and auth.ENV_VAR in err


@pytest.mark.parametrize(
    ("env", "argv"),
    [("short", ["token"]), (KEY, ["token", "--ttl", "0"]), (KEY, ["token", "--label", "é"])],
)
def test_quicksilver_token_refuses_bad_input_with_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: str,
    argv: list[str],
) -> None:
    monkeypatch.setenv(auth.ENV_VAR, env)
    args = parse(*argv)
    assert args.run(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("quicksilver: ") and err.count("\n") == 1


def test_the_serve_flags_build_the_config(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(f"{KEY}\n")
    args = parse(
        "serve",
        "--api-key-file",
        str(file),
        "--allow-origin",
        "https://app.example.com",
        "--allow-origin",
        "HTTP://Kiosk:8080",
        "--token-ttl",
        "120",
        "--insecure-no-auth",
        "--metrics-no-auth",
    )
    config = auth.config_from_args(args, {auth.ENV_VAR: OTHER_KEY})
    assert config == AuthConfig(
        api_keys=frozenset({KEY, OTHER_KEY}),
        insecure_no_auth=True,
        allowed_origins=("https://app.example.com", "http://kiosk:8080"),
        client_token_ttl_s=120,
        metrics_no_auth=True,
    )
    defaults = auth.config_from_args(parse("serve"), {})
    assert defaults == AuthConfig()
    assert (parse("serve").tls_cert, parse("serve").tls_key) == (None, None)


def test_a_bad_allow_origin_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("serve", "--allow-origin", "example.com")
    assert caught.value.code == 2
    assert "scheme://host" in capsys.readouterr().err


# --- TLS --------------------------------------------------------------------------


def test_tls_needs_both_files(tmp_path: Path) -> None:
    assert auth.tls_context(None, None) is None
    with pytest.raises(AuthError, match="go together"):
        auth.tls_context(tmp_path / "cert.pem", None)
    with pytest.raises(AuthError, match="go together"):
        auth.tls_context(None, tmp_path / "key.pem")
    with pytest.raises(AuthError, match="cannot load TLS"):
        auth.tls_context(tmp_path / "cert.pem", tmp_path / "key.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(AuthError, match="cannot load TLS"):
        auth.tls_context(garbage, garbage)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_loads_a_certificate_and_key(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = auth.tls_context(cert, key)
    assert isinstance(context, ssl.SSLContext) and context.protocol == ssl.PROTOCOL_TLS_SERVER


# --- OpenAI's browser form and client secrets' sessions -----------------------------


def openai_browser(credential: str) -> str:
    return f"{auth.REALTIME_SUBPROTOCOL}, {auth.OPENAI_KEY_SUBPROTOCOL_PREFIX}{credential}"


def test_openais_subprotocol_carries_a_client_secret_or_a_key() -> None:
    server = keyed()
    secret = token(scope="realtime")
    decision = connect(
        server, "/v1/realtime", scope="realtime", Sec_WebSocket_Protocol=openai_browser(secret)
    )
    assert isinstance(decision, Accepted) and decision.who == "client_token"
    decision = connect(
        server, "/v1/realtime", scope="realtime", Sec_WebSocket_Protocol=openai_browser(KEY)
    )
    assert isinstance(decision, Accepted) and decision.who == "api_key"
    wrong = connect(
        server, "/v1/realtime", scope="realtime", Sec_WebSocket_Protocol=openai_browser("nope")
    )
    rejected(wrong, 401, "invalid_credentials")
    offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
    assert auth.select_subprotocol(offered) == "realtime"  # never the credential itself


def test_a_client_secrets_session_is_checked_and_kept_for_its_session() -> None:
    minting = auth.Minting.of(CONFIG)
    presets = minting.presets
    session = {"type": "realtime", "instructions": "Be terse."}
    body = json.dumps({"session": session}).encode()

    def check(config: dict[str, object]) -> str | None:
        return "no voices" if "audio" in config else None

    reply = auth.mint_response(
        CONFIG, "POST", auth.CLIENT_SECRETS_PATH, BEARER, body, NOW, minting, check
    )
    assert reply.status == 200 and len(presets) == 1
    claims = auth.verify_client_token(reply.body["value"], [SECRET], NOW)
    assert presets.take(claims.id) == session and presets.take(claims.id) is None
    bad = json.dumps({"session": {"type": "realtime", "audio": {}}}).encode()
    refused = auth.mint_response(
        CONFIG, "POST", auth.CLIENT_SECRETS_PATH, BEARER, bad, NOW, minting, check
    )
    assert (refused.status, refused.body["error"]) == (400, "invalid_session")
    assert "no voices" in refused.body["message"] and len(presets) == 0
    plain = auth.mint_response(
        CONFIG, "POST", auth.CLIENT_SECRETS_PATH, BEARER, b"{}", NOW, minting
    )
    assert plain.status == 200 and len(presets) == 0  # nothing to apply: nothing kept


def test_session_presets_are_bounded_and_expire() -> None:
    presets = auth.SessionPresets(max_entries=1)
    assert presets.put("a", int(NOW) + 10, {"type": "realtime"}, NOW) == "ok"
    assert presets.put("b", int(NOW) + 10, {"type": "realtime"}, NOW) == "full"  # refused
    assert presets.put("b", int(NOW) + 10, {"type": "realtime"}, NOW + 10) == "ok"  # a expired
    assert presets.take("a") is None and presets.take("b") == {"type": "realtime"}


# --- owners, checks before use, status routes, limits per key, logs (issue 40) ------


def test_a_connection_belongs_to_its_key_and_a_token_to_the_key_that_minted_it() -> None:
    both = Authenticator(AuthConfig(api_keys=frozenset({KEY, OTHER_KEY})))
    by_key = connect(both, Authorization=f"Bearer {KEY}")
    by_other = connect(both, Authorization=f"Bearer {OTHER_KEY}")
    minted_by_other = token(secret=auth.derive_secret(OTHER_KEY))
    by_token = connect(both, Authorization=f"Bearer {minted_by_other}")
    assert isinstance(by_key, Accepted) and isinstance(by_other, Accepted)
    assert isinstance(by_token, Accepted)
    assert by_key.owner == auth.owner_of(KEY) != by_other.owner == auth.owner_of(OTHER_KEY)
    assert by_token.owner == by_other.owner
    assert KEY not in by_key.owner and auth.key_id(KEY) != by_key.owner
    open_ = connect(Authenticator(AuthConfig()))
    assert isinstance(open_, Accepted) and open_.owner == auth.OPEN_OWNER


def test_checking_a_token_does_not_use_it_up() -> None:
    """The server checks a handshake, may still refuse it (full), and only then uses
    the token: a refused try leaves it good."""
    authenticator, value = keyed(), token()
    checked = authenticator.check("/v1/voice", [("Host", HOST)], "::1", NOW, "voice")
    assert isinstance(checked, Rejected)  # no credential
    pairs = [("Host", HOST), ("Authorization", f"Bearer {value}")]
    for _ in range(3):
        decision = authenticator.check("/v1/voice", pairs, "::1", NOW)
        assert isinstance(decision, Accepted) and decision.token is not None
    assert len(authenticator.ledger) == 0
    assert isinstance(authenticator.claim(decision, NOW), Accepted)
    rejected(authenticator.claim(decision, NOW), 401, "token_reused")


def http(authenticator: Authenticator, path: str, host: str = HOST, **headers: str) -> object:
    pairs = [("Host", host), *((k.replace("_", "-"), v) for k, v in headers.items())]
    return authenticator.http_access(path, pairs, "127.0.0.1")


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/stats", "/metrics"])
def test_status_routes_need_a_key_when_keys_are_configured(path: str) -> None:
    rejected(http(keyed(), path), 401, "invalid_api_key")  # type: ignore[arg-type]
    rejected(http(keyed(), path, Authorization=f"Bearer {token()}"), 401, "invalid_api_key")  # type: ignore[arg-type]
    assert http(keyed(), path, Authorization=f"Bearer {KEY}") is None
    assert http(keyed(metrics_no_auth=True), path) is None  # --metrics-no-auth
    assert http(keyed(), "/") is None  # the demo page itself needs no key


@pytest.mark.parametrize(
    "path", ["/", "/web/app.js", "/healthz", "/readyz", "/stats", "/metrics", "/x"]
)
def test_without_keys_every_http_route_needs_a_loopback_host(path: str) -> None:
    keyless = Authenticator(AuthConfig())
    assert http(keyless, path) is None
    assert http(keyless, path, host="localhost:8765") is None
    rejected(http(keyless, path, host="evil.example:8765"), 403, "forbidden_host")  # type: ignore[arg-type]
    assert http(Authenticator(AuthConfig(insecure_no_auth=True)), path, "evil.example") is None


def test_minting_is_rate_limited_per_key() -> None:
    limits = auth.KeyLimits(mint_burst=3, mint_per_s=0.5)
    config = AuthConfig(api_keys=frozenset({KEY, OTHER_KEY}), key_limits=limits)
    minting = auth.Minting.of(config)

    def mint_at(now: float, key: str = KEY) -> auth.HttpReply:
        headers = {"Authorization": f"Bearer {key}"}
        return auth.mint_response(config, "POST", auth.TOKEN_PATH, headers, b"", now, minting)

    assert [mint_at(NOW).status for _ in range(3)] == [200, 200, 200]
    over = mint_at(NOW)
    assert (over.status, over.body["error"]) == (429, "rate_limited")
    assert ("Retry-After", "2") in over.headers  # one more in 1 / 0.5 s
    assert mint_at(NOW, OTHER_KEY).status == 200  # another key has its own rate
    assert mint_at(NOW + 2).status == 200
    assert mint_at(NOW + 2).status == 429
    unauthenticated = auth.mint_response(config, "POST", auth.TOKEN_PATH, {}, b"", NOW, minting)
    assert unauthenticated.status == 401  # counts against nobody


def test_client_secret_presets_are_capped_per_key() -> None:
    config = AuthConfig(api_keys=frozenset({KEY, OTHER_KEY}), key_limits=auth.KeyLimits(presets=2))
    minting = auth.Minting.of(config)
    body = json.dumps({"session": {"instructions": "Be brief."}}).encode()

    def mint_secret(key: str) -> auth.HttpReply:
        headers = {"Authorization": f"Bearer {key}"}
        return auth.mint_response(
            config, "POST", auth.CLIENT_SECRETS_PATH, headers, body, NOW, minting
        )

    assert [mint_secret(KEY).status for _ in range(2)] == [200, 200]
    over = mint_secret(KEY)
    assert (over.status, over.body["error"]) == (429, "rate_limited")
    assert "client secrets" in over.body["message"] and len(minting.presets) == 2
    assert mint_secret(OTHER_KEY).status == 200


def test_one_key_cannot_fill_the_used_token_ledger() -> None:
    """Tokens minted offline (quicksilver token) pass no mint rate: the ledger itself
    gives each key a share, and refuses that key's next one with a 429."""
    config = AuthConfig(
        api_keys=frozenset({KEY, OTHER_KEY}), key_limits=auth.KeyLimits(used_tokens=2)
    )
    authenticator = Authenticator(config)
    for _ in range(2):
        assert isinstance(connect(authenticator, Authorization=f"Bearer {token()}"), Accepted)
    rejected(connect(authenticator, Authorization=f"Bearer {token()}"), 429, "too_many_tokens")
    other = token(secret=auth.derive_secret(OTHER_KEY))
    assert isinstance(connect(authenticator, Authorization=f"Bearer {other}"), Accepted)
    later = connect(authenticator, now=NOW + 61, Authorization=f"Bearer {token(ttl=120)}")
    assert isinstance(later, Accepted)  # the first two expired: room again


def test_the_ledger_share_is_freed_when_tokens_expire() -> None:
    ledger = TokenLedger(max_entries=10, per_owner=1)
    assert ledger.claim(claims("a", NOW + 10), NOW, "k1") == "ok"
    assert ledger.claim(claims("b", NOW + 10), NOW, "k1") == "owner_full"
    assert ledger.claim(claims("b", NOW + 10), NOW, "k2") == "ok"
    assert ledger.claim(claims("c", NOW + 20), NOW + 10, "k1") == "ok"


def test_credentials_are_redacted_from_log_lines() -> None:
    value = token()
    lines = {
        f"< GET /v1/voice?token={value} HTTP/1.1": "?token=[redacted]",
        f"< GET /v1/token?ttl_s=5&api_key={KEY}": "&api_key=[redacted]",
        f"< Authorization: Bearer {KEY}": "Authorization: [redacted]",
        f"< authorization: {KEY}": "authorization: [redacted]",
        f"< Sec-WebSocket-Protocol: quicksilver.v1, quicksilver.token.{value}": (
            "quicksilver.v1, quicksilver.token.[redacted]"
        ),
        f"< Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.{KEY}": (
            "openai-insecure-api-key.[redacted]"
        ),
        f"> Sec-WebSocket-Protocol: quicksilver.token.{value}": "quicksilver.token.[redacted]",
        f"invalid header {value!r}": "qs1.[redacted]",
    }
    for line, shown in lines.items():
        redacted = auth.redact(line)
        assert KEY not in redacted and value not in redacted and shown in redacted, redacted
    assert auth.redact("< Host: 127.0.0.1:8765") == "< Host: 127.0.0.1:8765"


def test_the_log_filter_rewrites_messages_and_tracebacks() -> None:
    record = logging.LogRecord(
        "websockets.server",
        logging.DEBUG,
        "",
        0,
        "< %s: %s",
        ("Authorization", f"Bearer {KEY}"),
        None,
    )
    try:
        raise ValueError(f"bad subprotocol quicksilver.token.{token()}")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert auth.RedactCredentials().filter(record)
    assert record.getMessage() == "< Authorization: [redacted]"
    assert record.exc_info is None and record.exc_text is not None
    assert "quicksilver.token.[redacted]" in record.exc_text and "qs1." not in record.exc_text
