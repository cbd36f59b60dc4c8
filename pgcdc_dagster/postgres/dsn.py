"""libpq connection strings as text: the password's possible spellings, and scrubbing them.

libpq echoes parts of a connection string in its errors (``missing "=" after "cret"`` for
``password=se cret``; ``invalid integer value "pa" for connection option "port"`` for
``postgresql://u:pa/ss@h/db``, where the unescaped ``/`` ends the authority early). Which
part is the password depends on what the user meant, not on what libpq parsed, so every
plausible reading of the password is collected here and removed from any text shown.
"""

from __future__ import annotations

import re

_KEYWORD = re.compile(r"\s+[A-Za-z_]+\s*=")
_PASSWORD_KV = re.compile(r"(?:^|\s)password\s*=\s*", re.IGNORECASE)
_PIECES = re.compile(r"[\s/@:?#&=%'\"]+")
_QUOTED = re.compile(r'"([^"]*)"')
_MIN_PIECE = 2


def _kv_password(dsn: str) -> list[str]:
    """Readings of ``password=...`` in key/value form: quoted, or up to the next keyword."""
    out = []
    for m in _PASSWORD_KV.finditer(dsn):
        rest = dsn[m.end():]
        if rest.startswith("'"):
            end = re.search(r"(?<!\\)'", rest[1:])
            out.append(rest[1:] if end is None else rest[1:end.start() + 1])
        else:
            nxt = _KEYWORD.search(rest)
            out.append(rest if nxt is None else rest[:nxt.start()])
    return out


def _uri_password(dsn: str) -> list[str]:
    """Readings of the password of ``postgresql://user:password@host/...``: up to the last
    ``@`` (what was meant) and up to the first (what libpq reads); and ``?password=``."""
    m = re.match(r"\s*postgres(?:ql)?://([^?#]*)", dsn, re.IGNORECASE)
    if m is None:
        return []
    out = []
    authority = m.group(1)
    for at in {authority.rfind("@"), authority.find("@")}:
        if at > 0 and ":" in authority[:at]:
            out.append(authority[:at].split(":", 1)[1])
    out += re.findall(r"[?&]password=([^&#]*)", dsn, re.IGNORECASE)
    return out


def password_readings(dsn: str) -> list[str]:
    """Every plausible spelling of the password in ``dsn`` (empty ones left out)."""
    return [p for p in dict.fromkeys(_kv_password(dsn) + _uri_password(dsn)) if p]


def _pieces(secret: str) -> set[str]:
    return {p for p in _PIECES.split(secret) if len(p) >= _MIN_PIECE} | {secret}


def _secret_fragment(text: str, secrets: list[str]) -> bool:
    return any(text and (text in s or any(p in text for p in _pieces(s))) for s in secrets)


def scrub(text: str, dsn: str) -> str:
    """``text`` without any reading of the password of ``dsn``: each reading and each
    double-quoted fragment that is part of one (or holds a piece of one) becomes ``***``."""
    secrets = password_readings(dsn)
    if not secrets:
        return text
    text = _QUOTED.sub(lambda m: '"***"' if _secret_fragment(m.group(1), secrets)
                       else m.group(0), text)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def safe_value(value: str, dsn: str) -> str:
    """A parsed DSN value fit to show (``***`` when it may hold part of the password)."""
    return "***" if _secret_fragment(value, password_readings(dsn)) else value
