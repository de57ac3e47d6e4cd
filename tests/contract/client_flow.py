"""One whole delivery through the Python client generated from Herald's live /openapi.json
(tests/it/contract.rs generates it, then runs this): tenant -> token -> endpoint -> event ->
delivery -> dead letter -> replay -> delivered. Every step goes through the generated
functions and models; the receiver answers 422 first (a permanent failure) and 200 after.

Usage: client_flow.py BASE_URL ADMIN_TOKEN RECEIVER_URL. Prints a JSON summary on success;
exits non-zero with the reason on failure.
"""

import json
import sys
import time

from herald_client import AuthenticatedClient
from herald_client.api.deliveries import get_delivery, list_dead_letters, list_event_deliveries
from herald_client.api.endpoints import create_endpoint
from herald_client.api.events import create_event, get_event
from herald_client.api.replays import create_replay, get_replay
from herald_client.api.tenants import create_tenant, create_token
from herald_client.models import (
    AcceptedOut,
    DeadLetterPage,
    DeliveryDetail,
    DeliveryPage,
    DeliveryState,
    EndpointCreated,
    EndpointIn,
    EventIn,
    EventOut,
    NewTokenOut,
    ReplayIn,
    ReplayOut,
    TenantIn,
    TenantOut,
    TokenIn,
)

TENANT = "client-flow"


def expect(kind, response):
    """The parsed body of a response, which must be of the model `kind`."""
    if not isinstance(response.parsed, kind):
        sys.exit(f"expected {kind.__name__}, got {response.status_code}: {response.content!r}")
    return response.parsed


def poll(what, fetch, done, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}; last: {value}")
        time.sleep(0.05)


def main(base, admin_token, receiver):
    admin = AuthenticatedClient(base_url=base, token=admin_token, raise_on_unexpected_status=True)
    expect(TenantOut, create_tenant.sync_detailed(client=admin, body=TenantIn(id=TENANT)))
    scopes = ["events:write", "read", "manage", "replay"]
    token = expect(NewTokenOut, create_token.sync_detailed(TENANT, client=admin, body=TokenIn(scopes=scopes)))
    # From here on, the tenant's own token.
    api = AuthenticatedClient(base_url=base, token=token.token, raise_on_unexpected_status=True)

    spec = EndpointIn(url=receiver, event_types=["invoice.*"], rate_per_sec=50.0)
    endpoint = expect(EndpointCreated, create_endpoint.sync_detailed(TENANT, client=api, body=spec))
    assert endpoint.secret.startswith("whsec_"), endpoint.secret

    event = EventIn.from_dict({"type": "invoice.paid", "payload": {"amount": 42, "currency": "EUR"}})
    accepted = expect(AcceptedOut, create_event.sync_detailed(TENANT, client=api, body=event))
    assert accepted.deliveries == 1 and not accepted.duplicate, accepted
    stored = expect(EventOut, get_event.sync_detailed(TENANT, accepted.id, client=api))
    assert stored.type_ == "invoice.paid", stored

    page = expect(DeliveryPage, list_event_deliveries.sync_detailed(TENANT, accepted.id, client=api))
    delivery_id = page.data[0].id

    def delivery():
        return expect(DeliveryDetail, get_delivery.sync_detailed(TENANT, delivery_id, client=api))

    dead = poll("the dead letter", delivery, lambda d: d.state == DeliveryState.DEAD)
    assert dead.reason == "permanent:422", dead.reason
    assert [a.status for a in dead.attempt_history] == [422], dead.attempt_history

    letters = expect(DeadLetterPage, list_dead_letters.sync_detailed(TENANT, client=api))
    assert [d.id for d in letters.data] == [delivery_id], letters
    assert letters.counts_by_reason.additional_properties == {"permanent:422": 1}, letters.counts_by_reason

    replay = expect(ReplayOut, create_replay.sync_detailed(TENANT, client=api, body=ReplayIn(ids=[delivery_id])))
    assert replay.selected == 1, replay
    done = poll(
        "the replay",
        lambda: expect(ReplayOut, get_replay.sync_detailed(TENANT, replay.id, client=api)),
        lambda r: r.delivered == 1,
    )
    delivered = poll("the redelivery", delivery, lambda d: d.state == DeliveryState.DELIVERED)
    print(
        json.dumps(
            {
                "endpoint": endpoint.id,
                "event": accepted.id,
                "delivery": delivery_id,
                "replay": done.id,
                "statuses": [a.status for a in delivered.attempt_history],
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
