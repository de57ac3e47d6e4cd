"""Herald's Python SDK: the API client (generated, `client.py`) and webhook verification (`webhook.py`).

Standard library only; `v1a` (ed25519) verification needs the `cryptography` package.
"""

from .client import *  # noqa: F401,F403
from .client import __all__ as _client_all
from .webhook import TOLERANCE_SECONDS, Webhook, WebhookVerificationError, sign

__all__ = [*_client_all, "TOLERANCE_SECONDS", "Webhook", "WebhookVerificationError", "sign"]
