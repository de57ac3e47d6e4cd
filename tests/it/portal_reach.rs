//! A portal session limited to one endpoint reaches nothing of another, on every route.
//! The walk takes every operation of the live `/openapi.json` and calls it with such a
//! session, with the ids of the other endpoint's objects (its endpoint, events, deliveries,
//! dead letters, replays, plugin) and with listing queries; no answer may name any of them
//! (unless the request did) and the other endpoint's state must be as it was. An operation
//! that the walk's table does not say how to call fails the walk: a route added later is
//! walked, never skipped. Beside it, the two holes the walk was built for: plugins bound
//! out of reach (which a session could replace) and replays (which it could list and read).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, TestGateway, with_custom_section};

use crate::plugins::plugin_bytes;
use crate::portal::{mint, open};

tests::backends!(a_limited_session_reaches_nothing_of_another_endpoint_on_any_route);

const WAIT: Duration = Duration::from_secs(30);
const T: &str = "/v1/tenants/acme";
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// The tenant `acme` with two endpoints: `mine`, which the session is limited to, and
/// `theirs`, with objects of every kind.
struct World {
    gw: TestGateway,
    theirs_rx: FakeReceiver,
    _mine_rx: FakeReceiver,
    mine: String,
    theirs: String,
    /// Sent to `mine` only, delivered; sent to `mine` only, dead; sent to both.
    my_event: String,
    my_dead: String,
    both_event: String,
    /// Sent to `theirs` only.
    their_event: String,
    my_deliveries: Vec<String>,
    /// Every delivery to `theirs` (all dead letters).
    their_deliveries: Vec<String>,
    my_replays: Vec<String>,
    /// By a filter naming `theirs`, by a filter over every endpoint, by ids of theirs.
    their_replays: Vec<String>,
    /// What identifies `theirs` and its objects: none may show in an answer to the session.
    secrets: Vec<String>,
    /// The limited session's token.
    token: String,
}

async fn wait_replay(api: &Api, id: &str) -> anyhow::Result<()> {
    api.wait_for(&format!("{T}/replays/{id}"), WAIT, |v| v["state"] == "done").await?;
    Ok(())
}

async fn replay(api: &Api, body: Value) -> anyhow::Result<String> {
    let r = api.post(&format!("{T}/replays"), ADMIN_TOKEN, body).await?.expect(202)?;
    let id = r.json["id"].as_str().context("replay id")?.to_string();
    wait_replay(api, &id).await?;
    Ok(id)
}

fn ids(list: &Value) -> Vec<String> {
    list["data"].as_array().into_iter().flatten().filter_map(|d| d["id"].as_str().map(str::to_string)).collect()
}

async fn world(backend: Backend) -> anyhow::Result<World> {
    let gw = TestGateway::start_on(backend, &[("HERALD_PORTAL_PLUGINS", "true")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    // `mine` answers 422 (a dead letter at once) to payloads marked dead, `theirs` always.
    let mine_rx = FakeReceiver::start().await?;
    mine_rx.answer_when(|body| String::from_utf8_lossy(body).contains("\"dead\":true").then(|| Answer::status(422)));
    let theirs_rx = FakeReceiver::start().await?;
    theirs_rx.set_default(Answer::status(422));
    for name in ["my-plugin", "their-plugin", "free-plugin"] {
        let r = api.raw("PUT", &format!("{T}/plugins/{name}"), Some(ADMIN_TOKEN), plugin_bytes("classify_409")).await?;
        r.expect(200)?;
    }
    // Each endpoint takes its own type and `both.happened`, and binds its own plugin.
    let endpoint = async |who: &str, rx: &FakeReceiver, plugin: &str| {
        let types = [format!("{who}.happened"), "both.happened".to_string()];
        let body = json!({"url": format!("{}/{who}", rx.url()), "event_types": types, "plugins": {"classify": plugin}});
        api.endpoint("acme", body).await
    };
    let mine = endpoint("mine", &mine_rx, "my-plugin").await?;
    let theirs = endpoint("theirs", &theirs_rx, "their-plugin").await?;
    let (mine, theirs_secret) = (mine["id"].as_str().context("id")?.to_string(), theirs["secret"].clone());
    let theirs = theirs["id"].as_str().context("id")?.to_string();
    let config = json!({"values": {"on_409": "delivered"}, "secrets": {"token": "their-config-secret"}});
    api.call("PUT", &format!("{T}/plugins/their-plugin/config"), ADMIN_TOKEN, Some(config)).await?.expect(200)?;
    let mut events = Vec::new();
    for (ty, payload) in [
        ("mine.happened", json!({"n": 1})),
        ("mine.happened", json!({"dead": true})),
        ("both.happened", json!({"n": 2})),
        ("theirs.happened", json!({"n": 3})),
    ] {
        let r = api.event("acme", json!({"type": ty, "payload": payload})).await?.expect(202)?;
        events.push(r.json["id"].as_str().context("event id")?.to_string());
    }
    let settled = |v: &Value| {
        let data = v["data"].as_array().cloned().unwrap_or_default();
        data.len() == 5 && data.iter().all(|d| matches!(d["state"].as_str(), Some("delivered" | "dead")))
    };
    let all = api.wait_for(&format!("{T}/deliveries?limit=1000"), WAIT, settled).await?;
    let of = |endpoint: &str, state: Option<&str>| -> Vec<String> {
        all["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["endpoint_id"] == endpoint && state.is_none_or(|s| d["state"] == s))
            .filter_map(|d| d["id"].as_str().map(str::to_string))
            .collect()
    };
    let (my_deliveries, their_deliveries) = (of(&mine, None), of(&theirs, None));
    ensure!(my_deliveries.len() == 3 && their_deliveries.len() == 2, "{all}");
    ensure!(of(&theirs, Some("dead")).len() == 2 && of(&mine, Some("dead")).len() == 1, "{all}");
    let my_dead_delivery = of(&mine, Some("dead"))[0].clone();
    // Replays of each kind, one after the other (each re-queues, and its dead letters die again).
    let their_replays = vec![
        replay(api, json!({"filter": {"endpoint": theirs}})).await?,
        replay(api, json!({"filter": {}})).await?,
        replay(api, json!({"ids": [their_deliveries[0]]})).await?,
    ];
    let my_replays = vec![
        replay(api, json!({"filter": {"endpoint": mine}})).await?,
        replay(api, json!({"ids": [my_dead_delivery]})).await?,
    ];
    let token = open(api, &mint(api, "acme", json!({"endpoints": [mine]})).await?).await?;
    let (my_event, my_dead, both_event, their_event) =
        (events[0].clone(), events[1].clone(), events[2].clone(), events[3].clone());
    let mut secrets = vec![theirs.clone(), their_event.clone(), "their-plugin".into(), "their-config-secret".into()];
    secrets.extend(their_deliveries.iter().cloned());
    secrets.extend(their_replays.iter().cloned());
    secrets.push(theirs_rx.url());
    secrets.push(theirs_secret.as_str().context("secret")?.to_string());
    Ok(World {
        gw,
        theirs_rx,
        _mine_rx: mine_rx,
        mine,
        theirs,
        my_event,
        my_dead,
        both_event,
        their_event,
        my_deliveries,
        their_deliveries,
        my_replays,
        their_replays,
        secrets,
        token,
    })
}

/// Everything of `theirs`, as the admin reads it (what changes with time left out).
async fn their_state(w: &World) -> anyhow::Result<Value> {
    let api = &w.gw.api;
    let get =
        async |path: String| -> anyhow::Result<Value> { Ok(api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json) };
    let mut endpoint = get(format!("{T}/endpoints/{}", w.theirs)).await?;
    endpoint.as_object_mut().context("endpoint")?.remove("health");
    let mut plugin = get(format!("{T}/plugins/their-plugin")).await?;
    plugin.as_object_mut().context("plugin")?.remove("stats");
    let mut replays = Vec::new();
    for id in &w.their_replays {
        replays.push(get(format!("{T}/replays/{id}")).await?);
    }
    Ok(json!({
        "endpoint": endpoint,
        "secret": get(format!("{T}/endpoints/{}/secret", w.theirs)).await?,
        "deliveries": get(format!("{T}/deliveries?endpoint={}&limit=1000", w.theirs)).await?,
        "event": get(format!("{T}/events/{}", w.their_event)).await?,
        "plugin": plugin,
        "versions": get(format!("{T}/plugins/their-plugin/versions")).await?,
        "config": get(format!("{T}/plugins/their-plugin/config")).await?,
        "replays": replays,
        "received": w.theirs_rx.count(),
    }))
}

/// What a call's answer must be, beyond naming nothing of `theirs`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// 2xx: the session's own objects and listings.
    Ok,
    /// 4xx: an object out of reach, or a route not for a portal session.
    Refused,
    /// Any answer but a 5xx (reads of the shared catalog).
    Any,
    /// The operator's probes and the document, which answer without a token: the
    /// session's token must get no more than a caller with none (the same status, nothing
    /// of the other endpoint that the anonymous answer lacks).
    Public,
}

struct Call {
    path: String,
    body: Option<Vec<u8>>,
    want: Want,
}

fn call(path: impl Into<String>, body: Option<Value>, want: Want) -> Call {
    Call { path: path.into(), body: body.map(|b| b.to_string().into_bytes()), want }
}

/// How the walk calls each operation: with the other endpoint's ids (refused), and with
/// the session's own ids and listings (answered, naming nothing of the other). `None`:
/// the walk does not know the operation, which fails it.
fn calls(w: &World, method: &str, path: &str) -> Option<Vec<Call>> {
    use Want::*;
    let (mine, theirs) = (&w.mine, &w.theirs);
    let each = |ids: &[String], suffix: &str, body: Option<Value>, want: Want| -> Vec<Call> {
        ids.iter()
            .map(|id| call(path.replace("{tenant}", "acme").replace("{id}", id) + suffix, body.clone(), want))
            .collect()
    };
    let at = |p: &str| p.replace("{tenant}", "acme");
    let their_d = &w.their_deliveries;
    let plugin = |name: &str, want: Want, body: Option<Value>| call(at(path).replace("{name}", name), body, want);
    Some(match (method, path) {
        // The operator's probes and the document: no token needed.
        ("get", "/healthz" | "/readyz" | "/metrics" | "/openapi.json") => vec![call(path, None, Public)],
        ("get", "/v1/whoami") => vec![call(path, None, Ok)],
        // The tenant's public keys: no token needed, so a session gets what anyone gets.
        ("get", "/v1/tenants/{tenant}/jwks.json") => {
            vec![call(at(path), None, Public), call(format!("{}?endpoint={theirs}", at(path)), None, Public)]
        }
        ("post", "/v1/portal-sessions/exchange") => vec![call(path, Some(json!({"code": "hpc_nope"})), Refused)],
        // The operator's routes.
        ("get", "/v1/tenants" | "/v1/overview" | "/v1/event-types" | "/v1/audit") => vec![call(path, None, Refused)],
        // The audit log: its endpoints' entries only.
        ("get", "/v1/tenants/{tenant}/audit") => vec![
            call(at(path), None, Ok),
            call(at(path) + "?limit=1", None, Ok),
            call(at(path) + &format!("?resource={theirs}"), None, Ok),
            call(at(path) + "?kind=plugin", None, Refused),
        ],
        ("post", "/v1/tenants") => vec![call(path, Some(json!({"id": "evil"})), Refused)],
        ("post", "/v1/event-types") => vec![call(path, Some(json!({"name": "x.y"})), Refused)],
        ("get" | "patch" | "delete", "/v1/event-types/{name}") | ("get", "/v1/event-types/{name}/versions") => {
            vec![call(path.replace("{name}", "theirs.happened"), Some(json!({})), Refused)]
        }
        ("get" | "post", "/v1/tenants/{tenant}/tokens" | "/v1/tenants/{tenant}/portal-sessions") => {
            vec![call(at(path), Some(json!({"scopes": ["read"]})), Refused)]
        }
        ("delete", "/v1/tenants/{tenant}/tokens/{id}" | "/v1/tenants/{tenant}/portal-sessions/{id}") => {
            vec![call(at(path).replace("{id}", "x"), None, Refused)]
        }
        ("get", "/v1/tenants/{tenant}/branding") => vec![call(at(path), None, Ok)],
        ("put", "/v1/tenants/{tenant}/branding") => vec![call(at(path), Some(json!({"name": "evil"})), Refused)],
        ("get" | "put", "/v1/tenants/{tenant}/catalog") => {
            vec![call(at(path), Some(json!({"schema_validation": "off"})), Refused)]
        }
        // The event catalog: the tenant's, shared by its endpoints; a session only reads it.
        ("get", "/v1/tenants/{tenant}/event-types" | "/v1/tenants/{tenant}/event-types/openapi.json") => {
            vec![call(at(path), None, Ok)]
        }
        ("get", "/v1/tenants/{tenant}/event-types/{name}" | "/v1/tenants/{tenant}/event-types/{name}/versions") => {
            vec![call(at(path).replace("{name}", "theirs.happened"), None, Any)]
        }
        ("post", "/v1/tenants/{tenant}/event-types") => vec![call(at(path), Some(json!({"name": "x.y"})), Refused)],
        ("patch" | "delete", "/v1/tenants/{tenant}/event-types/{name}") => {
            vec![call(at(path).replace("{name}", "theirs.happened"), Some(json!({})), Refused)]
        }
        // Events: a session reads those sent to its endpoints.
        ("post", "/v1/tenants/{tenant}/events") => {
            vec![call(at(path), Some(json!({"type": "theirs.happened", "payload": {}})), Refused)]
        }
        ("post", "/v1/tenants/{tenant}/events/batch") => {
            vec![call(at(path), Some(json!({"events": [{"type": "theirs.happened", "payload": {}}]})), Refused)]
        }
        ("get", "/v1/tenants/{tenant}/events/{id}") => {
            let mut v = each(std::slice::from_ref(&w.their_event), "", None, Refused);
            v.extend(each(&[w.my_event.clone(), w.my_dead.clone(), w.both_event.clone()], "", None, Ok));
            v
        }
        ("get", "/v1/tenants/{tenant}/events/{id}/deliveries") => {
            let mut v = each(std::slice::from_ref(&w.their_event), "", None, Refused);
            v.extend(each(&[w.both_event.clone(), w.my_event.clone()], "", None, Ok));
            v.extend(each(std::slice::from_ref(&w.both_event), "?limit=1", None, Ok));
            v.extend(each(std::slice::from_ref(&w.both_event), &format!("?endpoint={theirs}"), None, Ok));
            v
        }
        // Deliveries and dead letters: listings narrowed, pages included.
        ("get", "/v1/tenants/{tenant}/deliveries" | "/v1/tenants/{tenant}/dead-letters") => [
            String::new(),
            "?limit=1".into(),
            "?limit=1&order=desc".into(),
            format!("?limit=1&after={}", w.my_deliveries[0]),
            "?state=dead".into(),
            format!("?endpoint={theirs}"),
        ]
        .into_iter()
        .map(|q| call(at(path) + &q, None, Ok))
        .collect(),
        ("get", "/v1/tenants/{tenant}/deliveries/{id}") => {
            let mut v = each(their_d, "", None, Refused);
            v.extend(each(&w.my_deliveries, "", None, Ok));
            v
        }
        ("get", "/v1/tenants/{tenant}/series") => vec![
            call(at(path), None, Refused),
            call(at(path) + &format!("?endpoint={theirs}"), None, Refused),
            call(at(path) + &format!("?endpoint={mine}"), None, Ok),
        ],
        // Endpoints: its own only; it cannot add one.
        ("get", "/v1/tenants/{tenant}/endpoints") => [
            String::new(),
            "?limit=1".into(),
            format!("?limit=1&after={mine}"),
            "?health=true".into(),
            "?plugin=their-plugin".into(),
        ]
        .into_iter()
        .map(|q| call(at(path) + &q, None, Ok))
        .collect(),
        ("post", "/v1/tenants/{tenant}/endpoints") => {
            vec![call(at(path), Some(json!({"url": "http://127.0.0.1:9/x"})), Refused)]
        }
        ("get", "/v1/tenants/{tenant}/endpoints/{id}" | "/v1/tenants/{tenant}/endpoints/{id}/secret") => {
            let mut v = each(std::slice::from_ref(theirs), "", None, Refused);
            v.extend(each(std::slice::from_ref(mine), "", None, Ok));
            v
        }
        ("patch", "/v1/tenants/{tenant}/endpoints/{id}") => {
            each(std::slice::from_ref(theirs), "", Some(json!({"url": "http://127.0.0.1:9/stolen"})), Refused)
        }
        ("delete", "/v1/tenants/{tenant}/endpoints/{id}") => each(std::slice::from_ref(theirs), "", None, Refused),
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/enable" | "/v1/tenants/{tenant}/endpoints/{id}/pause") => {
            each(std::slice::from_ref(theirs), "", Some(json!({})), Refused)
        }
        (
            "post",
            "/v1/tenants/{tenant}/endpoints/{id}/rotate-secret" | "/v1/tenants/{tenant}/endpoints/{id}/verify",
        ) => each(std::slice::from_ref(theirs), "", Some(json!({})), Refused),
        // Pull delivery is a `poll` token's, which a session never has: not even its own.
        ("get", "/v1/tenants/{tenant}/endpoints/{id}/poll") => each(&[theirs.clone(), mine.clone()], "", None, Refused),
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/poll/ack") => {
            each(&[theirs.clone(), mine.clone()], "", Some(json!({"cursor": "x"})), Refused)
        }
        // `herald listen` is the tenant's developers', not a customer's: refused even on its own.
        ("get" | "post", "/v1/tenants/{tenant}/endpoints/{id}/listen") => {
            let body = Some(json!({"request": "r1", "status": 200}));
            let mut v = each(std::slice::from_ref(theirs), "", body.clone(), Refused);
            v.extend(each(std::slice::from_ref(mine), "", body, Refused));
            v
        }
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/test-send") => {
            each(std::slice::from_ref(theirs), "", Some(json!({"event_type": "theirs.happened"})), Refused)
        }
        ("post", "/v1/tenants/{tenant}/endpoints/{id}/test-filter") => {
            let body = Some(json!({"payload": {"n": 1}}));
            let mut v = each(std::slice::from_ref(theirs), "", body.clone(), Refused);
            v.extend(each(std::slice::from_ref(mine), "", body, Ok));
            v
        }
        // A filter tried on an event of the body's: nothing of any endpoint.
        ("post", "/v1/tenants/{tenant}/test-filter") => {
            vec![call(at(path), Some(json!({"filter": {"data.n": 1}, "payload": {"n": 1}})), Ok)]
        }
        // Replays: of its endpoints' dead letters only.
        ("post", "/v1/tenants/{tenant}/replays") => vec![
            call(at(path), Some(json!({"filter": {}})), Refused),
            call(at(path), Some(json!({"filter": {"type": "theirs.happened"}})), Refused),
            call(at(path), Some(json!({"filter": {"endpoint": theirs}})), Refused),
            call(at(path), Some(json!({"ids": their_d})), Refused),
            call(at(path), Some(json!({"ids": [w.my_deliveries[0], their_d[0]]})), Refused),
        ],
        ("get", "/v1/tenants/{tenant}/replays") => {
            ["", "?limit=1", "?limit=2"].into_iter().map(|q| call(at(path) + q, None, Ok)).collect()
        }
        ("get", "/v1/tenants/{tenant}/replays/{id}") => {
            let mut v = each(&w.their_replays, "", None, Refused);
            v.extend(each(&w.my_replays, "", None, Ok));
            v
        }
        ("post", "/v1/tenants/{tenant}/replays/{id}/cancel") => each(&w.their_replays, "", None, Refused),
        // Plugins: those bound to its endpoints alone, or to none.
        ("get", "/v1/tenants/{tenant}/plugins") => vec![call(at(path), None, Ok)],
        ("get", "/v1/tenants/{tenant}/plugins/{name}" | "/v1/tenants/{tenant}/plugins/{name}/versions") => {
            vec![plugin("their-plugin", Refused, None), plugin("my-plugin", Ok, None), plugin("free-plugin", Ok, None)]
        }
        ("get", "/v1/tenants/{tenant}/plugins/{name}/config") => {
            vec![plugin("their-plugin", Refused, None), plugin("my-plugin", Ok, None)]
        }
        ("put", "/v1/tenants/{tenant}/plugins/{name}") => {
            let bytes = with_custom_section(plugin_bytes("classify_409"), "the-session's");
            let upload = |name: &str, want| Call { body: Some(bytes.clone()), ..plugin(name, want, None) };
            vec![upload("their-plugin", Refused), upload("free-plugin", Ok)]
        }
        ("put", "/v1/tenants/{tenant}/plugins/{name}/config") => {
            let config = json!({"values": {"on_409": "retry"}});
            vec![plugin("their-plugin", Refused, Some(config.clone())), plugin("my-plugin", Ok, Some(config))]
        }
        ("post", "/v1/tenants/{tenant}/plugins/{name}/rollback") => {
            vec![plugin("their-plugin", Refused, Some(json!({"version": 1})))]
        }
        ("delete", "/v1/tenants/{tenant}/plugins/{name}") => vec![plugin("their-plugin", Refused, None)],
        _ => return None,
    })
}

/// Every operation of `doc`, as (method, path).
fn operations(doc: &Value) -> anyhow::Result<BTreeSet<(String, String)>> {
    let paths = doc["paths"].as_object().context("paths")?;
    Ok(paths
        .iter()
        .flat_map(|(path, item)| item.as_object().into_iter().flatten().map(move |(m, _)| (m.clone(), path.clone())))
        .filter(|(m, _)| METHODS.contains(&m.as_str()))
        .collect())
}

async fn a_limited_session_reaches_nothing_of_another_endpoint_on_any_route(backend: Backend) -> anyhow::Result<()> {
    let w = world(backend).await?;
    let api = &w.gw.api;
    let before = their_state(&w).await?;
    let doc = api.raw("GET", "/openapi.json", None, "").await?.expect(200)?.json;
    let mut uncovered = Vec::new();
    let mut failures = Vec::new();
    let mut walked = 0;
    for (method, path) in operations(&doc)? {
        let Some(calls) = calls(&w, &method, &path) else {
            uncovered.push(format!("{} {path}", method.to_uppercase()));
            continue;
        };
        ensure!(!calls.is_empty(), "{method} {path}: the table calls it no way");
        walked += 1;
        for c in calls {
            let (method, body) = (method.to_uppercase(), c.body.unwrap_or_default());
            let mut sent = format!("{}{}", c.path, String::from_utf8_lossy(&body));
            let anonymous = match c.want {
                Want::Public => Some(api.raw(&method, &c.path, None, body.clone()).await?),
                _ => None,
            };
            // What a caller without a token is told is no more the session's to know.
            if let Some(a) = &anonymous {
                sent.push_str(&a.text);
            }
            // A refusal may come before the body is read, after which the server closes the
            // connection: each call on a connection of its own.
            let close = [("connection", "close")];
            let r = api
                .raw_with(&method, &c.path, Some(&w.token), &close, body)
                .await
                .with_context(|| format!("{method} {}", c.path))?;
            let what = format!("{method} {} → {}", c.path, r.status);
            let shown: Vec<&String> = w.secrets.iter().filter(|s| r.text.contains(*s) && !sent.contains(*s)).collect();
            if !shown.is_empty() {
                failures.push(format!("{what}: names the other endpoint's {shown:?}: {}", r.text));
            }
            let ok = match c.want {
                Want::Ok => (200..300).contains(&r.status),
                Want::Refused => (400..500).contains(&r.status),
                Want::Any => r.status < 500,
                Want::Public => anonymous.is_some_and(|a| a.status == r.status) && r.status < 500,
            };
            if !ok {
                failures.push(format!("{what}: expected {:?}: {}", c.want, r.text));
            }
        }
    }
    ensure!(
        uncovered.is_empty(),
        "operations of /openapi.json the walk does not know how to call with a limited session \
         (add them to `calls`): {uncovered:?}"
    );
    ensure!(walked >= 60, "only {walked} operations walked");
    let after = their_state(&w).await?;
    if before != after {
        failures.push(format!("the other endpoint's state changed:\nbefore {before:#}\nafter {after:#}"));
    }
    ensure!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// Issue 48 item 2: a session limited to some endpoints may only change (or read) plugins
/// bound to its endpoints alone, or to none; the refusal names which binding is out of
/// reach (the hook), never the other endpoint, and the plugin stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_session_changes_only_plugins_bound_within_its_endpoints() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_PORTAL_PLUGINS", "true")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let bytes = plugin_bytes("classify_409");
    for name in ["shared", "theirs-only", "mine-only", "unbound"] {
        api.raw("PUT", &format!("{T}/plugins/{name}"), Some(ADMIN_TOKEN), bytes.clone()).await?.expect(200)?;
    }
    let rx = FakeReceiver::start().await?;
    let mut ids = Vec::new();
    for plugin in ["mine-only", "theirs-only", "shared"] {
        let e = api.endpoint("acme", json!({"url": rx.url(), "plugins": {"classify": plugin}})).await?;
        ids.push(e["id"].as_str().context("id")?.to_string());
    }
    let (mine, other, third) = (&ids[0], &ids[1], &ids[2]);
    let token = open(api, &mint(api, "acme", json!({"endpoints": [mine, third]})).await?).await?;
    // The session's build differs from the admin's, so a replacement would show.
    let its = with_custom_section(bytes.clone(), "the-session's");
    // A refused upload is answered before its body is read, after which the server closes
    // the connection: each upload on a connection of its own.
    let put = async |name: &str| {
        let close = [("connection", "close")];
        api.raw_with("PUT", &format!("{T}/plugins/{name}"), Some(&token), &close, its.clone()).await
    };
    let version = async |name: &str| -> anyhow::Result<Value> {
        let p = api.get(&format!("{T}/plugins/{name}"), ADMIN_TOKEN).await?.expect(200)?.json;
        Ok(json!([p["sha256"], p["version"]]))
    };
    // Bound by endpoints it reaches, or by none: its to change.
    for name in ["mine-only", "unbound", "shared"] {
        put(name).await?.expect(200).with_context(|| name.to_string())?;
    }
    let before = version("theirs-only").await?;
    let r = put("theirs-only").await?.expect(403)?;
    let m = r.json["error"]["message"].as_str().unwrap_or_default();
    ensure!(m.contains("\"theirs-only\"") && m.contains("classify binding") && !m.contains(other.as_str()), "{m}");
    for (method, path, body) in [
        ("GET", "/plugins/theirs-only", None),
        ("GET", "/plugins/theirs-only/versions", None),
        ("GET", "/plugins/theirs-only/config", None),
        ("PUT", "/plugins/theirs-only/config", Some(json!({"values": {"on_409": "retry"}}))),
        ("POST", "/plugins/theirs-only/rollback", Some(json!({"version": 1}))),
        ("DELETE", "/plugins/theirs-only", None),
    ] {
        let r = api.call(method, &format!("{T}{path}"), &token, body).await?;
        ensure!(r.status == 403, "{method} {path}: {} {}", r.status, r.text);
    }
    ensure!(version("theirs-only").await? == before, "the refused upload changed nothing");
    let listed = api.get(&format!("{T}/plugins"), &token).await?.expect(200)?.json;
    let mut names = ids_by(&listed, "name");
    names.sort();
    ensure!(names == ["mine-only", "shared", "unbound"], "{listed}");
    // Once the other endpoint binds `shared` too, it is out of reach, and the refusal says so.
    let bind = json!({"plugins": {"classify": "shared"}});
    api.call("PATCH", &format!("{T}/endpoints/{other}"), ADMIN_TOKEN, Some(bind)).await?.expect(200)?;
    let before = version("shared").await?;
    let r = put("shared").await?.expect(403)?;
    let m = r.json["error"]["message"].as_str().unwrap_or_default();
    ensure!(m.contains("its classify binding is on an endpoint the session does not reach"), "{m}");
    ensure!(version("shared").await? == before, "the refused upload changed nothing");
    Ok(())
}

fn ids_by(list: &Value, key: &str) -> Vec<String> {
    list["data"].as_array().into_iter().flatten().filter_map(|d| d[key].as_str().map(str::to_string)).collect()
}

/// Issue 48 item 3: a session limited to some endpoints lists and reads only the replays of
/// their dead letters: not one by a filter over every endpoint, nor one of another
/// endpoint's (by filter or by ids), and pages never hand it another's id as a cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_session_sees_only_the_replays_within_its_endpoints() -> anyhow::Result<()> {
    let w = world(Backend::Sqlite).await?;
    let api = &w.gw.api;
    let listed = api.get(&format!("{T}/replays"), &w.token).await?.expect(200)?.json;
    let mut seen = ids(&listed);
    seen.sort();
    let mut mine = w.my_replays.clone();
    mine.sort();
    ensure!(seen == mine, "listed {listed}; its own: {mine:?}");
    // One at a time: each page's cursor is a replay it reaches.
    let mut after: Option<String> = None;
    let mut paged = Vec::new();
    for _ in 0..10 {
        let q = after.as_ref().map(|a| format!("&after={a}")).unwrap_or_default();
        let page = api.get(&format!("{T}/replays?limit=1{q}"), &w.token).await?.expect(200)?.json;
        paged.extend(ids(&page));
        match page["next_after"].as_str() {
            Some(next) => {
                ensure!(w.my_replays.iter().any(|r| r == next), "cursor {next} is not its own: {page}");
                after = Some(next.to_string());
            }
            None => break,
        }
    }
    paged.sort();
    ensure!(paged == mine, "paged {paged:?}");
    for id in &w.their_replays {
        let r = api.get(&format!("{T}/replays/{id}"), &w.token).await?;
        ensure!(r.status == 404 && !r.text.contains(&w.theirs), "{id}: {} {}", r.status, r.text);
    }
    for id in &w.my_replays {
        api.get(&format!("{T}/replays/{id}"), &w.token).await?.expect(200)?;
    }
    Ok(())
}
