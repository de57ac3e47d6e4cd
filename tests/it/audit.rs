//! The audit log. The walk takes every write operation of the live `/openapi.json` and
//! calls it twice: refused (a 4xx: bad input, an unknown id, a conflict), after which the
//! route has no new entry, and accepted, after which it has exactly one, naming the route,
//! the actor, the client and no secret. An operation the walk's table does not know fails
//! it. Beside it: a repeat that changes nothing leaves no entry, and the listings filter
//! and page.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, TestGateway, with_custom_section};

use crate::plugins::plugin_bytes;
use crate::portal::{mint, open};

tests::backends!(
    every_write_route_leaves_an_entry_and_a_refused_write_none,
    the_audit_listings_filter_and_page,
    a_portal_session_sees_its_endpoints_entries_only
);

const WAIT: Duration = Duration::from_secs(30);
const T: &str = "/v1/tenants/acme";
const WRITES: [&str; 4] = ["post", "put", "patch", "delete"];

/// A query value, percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every entry of `route`, newest first.
async fn entries(api: &Api, route: &str) -> anyhow::Result<Vec<Value>> {
    let r = api.get(&format!("/v1/audit?limit=1000&route={}", encode(route)), ADMIN_TOKEN).await?.expect(200)?;
    Ok(r.json["data"].as_array().cloned().unwrap_or_default())
}

/// What the walk works on: objects made for each write to act on, and what must never
/// show in the log.
struct World {
    gw: TestGateway,
    _rx: FakeReceiver,
    _dead_rx: FakeReceiver,
    endpoint: String,
    doomed_endpoint: String,
    /// An endpoint that asks for verification (`POST …/verify` is refused on the others).
    verified_endpoint: String,
    /// A `poll` endpoint, and a cursor of its to acknowledge.
    poll_endpoint: String,
    poll_cursor: String,
    /// An endpoint of kind `listen` (`POST …/listen` is refused on the others).
    listen_endpoint: String,
    token_id: String,
    session_id: String,
    code: String,
    replay: String,
    dead: String,
    secrets: Vec<String>,
}

async fn world(backend: Backend) -> anyhow::Result<World> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    // Two dead letters at once (422), then it hangs: a replay of one stays running.
    let dead_rx = FakeReceiver::start().await?;
    dead_rx.script([Answer::status(422), Answer::status(422)]);
    dead_rx.set_default(Answer::hang());
    let example = json!({"name": "order.created", "examples": [{"n": 1}]});
    api.post(&format!("{T}/event-types"), ADMIN_TOKEN, example).await?.expect(201)?;
    for name in ["t.patched", "t.doomed"] {
        api.post(&format!("{T}/event-types"), ADMIN_TOKEN, json!({"name": name})).await?.expect(201)?;
    }
    for name in ["op.patched", "op.doomed"] {
        api.post("/v1/event-types", ADMIN_TOKEN, json!({"name": name})).await?.expect(201)?;
    }
    let endpoint = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["order.created"]})).await?;
    let doomed = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["none.ever"]})).await?;
    let dead_ep = api.endpoint("acme", json!({"url": dead_rx.url(), "event_types": ["dies"]})).await?;
    let verified = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["none.ever"], "verify": true})).await?;
    let polled = api.endpoint("acme", json!({"kind": "poll", "event_types": ["order.created"]})).await?;
    let poll_endpoint = polled["id"].as_str().context("id")?.to_string();
    let read = api.get(&format!("{T}/endpoints/{poll_endpoint}/poll"), ADMIN_TOKEN).await?.expect(200)?;
    let poll_cursor = read.json["next_cursor"].as_str().context("next_cursor")?.to_string();
    let listen =
        api.endpoint("acme", json!({"url": "listen://dev", "kind": "listen", "event_types": ["none.ever"]})).await?;
    let mut secrets = vec![];
    for e in [&endpoint, &doomed, &dead_ep, &verified] {
        secrets.push(e["secret"].as_str().context("secret")?.to_string());
    }
    let token = api.post(&format!("{T}/tokens"), ADMIN_TOKEN, json!({"scopes": ["read"]})).await?.expect(201)?;
    secrets.push(token.json["token"].as_str().context("token")?.to_string());
    for name in ["p-roll", "p-doomed"] {
        api.raw("PUT", &format!("{T}/plugins/{name}"), Some(ADMIN_TOKEN), plugin_bytes("classify_409"))
            .await?
            .expect(200)?;
    }
    let second = with_custom_section(plugin_bytes("classify_409"), "second");
    api.raw("PUT", &format!("{T}/plugins/p-roll"), Some(ADMIN_TOKEN), second).await?.expect(200)?;
    let session = mint(api, "acme", json!({})).await?;
    let exchanged = mint(api, "acme", json!({})).await?;
    let url = exchanged["url"].as_str().context("url")?;
    let code = url.split_once("#code=").context("code")?.1.to_string();
    secrets.push(code.clone());
    for n in 0..2 {
        api.event("acme", json!({"type": "dies", "payload": {"n": n}})).await?.expect(202)?;
    }
    let dead = api
        .wait_for(&format!("{T}/dead-letters?endpoint={}", dead_ep["id"].as_str().context("id")?), WAIT, |v| {
            v["data"].as_array().is_some_and(|d| d.len() == 2)
        })
        .await?;
    let dead: Vec<String> =
        dead["data"].as_array().into_iter().flatten().filter_map(|d| d["id"].as_str()).map(String::from).collect();
    let replay = api.post(&format!("{T}/replays"), ADMIN_TOKEN, json!({"ids": [dead[0]]})).await?.expect(202)?;
    Ok(World {
        endpoint: endpoint["id"].as_str().context("id")?.to_string(),
        doomed_endpoint: doomed["id"].as_str().context("id")?.to_string(),
        verified_endpoint: verified["id"].as_str().context("id")?.to_string(),
        poll_endpoint,
        poll_cursor,
        listen_endpoint: listen["id"].as_str().context("id")?.to_string(),
        token_id: token.json["id"].as_str().context("token id")?.to_string(),
        session_id: session["id"].as_str().context("session id")?.to_string(),
        replay: replay.json["id"].as_str().context("replay id")?.to_string(),
        dead: dead[1].clone(),
        code,
        secrets,
        gw,
        _rx: rx,
        _dead_rx: dead_rx,
    })
}

/// One call: a path and a body (JSON, or a plugin's bytes).
struct Call(String, Vec<u8>);

fn json_call(path: impl Into<String>, body: Value) -> Call {
    Call(path.into(), body.to_string().into_bytes())
}

/// How the walk calls a write operation: refused, then accepted. `None`: unknown to the
/// walk, which fails it.
struct Step {
    refused: Call,
    accepted: Call,
    audited: Audited,
}

/// What a route leaves in the log.
#[derive(Clone, Copy, PartialEq)]
enum Audited {
    /// One entry per accepted call, none for a refused one.
    Yes,
    /// The trials of a filter are posted but write nothing: both calls are accepted and
    /// neither leaves an entry.
    Reads,
    /// Posted events and a `poll` consumer's acknowledgements are data, not configuration:
    /// refused or accepted, no entry.
    Data,
}

fn step(w: &World, method: &str, path: &str) -> Option<Step> {
    let at = |p: &str| p.replace("{tenant}", "acme");
    let id = |v: &str| at(path).replace("{id}", v).replace("{name}", v);
    let write = |refused: Call, accepted: Call| Some(Step { refused, accepted, audited: Audited::Yes });
    let data = |refused: Call, accepted: Call| Some(Step { refused, accepted, audited: Audited::Data });
    match (method, path) {
        ("post", "/v1/tenants") => {
            write(json_call(path, json!({"id": "acme"})), json_call(path, json!({"id": "acme2"})))
        }
        ("post", "/v1/tenants/{tenant}/tokens") => {
            write(json_call(at(path), json!({"scopes": ["nope"]})), json_call(at(path), json!({"scopes": ["read"]})))
        }
        ("delete", "/v1/tenants/{tenant}/tokens/{id}") => {
            write(json_call(id("tok_nope"), json!({})), json_call(id(&w.token_id), json!({})))
        }
        ("post", "/v1/tenants/{tenant}/endpoints") => write(
            json_call(at(path), json!({"url": "not a url"})),
            json_call(at(path), json!({"url": "http://127.0.0.1:9/x"})),
        ),
        ("patch", "/v1/tenants/{tenant}/endpoints/{id}") => write(
            json_call(id(&w.endpoint), json!({"url": "nope"})),
            json_call(id(&w.endpoint), json!({"description": "audited"})),
        ),
        ("delete", "/v1/tenants/{tenant}/endpoints/{id}") => {
            write(json_call(id("ep_nope"), json!({})), json_call(id(&w.doomed_endpoint), json!({})))
        }
        (
            "post",
            "/v1/tenants/{tenant}/endpoints/{id}/enable"
            | "/v1/tenants/{tenant}/endpoints/{id}/pause"
            | "/v1/tenants/{tenant}/endpoints/{id}/rotate-secret",
        ) => write(json_call(id("ep_nope"), json!({})), json_call(id(&w.endpoint), json!({}))),
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/verify") => {
            write(json_call(id(&w.endpoint), json!({})), json_call(id(&w.verified_endpoint), json!({})))
        }
        // A listener's answer is a delivery's result: data, like a posted event. One no
        // attempt waits for is taken as such (`taken: false`); a malformed one is refused.
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/listen") => data(
            json_call(id(&w.listen_endpoint), json!({"request": "r1"})),
            json_call(id(&w.listen_endpoint), json!({"request": "r1", "status": 200})),
        ),
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/test-send") => write(
            json_call(id(&w.endpoint), json!({"event_type": "never.heard.of"})),
            json_call(id(&w.endpoint), json!({"event_type": "order.created"})),
        ),
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/test-filter") => Some(Step {
            refused: json_call(id(&w.endpoint), json!({"payload": {"n": 1}})),
            accepted: json_call(id(&w.endpoint), json!({"payload": {"n": 2}})),
            audited: Audited::Reads,
        }),
        ("post", "/v1/tenants/{tenant}/test-filter") => {
            let body = json!({"filter": {"data.n": 1}, "payload": {"n": 1}});
            let (refused, accepted) = (json_call(at(path), body.clone()), json_call(at(path), body));
            Some(Step { refused, accepted, audited: Audited::Reads })
        }
        ("post", "/v1/tenants/{tenant}/portal-sessions") => {
            write(json_call(at(path), json!({"endpoints": ["ep_nope"]})), json_call(at(path), json!({})))
        }
        ("delete", "/v1/tenants/{tenant}/portal-sessions/{id}") => {
            write(json_call(id("ps_nope"), json!({})), json_call(id(&w.session_id), json!({})))
        }
        ("post", "/v1/portal-sessions/exchange") => {
            write(json_call(path, json!({"code": "hpc_nope"})), json_call(path, json!({"code": w.code})))
        }
        ("put", "/v1/tenants/{tenant}/branding") => {
            write(json_call(at(path), json!({"accent": "red"})), json_call(at(path), json!({"name": "Acme"})))
        }
        ("put", "/v1/tenants/{tenant}/catalog") => write(
            json_call(at(path), json!({"schema_validation": "loud"})),
            json_call(at(path), json!({"schema_validation": "warn"})),
        ),
        ("post", "/v1/tenants/{tenant}/event-types") | ("post", "/v1/event-types") => {
            write(json_call(at(path), json!({"name": "bad name!"})), json_call(at(path), json!({"name": "new.type"})))
        }
        ("patch", "/v1/tenants/{tenant}/event-types/{name}") => write(
            json_call(id("t.nope"), json!({"description": "x"})),
            json_call(id("t.patched"), json!({"description": "x"})),
        ),
        ("delete", "/v1/tenants/{tenant}/event-types/{name}") => {
            write(json_call(id("t.nope"), json!({})), json_call(id("t.doomed"), json!({})))
        }
        ("patch", "/v1/event-types/{name}") => write(
            json_call(id("op.nope"), json!({"description": "x"})),
            json_call(id("op.patched"), json!({"description": "x"})),
        ),
        ("delete", "/v1/event-types/{name}") => {
            write(json_call(id("op.nope"), json!({})), json_call(id("op.doomed"), json!({})))
        }
        ("post", "/v1/tenants/{tenant}/events") => data(
            json_call(at(path), json!({"payload": {"n": 1}})),
            json_call(at(path), json!({"type": "order.created", "payload": {"n": 1}})),
        ),
        // A consumer's acknowledgement settles deliveries, as a push's 2xx does: data.
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/poll/ack") => data(
            json_call(id(&w.poll_endpoint), json!({"cursor": "nope"})),
            json_call(id(&w.poll_endpoint), json!({"cursor": w.poll_cursor})),
        ),
        ("post", "/v1/tenants/{tenant}/events/batch") => data(
            json_call(at(path), json!({"events": [{"payload": {"n": 2}}]})),
            json_call(at(path), json!({"events": [{"type": "order.created", "payload": {"n": 2}}]})),
        ),
        ("post", "/v1/tenants/{tenant}/replays") => write(
            json_call(at(path), json!({"filter": {"endpoint": "ep_nope"}})),
            json_call(at(path), json!({"ids": [w.dead]})),
        ),
        ("post", "/v1/tenants/{tenant}/replays/{id}/cancel") => {
            write(json_call(id("rpl_nope"), json!({})), json_call(id(&w.replay), json!({})))
        }
        ("put", "/v1/tenants/{tenant}/plugins/{name}") => {
            write(Call(id("p-new"), b"not a plugin".to_vec()), Call(id("p-new"), plugin_bytes("classify_409")))
        }
        ("put", "/v1/tenants/{tenant}/plugins/{name}/config") => {
            let config = json!({"values": {"on_409": "retry"}, "secrets": {"token": "plugin-config-secret"}});
            write(json_call(id("p-nope"), config.clone()), json_call(id("p-roll"), config))
        }
        ("post", "/v1/tenants/{tenant}/plugins/{name}/rollback") => {
            write(json_call(id("p-roll"), json!({"version": 7})), json_call(id("p-roll"), json!({"version": 1})))
        }
        ("delete", "/v1/tenants/{tenant}/plugins/{name}") => {
            write(json_call(id("p-nope"), json!({})), json_call(id("p-doomed"), json!({})))
        }
        _ => None,
    }
}

/// Every write operation of `doc`, as (method, path).
fn writes(doc: &Value) -> anyhow::Result<BTreeSet<(String, String)>> {
    let paths = doc["paths"].as_object().context("paths")?;
    Ok(paths
        .iter()
        .flat_map(|(path, item)| item.as_object().into_iter().flatten().map(move |(m, _)| (m.clone(), path.clone())))
        .filter(|(m, _)| WRITES.contains(&m.as_str()))
        .collect())
}

/// Calls `step` of `route` and checks the log: refused leaves nothing, accepted one entry.
async fn walk_one(
    w: &World,
    method: &str,
    route: &str,
    step: Step,
    failures: &mut Vec<String>,
) -> anyhow::Result<Value> {
    let api = &w.gw.api;
    let method = method.to_uppercase();
    let route = format!("{method} {route}");
    let before = entries(api, &route).await?.len();
    let refused = api.raw(&method, &step.refused.0, Some(ADMIN_TOKEN), step.refused.1).await?;
    let after_refused = entries(api, &route).await?;
    match step.audited {
        Audited::Reads if !(200..300).contains(&refused.status) => {
            failures.push(format!("{route}: {} {}", refused.status, refused.text))
        }
        Audited::Yes | Audited::Data if !(400..500).contains(&refused.status) => {
            failures.push(format!("{route}: the refused call got {} {}", refused.status, refused.text))
        }
        _ => {}
    }
    if after_refused.len() != before {
        failures.push(format!("{route}: a refused write left an entry: {:?}", after_refused.first()));
    }
    let accepted = api.raw(&method, &step.accepted.0, Some(ADMIN_TOKEN), step.accepted.1).await?;
    if !(200..300).contains(&accepted.status) {
        failures.push(format!("{route}: the accepted call got {} {}", accepted.status, accepted.text));
        return Ok(Value::Null);
    }
    let after = entries(api, &route).await?;
    let want = before + usize::from(step.audited == Audited::Yes);
    if after.len() != want {
        failures.push(format!("{route}: {} entries after an accepted write, want {want}: {after:?}", after.len()));
        return Ok(Value::Null);
    }
    if let Some(e) = after.first().filter(|_| step.audited == Audited::Yes) {
        // A portal link's exchange is authenticated by its code alone.
        let actor = if route.ends_with("/exchange") { "anonymous" } else { "admin" };
        let ok = e["route"] == route.as_str() && e["actor"] == actor && e["client"] == "127.0.0.1";
        if !ok {
            failures.push(format!("{route}: the entry is {e}"));
        }
    }
    Ok(accepted.json)
}

/// The secrets an answer carries: a new token, a signing secret, a portal link's code.
fn secrets_in(answer: &Value) -> Vec<String> {
    let mut found: Vec<String> =
        ["token", "secret"].iter().filter_map(|k| answer[*k].as_str()).map(String::from).collect();
    if let Some((_, code)) = answer["url"].as_str().and_then(|u| u.split_once("#code=")) {
        found.push(code.to_string());
    }
    found
}

async fn every_write_route_leaves_an_entry_and_a_refused_write_none(backend: Backend) -> anyhow::Result<()> {
    let mut w = world(backend).await?;
    let api = &w.gw.api;
    let doc = api.raw("GET", "/openapi.json", None, "").await?.expect(200)?.json;
    let (mut uncovered, mut failures) = (Vec::new(), Vec::new());
    let operations = writes(&doc)?;
    ensure!(operations.len() > 30, "the document lists {} write operations", operations.len());
    for (method, path) in &operations {
        let Some(step) = step(&w, method, path) else {
            uncovered.push(format!("{} {path}", method.to_uppercase()));
            continue;
        };
        let answer = walk_one(&w, method, path, step, &mut failures).await?;
        w.secrets.extend(secrets_in(&answer));
    }
    ensure!(uncovered.is_empty(), "write operations the walk does not know: {uncovered:?}");
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    // Events are data: no entry names one, though the world and the walk posted some.
    let events = api.get("/v1/audit?kind=event", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(events.json["data"] == json!([]), "{}", events.text);
    // A repeat that changes nothing leaves nothing: the walk cancelled the replay already.
    let cancel = "POST /v1/tenants/{tenant}/replays/{id}/cancel";
    let before = entries(api, cancel).await?.len();
    api.post(&format!("{T}/replays/{}/cancel", w.replay), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    ensure!(entries(api, cancel).await?.len() == before, "a cancel that changed nothing left an entry");
    // What the accepted writes answered with that is secret: new tokens and signing secrets.
    let log = api.get("/v1/audit?limit=1000", ADMIN_TOKEN).await?.expect(200)?;
    w.secrets.push("plugin-config-secret".into());
    for s in &w.secrets {
        ensure!(!log.text.contains(s.as_str()), "the audit log names a secret: {s}");
    }
    // Field names, never values: the plugin config's entry names `secrets`.
    let config = entries(api, "PUT /v1/tenants/{tenant}/plugins/{name}/config").await?;
    ensure!(config[0]["fields"] == json!(["secrets", "values"]), "{}", config[0]);
    Ok(())
}

async fn the_audit_listings_filter_and_page(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    let since = api.get("/v1/audit", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(since.json["data"] == json!([]), "{}", since.text);
    for t in ["acme", "other"] {
        api.tenant(t).await?;
    }
    let manager = api
        .post(&format!("{T}/tokens"), ADMIN_TOKEN, json!({"scopes": ["manage", "read", "events:write"]}))
        .await?
        .expect(201)?;
    let (manager_id, manager) = (
        manager.json["id"].as_str().context("id")?.to_string(),
        manager.json["token"].as_str().context("token")?.to_string(),
    );
    let ep =
        api.post(&format!("{T}/endpoints"), &manager, json!({"url": "http://127.0.0.1:9/x"})).await?.expect(201)?;
    let ep = ep.json["id"].as_str().context("id")?.to_string();
    for n in 0..3 {
        api.call("PATCH", &format!("{T}/endpoints/{ep}"), &manager, Some(json!({"description": format!("v{n}")})))
            .await?
            .expect(200)?;
    }
    // Events are data, not configuration: posting one leaves no entry.
    let r = api.post(&format!("{T}/events"), &manager, json!({"id": "ev-1", "type": "a.b", "payload": {}})).await?;
    ensure!(r.status < 300, "{}", r.text);
    // By actor, by resource, by route.
    let by_actor = api
        .get(&format!("/v1/audit?actor={}", encode(&format!("token:{manager_id}"))), ADMIN_TOKEN)
        .await?
        .expect(200)?;
    ensure!(by_actor.json["data"].as_array().map(Vec::len) == Some(4), "{}", by_actor.text);
    let by_resource = api.get(&format!("/v1/audit?kind=endpoint&resource={ep}"), ADMIN_TOKEN).await?.expect(200)?;
    let data = by_resource.json["data"].as_array().cloned().unwrap_or_default();
    ensure!(data.len() == 4, "{}", by_resource.text);
    ensure!(data[0]["fields"] == json!(["description"]) && data[3]["fields"] == json!(["url"]), "{}", by_resource.text);
    // The tenant's own listing, with a read token: nothing of the other tenant's.
    api.post("/v1/tenants/other/tokens", ADMIN_TOKEN, json!({"scopes": ["read"]})).await?.expect(201)?;
    let own = api.get(&format!("{T}/audit?limit=1000"), &manager).await?.expect(200)?;
    let own = own.json["data"].as_array().cloned().unwrap_or_default();
    ensure!(own.len() == 5 && own.iter().all(|e| e["tenant"] == "acme"), "{own:?}");
    let all = api.get("/v1/audit?limit=1000", ADMIN_TOKEN).await?.expect(200)?;
    let all = all.json["data"].as_array().cloned().unwrap_or_default();
    ensure!(all.len() == 8, "{all:?}");
    // Pages of 3 walk every entry once, newest first.
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let q = after.as_ref().map(|a| format!("&after={a}")).unwrap_or_default();
        let page = api.get(&format!("/v1/audit?limit=3{q}"), ADMIN_TOKEN).await?.expect(200)?;
        paged.extend(page.json["data"].as_array().cloned().unwrap_or_default());
        match page.json["next_after"].as_str() {
            Some(a) => after = Some(a.to_string()),
            None => break,
        }
        ensure!(paged.len() <= all.len(), "paging does not end");
    }
    ensure!(paged == all, "paged {paged:?}\nall {all:?}");
    // A time window: nothing before the first entry, everything from it.
    let first = all.last().context("entries")?["at"].as_str().context("at")?.to_string();
    let until = api.get(&format!("/v1/audit?until={}", encode(&first)), ADMIN_TOKEN).await?.expect(200)?;
    ensure!(until.json["data"] == json!([]), "{}", until.text);
    let from = api.get(&format!("/v1/audit?limit=1000&since={}", encode(&first)), ADMIN_TOKEN).await?.expect(200)?;
    ensure!(from.json["data"].as_array().map(Vec::len) == Some(all.len()), "{}", from.text);
    // Bad filters name themselves; a tenant's token cannot read the operator's log.
    let later = "2030-01-01T00:00:00Z";
    for (query, named) in [
        ("/v1/audit?since=yesterday", "since"),
        (&format!("/v1/audit?since={later}&until={}", encode(&first)), "until"),
        ("/v1/audit?limit=0", "limit"),
        ("/v1/audit?after=ep_123", "after"),
        ("/v1/audit?tenant=Not%20A%20Tenant", "tenant"),
        ("/v1/audit?colour=red", "colour"),
        ("/v1/tenants/acme/audit?tenant=other", "tenant"),
    ] {
        let bad = api.get(query, ADMIN_TOKEN).await?.expect(400)?;
        ensure!(bad.json["error"]["message"].as_str().is_some_and(|m| m.contains(named)), "{query}: {}", bad.text);
    }
    api.get("/v1/audit", &manager).await?.expect(403)?;
    Ok(())
}

/// The `data` of a listing answered 200.
async fn listed(api: &Api, path: &str, token: &str) -> anyhow::Result<Vec<Value>> {
    let r = api.get(path, token).await?.expect(200)?;
    Ok(r.json["data"].as_array().cloned().unwrap_or_default())
}

async fn a_portal_session_sees_its_endpoints_entries_only(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let e = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/x"})).await?;
        ids.push(e["id"].as_str().context("id")?.to_string());
    }
    let (mine, theirs) = (&ids[0], &ids[1]);
    api.post(&format!("{T}/tokens"), ADMIN_TOKEN, json!({"scopes": ["read"]})).await?.expect(201)?;
    let limited_session = mint(api, "acme", json!({"endpoints": [mine]})).await?;
    let limited = open(api, &limited_session).await?;
    let whole = open(api, &mint(api, "acme", json!({})).await?).await?;
    // The limited session changes its endpoint: the entry names the session.
    let patch = json!({"description": "the customer's"});
    api.call("PATCH", &format!("{T}/endpoints/{mine}"), &limited, Some(patch)).await?.expect(200)?;
    let seen = listed(api, &format!("{T}/audit"), &limited).await?;
    ensure!(
        seen.len() == 2 && seen.iter().all(|e| e["kind"] == "endpoint" && e["resource"] == mine.as_str()),
        "{seen:?}"
    );
    let actor = format!("portal:{}", limited_session["id"].as_str().context("session id")?);
    ensure!(seen[0]["actor"] == actor.as_str() && seen[0]["fields"] == json!(["description"]), "{seen:?}");
    let other = listed(api, &format!("{T}/audit?resource={theirs}"), &limited).await?;
    ensure!(other.is_empty(), "{other:?}");
    // A session over every endpoint sees every endpoint's entries, and nothing else (no
    // token, no portal session).
    let seen = listed(api, &format!("{T}/audit?limit=1000"), &whole).await?;
    ensure!(seen.len() == 3 && seen.iter().all(|e| e["kind"] == "endpoint"), "{seen:?}");
    let bad = api.get(&format!("{T}/audit?kind=token"), &whole).await?.expect(400)?;
    ensure!(bad.text.contains("kind"), "{}", bad.text);
    // The operator sees them all.
    let all = listed(api, &format!("{T}/audit?limit=1000"), ADMIN_TOKEN).await?;
    ensure!(all.iter().any(|e| e["kind"] == "token") && all.iter().any(|e| e["kind"] == "portal-session"), "{all:?}");
    Ok(())
}
