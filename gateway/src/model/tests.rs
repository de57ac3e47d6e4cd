//! Type filters, ids and the pause rule.

use super::*;
use rand::SeedableRng;

#[test]
fn filters() {
    let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases = [
        (f(&[]), "a.b", true),
        (f(&["invoice.*"]), "invoice.paid", true),
        (f(&["invoice.*"]), "invoice.paid.late", true),
        (f(&["invoice.*"]), "invoice", false),
        (f(&["invoice.*"]), "invoices.paid", false),
        (f(&["invoice.paid"]), "invoice.paid", true),
        (f(&["invoice.paid"]), "invoice.paid2", false),
        (f(&["*"]), "x", true),
    ];
    for (filter, t, want) in cases {
        assert_eq!(type_filter_matches(&filter, t), want, "{filter:?} {t}");
    }
}

#[test]
fn ids_are_time_ordered_and_valid() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let a = new_id("evt", 1_000, &mut rng);
    let b = new_id("evt", 2_000, &mut rng);
    assert!(a < b);
    assert_eq!(a.len(), 4 + 26);
    EventId::parse(&a).unwrap();
    assert!(TenantId::parse("acme-1").is_ok());
    for bad in ["", "Acme", "-x", "a b", &"x".repeat(65)] {
        assert!(TenantId::parse(bad).is_err(), "{bad}");
    }
    assert!(EventId::parse("a/b").is_err());
    assert!(EventId::parse("has space").is_err());
}

#[test]
fn fan_out_keeps_subscriber_order_and_matches_filters() {
    let subs = |list: &[(&str, &[&str], DeliveryOrder)]| -> Vec<Subscriber> {
        list.iter()
            .map(|(id, types, ordering)| Subscriber {
                endpoint: id.to_string(),
                event_types: types.iter().map(|t| t.to_string()).collect(),
                filter: None,
                ordering: *ordering,
                pull: false,
            })
            .collect()
    };
    let subscribers = subs(&[
        ("ep_all", &[], DeliveryOrder::None),
        ("ep_inv", &["invoice.*"], DeliveryOrder::Key),
        ("ep_user", &["user.created"], DeliveryOrder::None),
        ("ep_paid", &["invoice.paid"], DeliveryOrder::Endpoint),
    ]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut event = NewEvent {
        tenant: TenantId::from_stored("acme"),
        id: EventId::from_stored("evt_1"),
        event_type: "invoice.paid".into(),
        payload: "{}".into(),
        fingerprint: String::new(),
        created_at: 1_000,
        expires_at: 2_000,
        ordering_key: Some("cus_1".into()),
        trace: None,
        schema_version: None,
        only: None,
    };
    let out = fan_out(&event, &subscribers, &mut rng);
    let endpoints: Vec<(&str, Option<&str>)> = out.iter().map(|f| (f.endpoint, f.ordering_key)).collect();
    assert_eq!(endpoints, [("ep_all", None), ("ep_inv", Some("cus_1")), ("ep_paid", Some(""))]);
    assert!(out[0].id != out[1].id && out[1].id != out[2].id, "fresh ids: {out:?}");
    event.ordering_key = None;
    let keys: Vec<Option<&str>> = fan_out(&event, &subscribers, &mut rng).iter().map(|f| f.ordering_key).collect();
    assert_eq!(keys, [None, Some(""), Some("")], "no key: the endpoint's default key");
    event.event_type = "order.shipped".into();
    assert!(fan_out(&event, &subscribers[1..], &mut rng).is_empty());
    // A test send reaches its one endpoint, whatever that endpoint's filter.
    event.only = Some(EndpointId::from_stored("ep_paid"));
    let only: Vec<&str> = fan_out(&event, &subscribers, &mut rng).iter().map(|f| f.endpoint).collect();
    assert_eq!(only, ["ep_paid"]);
}

#[test]
fn fan_out_leaves_out_subscribers_whose_content_filter_fails() {
    let filtered = |id: &str, f: serde_json::Value| Subscriber {
        endpoint: id.into(),
        event_types: vec!["invoice.*".into()],
        filter: Some(std::sync::Arc::new(Filter::parse(&f).unwrap())),
        ordering: DeliveryOrder::None,
        pull: false,
    };
    let subscribers = [
        filtered("ep_big", serde_json::json!({"data.amount": {"$gte": 100}})),
        filtered("ep_small", serde_json::json!({"data.amount": {"$lt": 100}})),
        filtered("ep_paid", serde_json::json!({"type": "invoice.paid", "id": "evt_1"})),
        Subscriber {
            endpoint: "ep_any".into(),
            event_types: vec![],
            filter: None,
            ordering: DeliveryOrder::None,
            pull: false,
        },
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut event = NewEvent {
        tenant: TenantId::from_stored("acme"),
        id: EventId::from_stored("evt_1"),
        event_type: "invoice.paid".into(),
        payload: r#"{"amount": 150}"#.into(),
        fingerprint: String::new(),
        created_at: 1_000,
        expires_at: 2_000,
        ordering_key: None,
        trace: None,
        schema_version: None,
        only: None,
    };
    let to = |event: &NewEvent, rng: &mut rand::rngs::StdRng| -> Vec<String> {
        fan_out(event, &subscribers, rng).iter().map(|f| f.endpoint.to_string()).collect()
    };
    assert_eq!(to(&event, &mut rng), ["ep_big", "ep_paid", "ep_any"]);
    event.payload = r#"{"amount": 5}"#.into();
    assert_eq!(to(&event, &mut rng), ["ep_small", "ep_paid", "ep_any"]);
    // The event-type filter comes first: a content filter does not widen it.
    event.event_type = "user.created".into();
    assert_eq!(to(&event, &mut rng), ["ep_any"]);
    // A test send reaches its one endpoint, whatever its content filter.
    event.only = Some(EndpointId::from_stored("ep_big"));
    assert_eq!(to(&event, &mut rng), ["ep_big"]);
}

#[test]
fn ordering_keys_are_visible_ascii_of_bounded_length() {
    assert!(validate_ordering_key("cus_123:eu").is_ok());
    for bad in ["", "with space", "tab\t", "é", &"k".repeat(MAX_ORDERING_KEY + 1)] {
        assert!(validate_ordering_key(bad).is_err(), "{bad:?}");
    }
    assert!(validate_ordering_key(&"k".repeat(MAX_ORDERING_KEY)).is_ok());
}

#[test]
#[rustfmt::skip]
fn the_pause_rule() {
    let spec = EndpointSpec::for_test("http://127.0.0.1:1/");
    const NOW: Millis = 1_000_000;
    //  state                     paused_until        → sendable at NOW
    let cases = [
        (EndpointState::Active,   None,               Sendable::Yes),
        (EndpointState::Active,   Some(NOW + 1),      Sendable::Yes),
        (EndpointState::Paused,   Some(NOW - 1),      Sendable::Yes),
        (EndpointState::Paused,   Some(NOW),          Sendable::Yes),
        (EndpointState::Paused,   Some(NOW + 1),      Sendable::PausedUntil(NOW + 1)),
        (EndpointState::Paused,   None,               Sendable::No),
        (EndpointState::Disabled, None,               Sendable::No),
        (EndpointState::Disabled, Some(NOW - 1),      Sendable::No),
    ];
    for (state, paused_until, want) in cases {
        let mut e = Endpoint::new(EndpointId::from_stored("ep_1"), TenantId::from_stored("t_1"), spec.clone(), 0);
        (e.state, e.paused_until) = (state, paused_until);
        assert_eq!(e.sendable_at(NOW), want, "{state:?} paused until {paused_until:?}");
    }
}
