"""Console page loads with a large store: 10,000 endpoints and 1,000,000 deliveries (with
an attempt each, 100,000 events) in one tenant's SQLite file, seeded directly (a `herald
serve` run first creates the schema), then a `herald serve` on it and the browser's page
loads (console_flow.py --measure). Bounded: seeding takes about a minute.

Usage: large_store.py HERALD_BINARY WORK_DIR [ENDPOINTS DELIVERIES]
"""

import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request

ADMIN = "console-large-store-admin-token-0123456789"
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, work, port):
    env = {"PATH": os.environ.get("PATH", ""), "HERALD_SERVER_ADMIN_TOKEN": ADMIN,
           "HERALD_SERVER_LISTEN": f"127.0.0.1:{port}", "HERALD_STORE_URL": f"sqlite://{work}/herald.db",
           "HERALD_PLUGINS_DIR": f"{work}/plugins", "HERALD_PLUGINS_CACHE_DIR": f"{work}/plugin-cache",
           "HERALD_LOG_LEVEL": "warn", "HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS": "true"}
    node = subprocess.Popen([binary, "serve"], env=env, cwd=work, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return node
        except OSError:
            pass
        if time.monotonic() > deadline or node.poll() is not None:
            node.kill()
            raise RuntimeError("herald serve did not get ready")
        time.sleep(0.2)


def call(port, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {ADMIN}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def stop(node):
    node.send_signal(signal.SIGTERM)
    node.wait(timeout=30)


def seed(db, n_endpoints, n_deliveries, now):
    """Endpoints copied from the one the API created; deliveries fanned out 10 per event."""
    rng = random.Random(16)
    con = sqlite3.connect(db)
    spec, types = con.execute("SELECT spec, event_types FROM endpoints LIMIT 1").fetchone()
    con.execute("DELETE FROM endpoints")
    eps = [f"ep_{i:026d}" for i in range(n_endpoints)]
    con.executemany(
        "INSERT INTO endpoints (id, tenant_id, spec, event_types, state, created_at, updated_at) VALUES (?, 'big', ?, ?, ?, ?, ?)",
        ((e, spec, types, "active" if i % 50 else "paused", now - 86_400_000 + i, now) for i, e in enumerate(eps)))
    per_event = 10
    con.executemany(
        "INSERT INTO events (tenant_id, id, type, payload, created_at, expires_at) VALUES ('big', ?, ?, ?, ?, ?)",
        ((f"evt_{i:026d}", f"invoice.t{i % 20}", '{"n":%d}' % i, now - 86_400_000 + i * 800, now + 86_400_000)
         for i in range(n_deliveries // per_event)))

    def deliveries():
        for i in range(n_deliveries):
            ev, at = i // per_event, now - 86_400_000 + (i // per_event) * 800
            roll = rng.random()
            state, reason, nxt = ("delivered", None, None)
            if roll < 0.05:
                state, reason = "dead", rng.choice(["exhausted", "permanent:422", "expired"])
            elif roll < 0.08:
                # Not due for a day: the node under test has no work to do.
                state, nxt = "waiting", now + 86_400_000
            yield (f"dlv_{i:026d}", f"evt_{ev:026d}", eps[rng.randrange(n_endpoints)], f"invoice.t{ev % 20}",
                   state, 1, nxt, reason, 200 if state == "delivered" else 500, at, at + 300)

    con.executemany(
        "INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, next_attempt_at, "
        "reason, last_status, created_at, updated_at) VALUES (?, 'big', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", deliveries())
    con.execute(
        "INSERT INTO attempts (id, delivery_id, number, started_at, duration_ms, status, verdict, decided_by, endpoint_id) "
        "SELECT 'att' || substr(id, 4), id, 1, updated_at - 250, 20 + (rowid % 200), last_status, "
        "CASE state WHEN 'delivered' THEN 'delivered' ELSE 'retry' END, 'default', endpoint_id FROM deliveries")
    con.commit()
    con.execute("ANALYZE")
    con.close()


def main():
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    n_endpoints = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    n_deliveries = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000
    os.makedirs(work, exist_ok=True)
    port = free_port()
    node = serve(binary, work, port)
    try:
        call(port, "POST", "/v1/tenants", {"id": "big"})
        call(port, "POST", "/v1/tenants/big/endpoints", {"url": "http://127.0.0.1:9/hook"})
    finally:
        stop(node)
    start = time.monotonic()
    seed(f"{work}/herald.db", n_endpoints, n_deliveries, int(time.time() * 1000))
    seeded = round(time.monotonic() - start, 1)
    node = serve(binary, work, port)
    try:
        api = {}
        for name, path in [("overview", "/v1/overview"), ("endpoints_page", "/v1/tenants/big/endpoints?limit=50&health=true"),
                           ("deliveries_page", "/v1/tenants/big/deliveries?limit=50&order=desc"),
                           ("dead_letters_page", "/v1/tenants/big/dead-letters?limit=100"),
                           ("tenant_series", "/v1/tenants/big/series")]:
            t = time.monotonic()
            call(port, "GET", path)
            api[name] = round((time.monotonic() - t) * 1000, 1)
        out = subprocess.run([sys.executable, os.path.join(HERE, "console_flow.py"), "--measure",
                              f"http://127.0.0.1:{port}", ADMIN, os.path.join(work, "screenshots")],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        print(json.dumps({"endpoints": n_endpoints, "deliveries": n_deliveries, "seed_seconds": seeded,
                          "api_first_call_ms": api, "browser": json.loads(out.stdout)}, indent=1))
    finally:
        stop(node)


if __name__ == "__main__":
    main()
