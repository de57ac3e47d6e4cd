//! Content filters on endpoints: events that match arrive and the others get no delivery,
//! bad filters are refused naming the place with nothing written, replays honour the filter
//! as it is now, and the test-filter routes say where an event fails.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, Received, TestGateway};

tests::backends!(
    matching_events_arrive_and_the_others_get_no_delivery,
    a_bad_filter_is_refused_naming_the_place_and_nothing_is_written,
    a_replay_honours_the_filter_as_it_is_now,
    the_test_filter_routes_say_where_an_event_fails,
);

const WAIT: Duration = Duration::from_secs(30);
const T: &str = "/v1/tenants/acme";

/// A typical filter: big invoices in two currencies, from any customer but the test one.
fn big_invoices() -> Value {
    json!({"data.amount": {"$gte": 100}, "data.currency": {"$in": ["usd", "eur"]},
           "$not": {"data.customer.id": "cus_test"}})
}

fn event_ids(got: &[Received]) -> BTreeSet<String> {
    got.iter().filter_map(|r| r.header("webhook-id").map(str::to_string)).collect()
}

/// Each event's deliveries, by endpoint id.
async fn endpoints_of(api: &Api, event: &str) -> anyhow::Result<BTreeSet<String>> {
    let r = api.get(&format!("{T}/events/{event}/deliveries"), ADMIN_TOKEN).await?.expect(200)?;
    let list = r.json["data"].as_array().cloned().unwrap_or_default();
    Ok(list.iter().filter_map(|d| d["endpoint_id"].as_str().map(str::to_string)).collect())
}

async fn matching_events_arrive_and_the_others_get_no_delivery(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let (filtered_rx, all_rx) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    gw.api.tenant("acme").await?;
    let filtered = gw.api.endpoint("acme", json!({"url": filtered_rx.url(), "filter": big_invoices()})).await?;
    let all = gw.api.endpoint("acme", json!({"url": all_rx.url()})).await?;
    assert_eq!(filtered["filter"], big_invoices(), "the filter reads back as written");
    assert_eq!(all["filter"], Value::Null);
    let events = [
        ("evt_big_usd", json!({"amount": 150, "currency": "usd", "customer": {"id": "cus_1"}}), true),
        ("evt_big_eur_float", json!({"amount": 100.0, "currency": "eur", "customer": {"id": "cus_2"}}), true),
        ("evt_small", json!({"amount": 99, "currency": "usd", "customer": {"id": "cus_1"}}), false),
        ("evt_gbp", json!({"amount": 500, "currency": "gbp", "customer": {"id": "cus_1"}}), false),
        ("evt_test_customer", json!({"amount": 500, "currency": "usd", "customer": {"id": "cus_test"}}), false),
        ("evt_amount_text", json!({"amount": "500", "currency": "usd"}), false),
        ("evt_no_amount", json!({"currency": "usd"}), false),
        ("evt_not_an_object", json!([1, 2, 3]), false),
    ];
    for (id, payload, _) in &events {
        let r =
            gw.api.event("acme", json!({"id": id, "type": "invoice.paid", "payload": payload})).await?.expect(202)?;
        let want = if events.iter().any(|(i, _, m)| i == id && *m) { 2 } else { 1 };
        assert_eq!(r.json["deliveries"], want, "{id}: deliveries at intake");
    }
    // A batch fans out the same way.
    let batch = json!({"events": [
        {"id": "evt_batch_big", "type": "invoice.paid", "payload": {"amount": 1000, "currency": "usd"}},
        {"id": "evt_batch_small", "type": "invoice.paid", "payload": {"amount": 1, "currency": "usd"}},
    ]});
    gw.api.post(&format!("{T}/events/batch"), ADMIN_TOKEN, batch).await?.expect(202)?;
    let total = events.len() + 2;
    let mut want: BTreeSet<String> = events.iter().filter(|e| e.2).map(|e| e.0.to_string()).collect();
    want.insert("evt_batch_big".into());
    // The unfiltered endpoint gets every event; once it has, the filtered one has had
    // every delivery it was given at intake.
    assert_eq!(all_rx.wait_for(total, WAIT).await?.len(), total);
    let got = filtered_rx.wait_for(want.len(), WAIT).await?;
    assert_eq!(event_ids(&got), want);
    let (filtered_id, all_id) = (filtered["id"].as_str().unwrap(), all["id"].as_str().unwrap());
    for (id, _, matches) in &events {
        let on = endpoints_of(&gw.api, id).await?;
        assert_eq!(on.contains(filtered_id), *matches, "{id}: a delivery to the filtered endpoint");
        assert!(on.contains(all_id), "{id}");
    }
    assert_eq!(endpoints_of(&gw.api, "evt_batch_small").await?, BTreeSet::from([all_id.to_string()]));

    // A filter on the envelope's `type`, set by a patch, applies to the next event at once;
    // `null` removes it.
    let path = format!("{T}/endpoints/{filtered_id}");
    let patch = json!({"filter": {"type": {"$in": ["invoice.voided"]}}});
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(patch)).await?.expect(200)?;
    for (id, t) in [("evt_voided", "invoice.voided"), ("evt_paid_again", "invoice.paid")] {
        let body = json!({"id": id, "type": t, "payload": {"amount": 1000, "currency": "usd"}});
        gw.api.event("acme", body).await?.expect(202)?;
    }
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"filter": null}))).await?.expect(200)?;
    assert_eq!(r.json["filter"], Value::Null);
    gw.api.event("acme", json!({"id": "evt_after_null", "type": "x", "payload": {}})).await?.expect(202)?;
    all_rx.wait_for(total + 3, WAIT).await?;
    let got = filtered_rx.wait_for(want.len() + 2, WAIT).await?;
    want.extend(["evt_voided".to_string(), "evt_after_null".to_string()]);
    assert_eq!(event_ids(&got), want);
    assert!(!endpoints_of(&gw.api, "evt_paid_again").await?.contains(filtered_id));
    Ok(())
}

async fn a_bad_filter_is_refused_naming_the_place_and_nothing_is_written(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let cases = [
        (
            json!({"$and": [{"data.currency": "usd"}, {"data.amount": {"$gt": []}}]}),
            "filter.$and[1].data.amount: $gt expects a number or string, got an array",
        ),
        (json!(5), "filter: must be an object of clauses, got a number"),
        (json!({}), "filter: is an empty object; a filter needs at least one clause (null removes the filter)"),
        (
            json!({"amount": 5}),
            "filter.amount: a path starts with data (the payload), type, id or timestamp, not \"amount\"",
        ),
        (json!({"data.x": {"$regex": "a"}}), "filter.data.x: unknown operator $regex"),
        (json!({"data.x": {"$in": (0..300).collect::<Vec<_>>()}}), "filter: has more than 256 values"),
        ((0..12).fold(json!({"data.x": 1}), |f, _| json!({"$or": [f]})), "nests deeper than 10 levels"),
    ];
    for (filter, want) in &cases {
        let body = json!({"url": "http://127.0.0.1:9/x", "filter": filter});
        let r = api.post(&format!("{T}/endpoints"), ADMIN_TOKEN, body).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(r.status, 422, "{filter}: {}", r.text);
        assert!(message.contains(want), "{filter}: {message:?} does not say {want:?}");
    }
    let listed = api.get(&format!("{T}/endpoints"), ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(listed.json["data"], json!([]), "a refused create writes nothing");

    let ep = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/x", "filter": {"data.n": 1}})).await?;
    let path = format!("{T}/endpoints/{}", ep["id"].as_str().unwrap());
    let before = api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    for (filter, want) in &cases {
        let r =
            api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"filter": filter, "description": "changed"}))).await?;
        assert_eq!(r.status, 422, "{filter}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap_or_default().contains(want), "{}", r.text);
    }
    let after = api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    for field in ["filter", "description", "updated_at"] {
        assert_eq!(after[field], before[field], "{field}: a refused patch writes nothing");
    }
    Ok(())
}

async fn a_replay_honours_the_filter_as_it_is_now(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(422));
    gw.api.tenant("acme").await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1000, "burst": 100})).await?;
    let id = ep["id"].as_str().unwrap();
    for n in 1..=6 {
        gw.api.event("acme", json!({"id": format!("evt_{n}"), "type": "t", "payload": {"n": n}})).await?.expect(202)?;
    }
    gw.api
        .wait_for(&format!("{T}/dead-letters?limit=100"), WAIT, |v| v["data"].as_array().is_some_and(|d| d.len() == 6))
        .await?;
    // Every event was taken with no filter; the replay runs under the one set since.
    let patch = json!({"filter": {"$or": [{"data.n": {"$gte": 5}}, {"data.n": 2}]}});
    gw.api.call("PATCH", &format!("{T}/endpoints/{id}"), ADMIN_TOKEN, Some(patch)).await?.expect(200)?;
    rx.set_default(Answer::status(200));
    let before = rx.count();
    // A batch of 2 a turn: the filter leaves out whole turns' worth and the cursor moves on.
    let body = json!({"filter": {"endpoint": id}, "rate_per_sec": 100, "batch": 2});
    let r = gw.api.post(&format!("{T}/replays"), ADMIN_TOKEN, body).await?.expect(202)?;
    let replay = r.json["id"].as_str().unwrap().to_string();
    let done = gw.api.wait_for(&format!("{T}/replays/{replay}"), WAIT, |v| v["state"] == "done").await?;
    assert_eq!((done["selected"].as_u64(), done["requeued"].as_u64()), (Some(6), Some(3)), "{done}");
    let got = rx.wait_for(before + 3, WAIT).await?;
    let replayed: BTreeSet<String> = event_ids(&got[before..]);
    assert_eq!(replayed, BTreeSet::from(["evt_2".into(), "evt_5".into(), "evt_6".into()]));
    let dead = gw.api.get(&format!("{T}/dead-letters?limit=100"), ADMIN_TOKEN).await?.expect(200)?;
    let mut still: Vec<&str> =
        dead.json["data"].as_array().unwrap().iter().filter_map(|d| d["event_id"].as_str()).collect();
    still.sort_unstable();
    assert_eq!(still, ["evt_1", "evt_3", "evt_4"], "what the filter left out stays among the dead letters");
    assert_eq!(rx.count(), before + 3, "nothing else was sent");
    Ok(())
}

async fn the_test_filter_routes_say_where_an_event_fails(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let reader = api.token("acme", &["read"]).await?;
    let body = json!({"url": "http://127.0.0.1:9/x", "event_types": ["invoice.*"], "filter": big_invoices()});
    let ep = api.endpoint("acme", body).await?;
    let path = format!("{T}/endpoints/{}/test-filter", ep["id"].as_str().unwrap());
    let try_on = |body: Value| {
        let (api, path, reader) = (api.clone(), path.clone(), reader.clone());
        async move { api.post(&path, &reader, body).await?.expect(200).map(|r| r.json) }
    };
    let good = json!({"amount": 150, "currency": "usd", "customer": {"id": "cus_1"}});
    let r = try_on(json!({"type": "invoice.paid", "payload": good})).await?;
    assert_eq!(
        (r["matches"].clone(), r["failed"].clone(), r["filter"].clone()),
        (json!(true), Value::Null, big_invoices())
    );
    let r = try_on(json!({"type": "invoice.paid", "payload": {"amount": 50, "currency": "usd"}})).await?;
    assert_eq!(r["matches"], false);
    assert_eq!(
        r["failed"],
        json!({"at": "filter.data.amount", "clause": "data.amount $gte 100", "reason": "data.amount is 50"})
    );
    let r = try_on(json!({"payload": {"amount": 500, "currency": "usd", "customer": {"id": "cus_test"}}})).await?;
    assert_eq!(r["failed"]["at"], "filter.$not", "{r}");
    let r = try_on(json!({"type": "user.created", "payload": good})).await?;
    assert_eq!((r["matches"].clone(), r["failed"]["at"].clone()), (json!(false), json!("event_types")), "{r}");
    let r = api.post(&path, &reader, json!({"type": "bad type", "payload": {}})).await?.expect(422)?;
    assert!(r.text.contains("type: "), "{}", r.text);
    let missing = format!("{T}/endpoints/ep_nope/test-filter");
    api.post(&missing, &reader, json!({"payload": {}})).await?.expect(404)?;

    // Any filter, without an endpoint.
    let route = format!("{T}/test-filter");
    let body = json!({"filter": {"type": "invoice.paid", "data.items.sku": "b"}, "type": "invoice.paid",
                      "payload": {"items": [{"sku": "a"}, {"sku": "b"}]}});
    let r = api.post(&route, &reader, body).await?.expect(200)?;
    assert_eq!(r.json["matches"], true, "{}", r.text);
    let body = json!({"filter": {"type": "invoice.paid"}, "payload": {}});
    let r = api.post(&route, &reader, body).await?.expect(200)?;
    assert_eq!(r.json["failed"]["reason"], "type is missing", "{}", r.text);
    let body = json!({"filter": {"$or": [{"data.n": {"$lt": "x"}}]}, "payload": {}});
    let r = api.post(&route, &reader, body).await?.expect(200)?;
    assert_eq!(r.json["matches"], false);
    let body = json!({"filter": {"$and": [{"data.n": 1}, {"data.amount": {"$gt": []}}]}, "payload": {}});
    let r = api.post(&route, &reader, body).await?.expect(422)?;
    assert_eq!(r.json["error"]["message"], "filter.$and[1].data.amount: $gt expects a number or string, got an array");
    Ok(())
}
