"""Who may connect: API keys, short-lived client tokens, the Origin allow-list, TLS.

Sans-I/O like the session: every decision is a plain function of the request line,
the headers, the peer address and the time, which the caller passes in (unix
seconds, ``time.time()``, because a token's expiry is a wall-clock time that other
machines read). ``server/app.py`` turns the decisions into HTTP responses.

- **API keys** come from ``QUICKSILVER_API_KEYS`` (comma-separated) and/or a key file
  (one per line). With keys configured every connection presents a credential;
  without keys the server serves loopback only, unless ``--insecure-no-auth``.
- **Client tokens** are for pages and devices that must not hold a long-lived key
  (the pattern of OpenAI's ephemeral client secrets and Pipecat's HMAC tokens):
  ``qs1.<payload>.<signature>``, the payload a base64url JSON object with an expiry and
  a unique id, signed with HMAC-SHA256 (RFC 2104) under a secret derived from the key
  that minted it. Each opens one session: :class:`TokenLedger` remembers used ids
  until they expire.
- **Origin**: browsers send one with every WebSocket handshake and WebSockets are not
  subject to CORS, so any page could otherwise drive a server on the user's machine
  (RFC 6455 section 10.2). A present Origin must be the server's own or allow-listed.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import contextlib
import datetime
import hashlib
import heapq
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeGuard

ENV_VAR = "QUICKSILVER_API_KEYS"
MIN_KEY_CHARS = 16
DEFAULT_TOKEN_TTL_S = 600.0
MAX_TOKEN_TTL_S = 3600.0
MIN_TOKEN_TTL_S = 1.0
TOKEN_PREFIX = "qs1"
SCOPES = ("voice", "realtime")  # the v1 protocol; the OpenAI-Realtime endpoint
# Browsers cannot set headers on a WebSocket, only subprotocols: a page offers
# [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token] and the server selects SUBPROTOCOL.
SUBPROTOCOL = "quicksilver.v1"
TOKEN_SUBPROTOCOL_PREFIX = "quicksilver.token."
# OpenAI's browser form: [REALTIME_SUBPROTOCOL, OPENAI_KEY_SUBPROTOCOL_PREFIX + key or
# client secret]; the server selects "realtime".
REALTIME_SUBPROTOCOL = "realtime"
OPENAI_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
TOKEN_PATH = "/v1/token"
CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
MINT_PATHS = (TOKEN_PATH, CLIENT_SECRETS_PATH)
MAX_MINT_BODY_BYTES = 64 * 1024
MAX_LABEL_CHARS = 64
MAX_PRESETS = 10_000  # client secrets with a session config, minted and not yet used
STATUS_PATHS = ("/healthz", "/readyz", "/stats", "/metrics")

_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: they travel in headers
_TOKEN_SHAPE = re.compile(r"qs1\.([A-Za-z0-9_-]{1,2048})\.([A-Za-z0-9_-]{43})")
_LABEL_CHARS = re.compile(r"[\x20-\x7e]*")
_HOST_NAME = re.compile(r"[a-z0-9._-]+|\[[0-9a-f:.]+\]")  # a DNS name, IPv4, [IPv6]
_DERIVE_INFO = b"quicksilver client token v1"
_OWNER_INFO = b"quicksilver owner v1\0"

HeaderSource = Mapping[str, str] | Iterable[tuple[str, str]]
"""A dict, or ``(name, value)`` pairs: pass websockets' ``request.headers.raw_items()``
(its ``Headers`` mapping raises on a header that occurs twice)."""


class AuthError(ValueError):
    """A configuration the server cannot start with; the message is one line."""


# --- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class KeyLimits:
    """What one API key may hold of the server's shared token state, so that no key
    can fill it for the others (docs/security.md, "Limits per key")."""

    mint_burst: int = 60  # tokens a key may mint at once ...
    mint_per_s: float = 1.0  # ... then this many a second
    used_tokens: int = 10_000  # of the ledger's entries (tokens live an hour at most)
    presets: int = 1_000  # of the client-secret session configs (MAX_PRESETS)


@dataclass(frozen=True)
class AuthConfig:
    api_keys: frozenset[str] = frozenset()
    insecure_no_auth: bool = False  # serve without keys on a non-loopback address
    allowed_origins: tuple[str, ...] = ()  # besides the server's own origin
    client_token_ttl_s: float = DEFAULT_TOKEN_TTL_S  # when a mint request names none
    max_client_token_ttl_s: float = MAX_TOKEN_TTL_S
    # /healthz, /stats and /metrics answer without a key (--metrics-no-auth)
    metrics_no_auth: bool = False
    key_limits: KeyLimits = KeyLimits()

    def __post_init__(self) -> None:
        if not self.max_client_token_ttl_s >= MIN_TOKEN_TTL_S:
            raise AuthError(f"the longest token lifetime must be >= {MIN_TOKEN_TTL_S:g} s")
        if not MIN_TOKEN_TTL_S <= self.client_token_ttl_s <= self.max_client_token_ttl_s:
            raise AuthError(
                f"--token-ttl must be between {MIN_TOKEN_TTL_S:g} and "
                f"{self.max_client_token_ttl_s:g} s, not {self.client_token_ttl_s:g}"
            )
        origins = tuple(normalize_origin(o) for o in self.allowed_origins)
        object.__setattr__(self, "allowed_origins", origins)

    @property
    def enabled(self) -> bool:
        """Whether connections must present a credential."""
        return bool(self.api_keys)


def load_api_keys(env: Mapping[str, str], key_file: Path | None = None) -> frozenset[str]:
    """The keys of ``QUICKSILVER_API_KEYS`` (comma-separated) and of ``key_file``
    (one per line; blank lines and ``#`` comments ignored), together."""
    keys = [k.strip() for k in env.get(ENV_VAR, "").split(",")]
    if key_file is not None:
        keys += _read_key_file(key_file)
    found = frozenset(k for k in keys if k)
    for key in found:
        _check_key(key)
    return found


def _read_key_file(path: Path) -> list[str]:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise AuthError(f"API key file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise AuthError(f"cannot read API key file {path}: {reason}") from None
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def _check_key(key: str) -> None:
    # The key itself never goes in a message: it might be a real key, mistyped.
    if len(key) < MIN_KEY_CHARS:
        raise AuthError(
            f"an API key has {len(key)} characters; keys need at least {MIN_KEY_CHARS} "
            "(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if not _KEY_CHARS.fullmatch(key):
        raise AuthError("an API key holds a space or a non-ASCII character; keys are one word")


def match_api_key(api_keys: Iterable[str], candidate: str) -> str | None:
    """The configured key equal to ``candidate``, compared in constant time: digests of
    equal length, every key compared, so the time says nothing about how much matched."""
    digest = hashlib.sha256(candidate.encode("utf-8", "surrogatepass")).digest()
    keys = sorted(api_keys)
    matches = [hmac.compare_digest(digest, hashlib.sha256(k.encode()).digest()) for k in keys]
    return next((k for k, m in zip(keys, matches, strict=True) if m), None)


def key_id(api_key: str) -> str:
    """A short fingerprint of a key, for logs: names the key without revealing it."""
    return "k-" + hashlib.sha256(api_key.encode()).hexdigest()[:8]


def owner_of(api_key: str) -> str:
    """Who a key's connections belong to (a resumable conversation, a share of the
    token ledger): a fingerprint long enough that two keys never share one."""
    return "key-" + hashlib.sha256(_OWNER_INFO + api_key.encode()).hexdigest()[:32]


# The owner of every connection to a server without keys (only this machine, or
# anyone under --insecure-no-auth, connects: there is nobody to tell apart).
OPEN_OWNER = "open"


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (bracketed, with a zone or IPv4-mapped too)."""
    name = host.strip().lower().removeprefix("[").removesuffix("]").split("%", 1)[0]
    if name.rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another name: it may resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_bind(host: str, config: AuthConfig) -> str | None:
    """The one-line refusal to listen on ``host``, or None when it is allowed."""
    if config.enabled or config.insecure_no_auth or is_loopback(host):
        return None
    shown = host or "every interface"
    return (
        f"quicksilver: refusing to listen on {shown} without API keys: set {ENV_VAR} or "
        "--api-key-file, or pass --insecure-no-auth to let anyone who can reach it connect"
    )


# --- origins ----------------------------------------------------------------------


def normalize_origin(text: str) -> str:
    """``scheme://host[:port]`` in the form browsers send it: lowercase, no default port."""
    parts = urllib.parse.urlsplit(text.strip())
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"bad port in origin {text!r}") from None
    bad = not parts.scheme or not parts.hostname or parts.username or parts.password
    if bad or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(
            f"an origin is scheme://host[:port], such as https://example.com, not {text!r}"
        )
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if not _HOST_NAME.fullmatch(host):
        raise ValueError(f"bad host name in origin {text!r}")
    default = {"http": 80, "https": 443}.get(parts.scheme)
    suffix = "" if port is None or port == default else f":{port}"
    return f"{parts.scheme}://{host}{suffix}"


def origin_arg(text: str) -> str:
    """argparse ``type=`` for ``--allow-origin``."""
    try:
        return normalize_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def own_origins(host_header: str | None) -> frozenset[str]:
    """The origins of a page this server served, as the Host header names the server."""
    if not host_header:
        return frozenset()
    found = set()
    for scheme in ("http", "https"):
        with contextlib.suppress(ValueError):  # a Host that is no host name
            found.add(normalize_origin(f"{scheme}://{host_header}"))
    return frozenset(found)


def origin_allowed(origin: str | None, host_header: str | None, config: AuthConfig) -> bool:
    """No Origin (not a browser) passes; a browser's must be ours or allow-listed."""
    if origin is None:
        return True
    try:
        seen = normalize_origin(origin)
    except ValueError:
        return False  # "null" (a file:// page, a sandboxed frame) or garbage
    return seen in config.allowed_origins or seen in own_origins(host_header)


# --- client tokens ----------------------------------------------------------------


@dataclass(frozen=True)
class ClientToken:
    id: str  # unique: the ledger's key, safe to log
    issued_at: int
    expires_at: int  # unix seconds
    scope: str = "voice"
    label: str | None = None  # who it was minted for, for logs ("kiosk-3")


class TokenError(Exception):
    """A client token that does not open a session; ``code`` goes in the reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def derive_secret(api_key: str) -> bytes:
    """The signing secret of tokens minted with ``api_key``: revoking the key revokes
    them, and ``quicksilver token`` on another machine mints tokens the server takes."""
    return hmac.new(api_key.encode(), _DERIVE_INFO, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, payload_b64: str) -> str:
    message = f"{TOKEN_PREFIX}.{payload_b64}".encode("ascii")
    return _b64(hmac.new(secret, message, hashlib.sha256).digest())


def mint_client_token(
    secret: bytes,
    now: float,
    ttl_s: float = DEFAULT_TOKEN_TTL_S,
    scope: str = "voice",
    label: str | None = None,
    token_id: str | None = None,
) -> tuple[str, int]:
    """A signed single-session token and its expiry (unix seconds)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if not (math.isfinite(ttl_s) and ttl_s >= MIN_TOKEN_TTL_S):
        raise ValueError(f"a token lives at least {MIN_TOKEN_TTL_S:g} s, not {ttl_s!r}")
    expires_at = int(now + ttl_s)
    claims: dict[str, object] = {
        "jti": token_id or secrets.token_urlsafe(16),
        "iat": int(now),
        "exp": expires_at,
        "scope": scope,
    }
    if label is not None:
        claims["label"] = label
    payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    return f"{TOKEN_PREFIX}.{payload}.{_sign(secret, payload)}", expires_at


def looks_like_client_token(credential: str) -> bool:
    return credential.startswith(TOKEN_PREFIX + ".")


def verify_client_token(
    token: str, secrets_: Sequence[bytes], now: float, max_ttl_s: float = MAX_TOKEN_TTL_S
) -> ClientToken:
    """The token's claims if one of ``secrets_`` signed it and it has not expired;
    :class:`TokenError` otherwise. Single use is the ledger's job."""
    return signed_claims(token, secrets_, now, max_ttl_s)[0]


def signed_claims(
    token: str, secrets_: Sequence[bytes], now: float, max_ttl_s: float = MAX_TOKEN_TTL_S
) -> tuple[ClientToken, int]:
    """:func:`verify_client_token`, and the index in ``secrets_`` of the one that signed
    it: the key that minted the token."""
    shape = _TOKEN_SHAPE.fullmatch(token)
    if shape is None:
        raise TokenError("invalid_credentials", "malformed client token")
    payload_b64, signature = shape.groups()
    # Every secret is tried, so the time taken says nothing about which one matched.
    matches = [hmac.compare_digest(_sign(s, payload_b64), signature) for s in secrets_]
    if not any(matches):
        raise TokenError("invalid_credentials", "client token not signed by this server")
    claims = _claims(payload_b64)
    if now >= claims.expires_at:
        raise TokenError("token_expired", "client token expired; mint a new one")
    if claims.expires_at - claims.issued_at > max_ttl_s + 1:  # +1: whole seconds
        raise TokenError("invalid_credentials", "client token lives longer than allowed")
    return claims, matches.index(True)


def _claims(payload_b64: str) -> ClientToken:
    try:
        raw = json.loads(_unb64(payload_b64))
    except (ValueError, binascii.Error, RecursionError):
        raw = None
    if not isinstance(raw, dict):
        raise TokenError("invalid_credentials", "malformed client token")
    jti, iat, exp = raw.get("jti"), raw.get("iat"), raw.get("exp")
    scope, label = raw.get("scope", "voice"), raw.get("label")
    if not (isinstance(jti, str) and jti and _is_int(iat) and _is_int(exp)):
        raise TokenError("invalid_credentials", "malformed client token")
    if scope not in SCOPES or not (label is None or isinstance(label, str)):
        raise TokenError("invalid_credentials", "malformed client token")
    return ClientToken(jti, iat, exp, scope, label)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


Claim = Literal["ok", "reused", "full", "owner_full"]


class TokenLedger:
    """Ids of the client tokens that opened a session, each kept until it expires: a
    token opens one session. Memory is bounded; when full it refuses (fails closed)
    rather than forgetting an unexpired id, which would let that token in again. Each
    owner (the key that minted the tokens) may hold ``per_owner`` of the entries, so
    one key, which can mint tokens offline without limit, cannot fill it for all."""

    def __init__(self, max_entries: int = 100_000, per_owner: int | None = None) -> None:
        self.max_entries = max_entries
        self.per_owner = max_entries if per_owner is None else per_owner
        self._used: dict[str, str] = {}  # id -> owner
        self._held: collections.Counter[str] = collections.Counter()  # owner -> entries
        self._expiry: list[tuple[int, str]] = []  # heap of (expires_at, id)

    def claim(self, token: ClientToken, now: float, owner: str = OPEN_OWNER) -> Claim:
        self._purge(now)
        if token.id in self._used:
            return "reused"
        if len(self._used) >= self.max_entries:
            return "full"
        if self._held[owner] >= self.per_owner:
            return "owner_full"
        self._used[token.id] = owner
        self._held[owner] += 1
        heapq.heappush(self._expiry, (token.expires_at, token.id))
        return "ok"

    def _purge(self, now: float) -> None:
        # A token is valid while now < expires_at, so from then on its id can go.
        while self._expiry and self._expiry[0][0] <= now:
            owner = self._used.pop(heapq.heappop(self._expiry)[1])
            self._held[owner] -= 1
            if not self._held[owner]:
                del self._held[owner]

    def __len__(self) -> int:
        return len(self._used)


# --- decisions --------------------------------------------------------------------


@dataclass(frozen=True)
class HttpReply:
    """An HTTP answer for ``server/app.py`` to send: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        return json.dumps(self.body) + "\n"


Who = Literal["api_key", "client_token", "loopback-open", "insecure-open"]


@dataclass(frozen=True)
class Accepted:
    who: Who
    key_id: str | None = None  # the API key's fingerprint (api_key)
    token: ClientToken | None = None  # the token's claims (client_token)
    # whose the connection is: the key's (for a token, the key that minted it), or
    # OPEN_OWNER without keys; a parked conversation resumes only for its owner
    owner: str = OPEN_OWNER

    def describe(self) -> str:
        """For the log line of the session: never the credential itself."""
        if self.token is not None:
            label = f" ({self.token.label})" if self.token.label else ""
            return f"client_token {self.token.id}{label}"
        return f"api_key {self.key_id}" if self.key_id else self.who


@dataclass(frozen=True)
class Rejected:
    status: int  # 401 missing/invalid credentials, 403 forbidden, 503 ledger full
    error: str
    message: str

    def reply(self) -> HttpReply:
        headers = (("WWW-Authenticate", 'Bearer realm="quicksilver"'),)  # RFC 6750 3.
        body = {"error": self.error, "message": self.message}
        return HttpReply(self.status, body, headers if self.status == 401 else ())


Decision = Accepted | Rejected


@dataclass(frozen=True)
class Credential:
    value: str
    source: Literal["authorization", "query", "subprotocol", "openai_subprotocol"]


def header_list(headers: HeaderSource) -> list[tuple[str, str]]:
    """The headers as a list, read once (``raw_items()`` is an iterator)."""
    return list(headers.items() if isinstance(headers, Mapping) else headers)


def header_values(headers: HeaderSource, name: str) -> list[str]:
    """Every value of header ``name`` (case-insensitive), in order."""
    return [v for k, v in header_list(headers) if k.lower() == name.lower()]


def _first_header(headers: HeaderSource, name: str) -> str | None:
    values = header_values(headers, name)
    return values[0] if values else None


def find_credential(path_query: str, headers: HeaderSource) -> Credential | None:
    """The first credential presented: ``Authorization: Bearer``, the ``token`` query
    parameter, then a ``quicksilver.token.<token>`` or an OpenAI browser client's
    ``openai-insecure-api-key.<key or client secret>`` subprotocol."""
    headers = header_list(headers)
    bearer = _bearer(headers)
    if bearer is not None:
        return Credential(bearer, "authorization")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path_query).query)
    if query.get("token"):
        return Credential(query["token"][0], "query")
    for offered in subprotocols(headers):
        if offered.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return Credential(offered.removeprefix(TOKEN_SUBPROTOCOL_PREFIX), "subprotocol")
        if offered.startswith(OPENAI_KEY_SUBPROTOCOL_PREFIX):
            value = offered.removeprefix(OPENAI_KEY_SUBPROTOCOL_PREFIX)
            return Credential(value, "openai_subprotocol")
    return None


def _bearer(headers: HeaderSource) -> str | None:
    """The credential of ``Authorization: Bearer X`` (RFC 6750 2.1); another scheme
    gives an empty, hence invalid, one; no header gives None."""
    authorization = _first_header(headers, "Authorization")
    if authorization is None:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def subprotocols(headers: HeaderSource) -> list[str]:
    """The subprotocols a client offers (``Sec-WebSocket-Protocol``, comma-separated)."""
    values = header_values(headers, "Sec-WebSocket-Protocol")
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def select_subprotocol(offered: Sequence[str]) -> str | None:
    """The subprotocol to answer with. A browser that offered any fails the
    connection unless the server selects one it offered, so: ``quicksilver.v1`` when
    offered, else OpenAI's ``realtime``, else the token entry itself, else none
    (non-browser clients)."""
    if SUBPROTOCOL in offered:
        return SUBPROTOCOL
    if REALTIME_SUBPROTOCOL in offered:
        return REALTIME_SUBPROTOCOL
    return next((p for p in offered if p.startswith(TOKEN_SUBPROTOCOL_PREFIX)), None)


class Authenticator:
    """Decides each WebSocket handshake and HTTP request; holds the config, the token
    ledger and the signing secrets derived from the keys."""

    def __init__(self, config: AuthConfig, ledger: TokenLedger | None = None) -> None:
        self.config = config
        per_owner = config.key_limits.used_tokens
        self.ledger = ledger if ledger is not None else TokenLedger(per_owner=per_owner)
        keys = sorted(config.api_keys)
        self.secrets = [derive_secret(k) for k in keys]
        self._owners = [owner_of(k) for k in keys]  # of the token each secret signed

    def authenticate(
        self,
        path_query: str,
        headers: HeaderSource,
        remote_host: str,
        now: float,
        scope: str = "voice",
    ) -> Decision:
        """Accept or reject one handshake; an accepted client token is used up."""
        decision = self.check(path_query, headers, remote_host, now, scope)
        return decision if isinstance(decision, Rejected) else self.claim(decision, now)

    def check(
        self,
        path_query: str,
        headers: HeaderSource,
        remote_host: str,
        now: float,
        scope: str = "voice",
    ) -> Decision:
        """:meth:`authenticate` without using the token up: the caller may still refuse
        the connection (server full), then the token is good for another try."""
        headers = header_list(headers)
        host = _first_header(headers, "Host")
        if not origin_allowed(_first_header(headers, "Origin"), host, self.config):
            return Rejected(403, "forbidden_origin", "this page's origin may not connect")
        if not self.config.enabled:
            return self._open(host, remote_host)
        credential = find_credential(path_query, headers)
        if credential is None or not credential.value:
            return Rejected(401, "missing_credentials", _MISSING)
        return self._check(credential, now, scope)

    def claim(self, decision: Accepted, now: float) -> Decision:
        """Use up a checked client token (a key or an open server has none to use)."""
        if decision.token is None:
            return decision
        match self.ledger.claim(decision.token, now, decision.owner):
            case "ok":
                return decision
            case "reused":
                return Rejected(401, "token_reused", "this client token already opened a session")
            case "full":
                return Rejected(503, "busy", "too many client tokens in flight; retry shortly")
            case "owner_full":
                n = self.ledger.per_owner
                message = f"{n} unexpired tokens of this key opened sessions; retry later"
                return Rejected(429, "too_many_tokens", message)

    def http_access(self, path: str, headers: HeaderSource, remote_host: str) -> Rejected | None:
        """Why a plain HTTP request (the page, /healthz, /stats, /metrics) is refused.
        Without keys the same loopback rule as a handshake holds for every route; with
        keys the status routes need one, unless --metrics-no-auth."""
        headers = header_list(headers)
        if not self.config.enabled:
            decision = self._open(_first_header(headers, "Host"), remote_host)
            return decision if isinstance(decision, Rejected) else None
        if path not in STATUS_PATHS or self.config.metrics_no_auth:
            return None
        bearer = _bearer(headers)
        if bearer is None or match_api_key(self.config.api_keys, bearer) is None:
            return Rejected(401, "invalid_api_key", f"{path} needs an API key: {_BEARER}")
        return None

    def _open(self, host: str | None, remote_host: str) -> Decision:
        if self.config.insecure_no_auth:
            return Accepted("insecure-open")
        # Without keys only this machine may connect, and only by a loopback name: a
        # public name in Host is DNS rebinding, a page that re-pointed its own name here.
        if not is_loopback(remote_host):
            return Rejected(403, "loopback_only", "this server has no API keys: loopback only")
        if host is None or not is_loopback(_host_name(host)):
            return Rejected(403, "forbidden_host", "connect by localhost or a loopback address")
        return Accepted("loopback-open")

    def _check(self, credential: Credential, now: float, scope: str) -> Decision:
        key = match_api_key(self.config.api_keys, credential.value)
        if key is not None:
            # A header, not a URL: OpenAI's browser form (named insecure, as a key in a
            # page is a key anyone can read) may carry one; the query string may not.
            if credential.source not in ("authorization", "openai_subprotocol"):
                return Rejected(401, "key_in_url", _KEY_IN_URL)
            return Accepted("api_key", key_id=key_id(key), owner=owner_of(key))
        if not looks_like_client_token(credential.value):
            return Rejected(401, "invalid_credentials", "unknown API key or client token")
        try:
            token, signer = signed_claims(
                credential.value, self.secrets, now, self.config.max_client_token_ttl_s
            )
        except TokenError as err:
            return Rejected(401, err.code, err.message)
        if token.scope != scope:
            return Rejected(401, "wrong_scope", f"this token is for the {token.scope} endpoint")
        return Accepted("client_token", token=token, owner=self._owners[signer])


_BEARER = "Authorization: Bearer KEY"
_MISSING = (
    "this server needs an API key (Authorization: Bearer KEY) or a client token "
    "(?token=, or the quicksilver.token.TOKEN subprotocol)"
)
_KEY_IN_URL = (
    "API keys go only in the Authorization header; give browsers a client token "
    f"(POST {TOKEN_PATH} or quicksilver token)"
)


def _host_name(host_header: str) -> str:
    """``example.com:8765`` -> ``example.com``; ``[::1]:8765`` -> ``::1``."""
    parts = urllib.parse.urlsplit(f"//{host_header.strip()}")
    return parts.hostname or ""


# --- the mint endpoints -----------------------------------------------------------


Put = Literal["ok", "full", "owner_full"]


class SessionPresets:
    """The session config each client secret was minted with (``POST
    /v1/realtime/client_secrets``), kept until the secret opens its session or expires.
    Bounded, in all and per key: when full, minting one more is refused rather than
    forgetting one."""

    def __init__(self, max_entries: int = MAX_PRESETS, per_owner: int | None = None) -> None:
        self.max_entries = max_entries
        self.per_owner = max_entries if per_owner is None else per_owner
        # token id -> expiry, owner, config
        self._by_id: dict[str, tuple[int, str, dict[str, Any]]] = {}

    def put(
        self,
        token_id: str,
        expires_at: int,
        session: dict[str, Any],
        now: float,
        owner: str = OPEN_OWNER,
    ) -> Put:
        self._by_id = {k: v for k, v in self._by_id.items() if v[0] > now}
        if len(self._by_id) >= self.max_entries:
            return "full"
        if sum(v[1] == owner for v in self._by_id.values()) >= self.per_owner:
            return "owner_full"
        self._by_id[token_id] = (expires_at, owner, session)
        return "ok"

    def take(self, token_id: str) -> dict[str, Any] | None:
        entry = self._by_id.pop(token_id, None)
        return None if entry is None else entry[2]

    def __len__(self) -> int:
        return len(self._by_id)


class MintRate:
    """How fast each key may mint: a token bucket per key, ``burst`` at once, then
    ``per_s`` a second."""

    def __init__(self, burst: int, per_s: float) -> None:
        self.burst = burst
        self.per_s = per_s
        self._level: dict[str, tuple[float, float]] = {}  # owner -> (tokens left, when)

    def take(self, owner: str, now: float) -> float:
        """0 when ``owner`` may mint now (the mint is counted); else the seconds until
        it may."""
        left, then = self._level.get(owner, (float(self.burst), now))
        left = min(float(self.burst), left + max(0.0, now - then) * self.per_s)
        if left < 1:
            self._level[owner] = (left, now)
            return (1 - left) / self.per_s
        self._level[owner] = (left - 1, now)
        return 0.0


@dataclass(frozen=True)
class Minting:
    """The mint endpoints' state in one server: session presets, each key's rate."""

    presets: SessionPresets
    rate: MintRate

    @classmethod
    def of(cls, config: AuthConfig) -> Minting:
        limits = config.key_limits
        return cls(
            SessionPresets(per_owner=limits.presets),
            MintRate(limits.mint_burst, limits.mint_per_s),
        )


SessionCheck = Callable[[dict[str, Any]], str | None]


def minting_key(config: AuthConfig, headers: HeaderSource) -> str | None:
    """The configured API key in ``Authorization: Bearer``, None without one: only a
    key mints (a client token cannot mint more)."""
    bearer = _bearer(header_list(headers))
    return None if bearer is None else match_api_key(config.api_keys, bearer)


def mint_response(
    config: AuthConfig,
    method: str,
    path_query: str,
    headers: HeaderSource,
    body: bytes,
    now: float,
    minting: Minting | None = None,
    check: SessionCheck | None = None,
) -> HttpReply:
    """``POST /v1/token`` -> ``{"token", "expires_at"}``; ``POST
    /v1/realtime/client_secrets`` -> OpenAI's shape ``{"value", "expires_at",
    "session"}``. Both need an API key in ``Authorization: Bearer`` (a client token
    cannot mint more), within its rate (``minting``, 429 over it). The lifetime comes
    from the body (``ttl_s``; OpenAI's ``expires_after.seconds``) or a ``ttl_s`` query
    parameter, clamped to the maximum. A client secret's ``session`` is checked
    (``check``: why it would be refused) and kept in ``minting``'s presets for the
    session the secret opens."""
    path, _, query = path_query.partition("?")
    if path not in MINT_PATHS:
        return _error(404, "not_found", f"tokens are minted at {' and '.join(MINT_PATHS)}")
    if method.upper() != "POST":
        return replace(_error(405, "method_not_allowed", "use POST"), headers=_ALLOW_POST)
    if not config.enabled:
        return _error(404, "tokens_disabled", "no API keys are configured: nothing needs a token")
    key = minting_key(config, headers)
    if key is None:
        return _error(401, "invalid_api_key", f"minting needs an API key: {_BEARER}")
    owner = owner_of(key)
    if minting is not None and (wait := minting.rate.take(owner, now)) > 0:
        return _too_many(f"this key mints at most {minting.rate.per_s:g} tokens a second", wait)
    try:
        params = _mint_params(path, query, body, config)
    except TokenError as err:
        return _error(413 if err.code == "too_large" else 400, err.code, err.message)
    ttl = min(params.ttl_s, config.max_client_token_ttl_s)
    scope = "realtime" if path == CLIENT_SECRETS_PATH else "voice"
    if params.session is not None and check is not None and (why := check(params.session)):
        return _error(400, "invalid_session", f"session: {why}")
    token_id = secrets.token_urlsafe(16)
    secret = derive_secret(key)
    token, expires_at = mint_client_token(secret, now, ttl, scope, params.label, token_id)
    session = params.session if params.session and set(params.session) != {"type"} else None
    if session and minting is not None:
        match minting.presets.put(token_id, expires_at, session, now, owner):
            case "full":
                return _error(503, "busy", "too many client secrets in flight; retry shortly")
            case "owner_full":
                n = minting.presets.per_owner
                return _too_many(f"this key has {n} client secrets with a session unused", 60)
    if path == TOKEN_PATH:
        answer: dict[str, Any] = {"token": token, "expires_at": expires_at}
    else:
        answer = {"value": token, "expires_at": expires_at, "session": params.session}
    return HttpReply(200, answer, (("Cache-Control", "no-store"),))  # RFC 6749 5.1


def _too_many(message: str, retry_after_s: float) -> HttpReply:
    """429 with Retry-After (RFC 6585 section 4) in whole seconds."""
    retry = str(max(1, math.ceil(retry_after_s)))
    reply = _error(429, "rate_limited", f"{message}; retry in {retry} s")
    return replace(reply, headers=(("Retry-After", retry),))


_ALLOW_POST = (("Allow", "POST"),)


def _error(status: int, code: str, message: str) -> HttpReply:
    return Rejected(status, code, message).reply()


@dataclass(frozen=True)
class _MintParams:
    ttl_s: float
    label: str | None = None
    session: dict[str, Any] | None = None


def _mint_params(path: str, query: str, body: bytes, config: AuthConfig) -> _MintParams:
    fields = _json_object(body)
    allowed = {"ttl_s", "label"} if path == TOKEN_PATH else {"expires_after", "session"}
    if unknown := sorted(set(fields) - allowed):
        raise TokenError("bad_request", f"unknown field(s): {', '.join(unknown)}")
    requested = fields.get("ttl_s") if path == TOKEN_PATH else _expires_after(fields)
    if requested is None:
        requested = _query_ttl(query)
    ttl = config.client_token_ttl_s if requested is None else _ttl(requested)
    if path == TOKEN_PATH:
        return _MintParams(ttl, label=_label(fields.get("label")))
    session = fields.get("session", {})
    if not isinstance(session, dict):
        raise TokenError("bad_request", "session must be an object")
    return _MintParams(ttl, session={"type": "realtime", **session})


def _json_object(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_MINT_BODY_BYTES:
        raise TokenError("too_large", f"the body is over {MAX_MINT_BODY_BYTES} bytes")
    if not body.strip():
        return {}
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        raise TokenError("bad_json", "the body is not JSON") from None
    if not isinstance(fields, dict):
        raise TokenError("bad_json", "the body must be a JSON object")
    return fields


def _expires_after(fields: dict[str, Any]) -> object:
    """OpenAI's ``{"anchor": "created_at", "seconds": N}``."""
    after = fields.get("expires_after")
    if after is None:
        return None
    if not isinstance(after, dict) or after.get("anchor", "created_at") != "created_at":
        raise TokenError("bad_request", 'expires_after is {"anchor": "created_at", "seconds": N}')
    return after.get("seconds")


def _query_ttl(query: str) -> object:
    values = urllib.parse.parse_qs(query).get("ttl_s")
    if not values:
        return None
    try:
        return float(values[0])
    except ValueError:
        raise TokenError("bad_ttl", "ttl_s must be a number of seconds") from None


def _ttl(value: object) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    seconds = float(value) if isinstance(value, int | float) else math.nan
    if not (number and math.isfinite(seconds) and seconds >= MIN_TOKEN_TTL_S):
        raise TokenError("bad_ttl", f"the lifetime must be a number >= {MIN_TOKEN_TTL_S:g} s")
    return seconds


def _label(value: object) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) > MAX_LABEL_CHARS
        or not _LABEL_CHARS.fullmatch(value)
    ):
        raise TokenError(
            "bad_request", f"label must be printable ASCII, {MAX_LABEL_CHARS} chars at most"
        )
    return value


# --- logs -------------------------------------------------------------------------

_CREDENTIALS_IN_LOGS = (
    # header lines as websockets logs them at DEBUG ("< Authorization: Bearer ...")
    (re.compile(r"(?im)(\b(?:proxy-)?authorization:|\bcookie:)[^\r\n]*"), r"\1 [redacted]"),
    # a client token or key offered as a subprotocol, wherever it is quoted
    (
        re.compile(
            rf"({re.escape(TOKEN_SUBPROTOCOL_PREFIX)}|{re.escape(OPENAI_KEY_SUBPROTOCOL_PREFIX)})"
            r"[^\s,;'\"]+"
        ),
        r"\1[redacted]",
    ),
    # a credential in a query string (the request line, a URL in an error)
    (
        re.compile(r"(?i)([?&](?:token|key|api_key|apikey|access_token|client_secret)=)[^&\s'\"]+"),
        r"\1[redacted]",
    ),
    # a client token anywhere else
    (re.compile(r"(qs1\.)[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}"), r"\1[redacted]"),
)


def redact(text: str) -> str:
    """``text`` with every credential in it replaced: what a log line may show."""
    for pattern, replacement in _CREDENTIALS_IN_LOGS:
        text = pattern.sub(replacement, text)
    return text


class RedactCredentials(logging.Filter):
    """Rewrites a record's message (and traceback) through :func:`redact`: at DEBUG
    websockets logs every request line and header, keys and tokens included."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def redact_credentials(logger: logging.Logger) -> None:
    """Give ``logger`` a :class:`RedactCredentials` filter (once)."""
    if not any(isinstance(f, RedactCredentials) for f in logger.filters):
        logger.addFilter(RedactCredentials())


# --- TLS --------------------------------------------------------------------------


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The server's TLS context for ``--tls-cert`` / ``--tls-key`` (both or neither)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise AuthError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise AuthError(f"cannot load TLS certificate {cert} / key {key}: {reason}") from None
    return context


# --- command line -----------------------------------------------------------------


def add_key_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help=f"API keys, one per line (with {ENV_VAR}, comma-separated)",
    )


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The flags of ``quicksilver serve`` that docs/security.md describes."""
    add_key_file_argument(serve)
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without API keys: anyone who reaches it may connect",
    )
    serve.add_argument(
        "--allow-origin",
        type=origin_arg,
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin that may connect besides the server's own (repeatable)",
    )
    serve.add_argument(
        "--metrics-no-auth",
        action="store_true",
        help="with API keys: let /healthz, /stats and /metrics answer without one (for a "
        "scraper or health check that cannot send a key; put them on a trusted network)",
    )
    serve.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (chain)")
    serve.add_argument("--tls-key", type=Path, default=None, help="PEM private key")
    serve.add_argument(
        "--token-ttl",
        type=float,
        default=DEFAULT_TOKEN_TTL_S,
        help="seconds a minted client token lives unless the request asks otherwise "
        f"(at most {MAX_TOKEN_TTL_S:g})",
    )


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> AuthConfig:
    """The auth config of ``quicksilver serve``; :class:`AuthError` with one line."""
    return AuthConfig(
        api_keys=load_api_keys(env, args.api_key_file),
        insecure_no_auth=args.insecure_no_auth,
        allowed_origins=tuple(args.allow_origin),
        client_token_ttl_s=args.token_ttl,
        metrics_no_auth=args.metrics_no_auth,
    )


def register(sub: Any) -> None:
    """``quicksilver token``: mint a client token locally from an API key."""
    cmd = sub.add_parser("token", help="mint a short-lived single-session client token")
    add_key_file_argument(cmd)
    cmd.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TOKEN_TTL_S,
        help=f"seconds until it expires (at most {MAX_TOKEN_TTL_S:g})",
    )
    cmd.add_argument("--scope", choices=SCOPES, default="voice", help="the endpoint it opens")
    cmd.add_argument("--label", default=None, help="who it is for, shown in the server log")
    cmd.set_defaults(run=run_token)


def run_token(args: argparse.Namespace) -> int:
    """Print a token on stdout (for ``$(quicksilver token)``), its expiry on stderr."""
    try:
        keys = load_api_keys(os.environ, args.api_key_file)
        label = _label(args.label)
    except (AuthError, TokenError) as exc:
        print(f"quicksilver: {exc}", file=sys.stderr)
        return 2
    if not keys:
        print(f"quicksilver: no API keys: set {ENV_VAR} or --api-key-file", file=sys.stderr)
        return 2
    if not (math.isfinite(args.ttl) and args.ttl >= MIN_TOKEN_TTL_S):
        print(f"quicksilver: --ttl must be at least {MIN_TOKEN_TTL_S:g} s", file=sys.stderr)
        return 2
    ttl = min(args.ttl, MAX_TOKEN_TTL_S)
    now = time.time()
    token, expires_at = mint_client_token(derive_secret(min(keys)), now, ttl, args.scope, label)
    print(token, flush=True)
    when = datetime.datetime.fromtimestamp(expires_at, datetime.UTC).isoformat(timespec="seconds")
    print(f"expires at {when} (in {expires_at - int(now)} s); opens one session", file=sys.stderr)
    return 0
