"""Signing a delivery as the Standard Webhooks specification describes.

Each attempt carries ``webhook-id`` (the event's stable id, the same on every
attempt and every endpoint, for receivers to de-duplicate on),
``webhook-timestamp`` (the attempt's time, integer seconds since the epoch:
receivers refuse an old one, so a replayed request is refused) and
``webhook-signature``: ``v1,`` and the base64 of HMAC-SHA256, keyed with the
secret's bytes, over ``id.timestamp.body``. The HMAC is the ``standardwebhooks``
package's, the specification's own reference implementation.
"""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook


def signed_headers(secret: str, message_id: str, body: bytes, at: float) -> dict[str, str]:
    """The headers of one attempt to post ``body`` as ``message_id`` at epoch ``at``."""
    timestamp = int(at)
    signature = Webhook(secret).sign(message_id, datetime.fromtimestamp(timestamp, tz=UTC),
                                     body.decode("utf-8"))
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature, "content-type": "application/json"}
