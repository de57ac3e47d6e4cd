"""Hand-written: verifies (and signs) Standard Webhooks signatures as Herald sends them.

`v1`: HMAC-SHA256 with the endpoint's `whsec_` secret, standard library only. `v1a`: ed25519
with the endpoint's `whpk_` public key; the standard library has no ed25519, so `v1a` needs
the `cryptography` package (imported only when a `whpk_`/`whsk_` key is used). Both sign
`{webhook-id}.{webhook-timestamp}.{body}`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from typing import Mapping, Optional, Union

TOLERANCE_SECONDS = 300
"""How far `webhook-timestamp` may be from now, in seconds, before a request is refused."""

_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_INTEGER = re.compile(r"^-?[0-9]+$")


class WebhookVerificationError(Exception):
    """A request that does not carry a valid signature of the key, or is too old or too new."""


class Webhook:
    """Verifies requests with one key: a `whsec_` secret (v1) or a `whpk_` public key (v1a)."""

    def __init__(self, key: str):
        if key.startswith("whsec_"):
            secret = _key_bytes(key, "whsec_")
            self._version = "v1"
            self._check = lambda message, sig: hmac.compare_digest(
                hmac.new(secret, message, hashlib.sha256).digest(), sig)
        elif key.startswith("whpk_"):
            public_key = _ed25519_public_key(_key_bytes(key, "whpk_"))
            self._version = "v1a"
            self._check = lambda message, sig: _ed25519_verifies(public_key, message, sig)
        else:
            raise WebhookVerificationError('the key must start with "whsec_" (v1) or "whpk_" (v1a)')

    def verify(self, body: Union[bytes, str], headers: Mapping[str, str], *, now: Optional[int] = None,
               tolerance_seconds: int = TOLERANCE_SECONDS) -> None:
        """Raises `WebhookVerificationError` unless the request is signed with this key, within the tolerance."""
        msg_id = _header(headers, "webhook-id")
        timestamp = _header(headers, "webhook-timestamp")
        signature = _header(headers, "webhook-signature")
        if not _INTEGER.match(timestamp):
            raise WebhookVerificationError("webhook-timestamp is not an integer")
        now = int(time.time()) if now is None else now
        if abs(now - int(timestamp)) > tolerance_seconds:
            raise WebhookVerificationError("webhook-timestamp is too far from now")
        message = _signed_content(msg_id, timestamp, body)
        prefix = self._version + ","
        for entry in signature.split(" "):
            sig = _decode(entry[len(prefix):]) if entry.startswith(prefix) else None
            if sig is not None and self._check(message, sig):
                return
        raise WebhookVerificationError("no signature of this key matches")


def sign(key: str, msg_id: str, timestamp: int, body: Union[bytes, str]) -> str:
    """The `webhook-signature` entry of `key` (a `whsec_` secret, or a `whsk_` signing key)."""
    message = _signed_content(msg_id, str(timestamp), body)
    if key.startswith("whsec_"):
        tag = hmac.new(_key_bytes(key, "whsec_"), message, hashlib.sha256).digest()
        return "v1," + base64.b64encode(tag).decode()
    if key.startswith("whsk_"):
        seed = _key_bytes(key, "whsk_")
        if len(seed) not in (32, 64):
            raise WebhookVerificationError("a whsk_ key is 32 bytes (the seed) or 64 (seed, then public key)")
        ed25519 = _ed25519()
        private_key = ed25519.Ed25519PrivateKey.from_private_bytes(seed[:32])
        return "v1a," + base64.b64encode(private_key.sign(message)).decode()
    raise WebhookVerificationError('the key must start with "whsec_" (v1) or "whsk_" (v1a)')


def _signed_content(msg_id: str, timestamp: str, body: Union[bytes, str]) -> bytes:
    data = body.encode() if isinstance(body, str) else bytes(body)
    return f"{msg_id}.{timestamp}.".encode() + data


def _decode(text: str) -> Optional[bytes]:
    """Standard base64, padding optional; None when it is not."""
    if not _BASE64.match(text):
        return None
    try:
        return base64.b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except binascii.Error:
        return None


def _key_bytes(key: str, prefix: str) -> bytes:
    raw = _decode(key[len(prefix):])
    if raw is None:
        raise WebhookVerificationError(f"the {prefix} key is not base64")
    return raw


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"the {name} header is missing")


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise WebhookVerificationError(
            "v1a (ed25519) needs the `cryptography` package; v1 (whsec_) needs nothing") from e
    return ed25519


def _ed25519_public_key(raw: bytes):
    if len(raw) != 32:
        raise WebhookVerificationError("a whpk_ key is 32 bytes")
    return _ed25519().Ed25519PublicKey.from_public_bytes(raw)


def _ed25519_verifies(public_key, message: bytes, sig: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    try:
        public_key.verify(sig, message)
        return True
    except InvalidSignature:
        return False
