//! The filter language, table-driven: what matches, what is refused and where.

use serde_json::{Value, json};

use super::*;

/// The event the match tables read: an invoice with a nested customer, a list of line
/// items, tags, a null and a big integer.
fn event() -> Value {
    filter_subject(
        "evt_1",
        "invoice.paid",
        1_700_000_000_000,
        json!({
            "amount": 1999, "currency": "usd", "ratio": 0.5, "paid": true, "note": null,
            "customer": {"id": "cus_1", "tier": "gold", "address": {"country": "FR"}},
            "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 3}],
            "tags": ["vip", "eu"], "big": 18446744073709551615u64,
        }),
    )
}

fn parse(f: Value) -> Filter {
    Filter::parse(&f).unwrap_or_else(|e| panic!("{f}: {e}"))
}

#[test]
fn matches_as_the_table_says() {
    let cases: &[(Value, bool)] = &[
        // Equality, dotted and nested.
        (json!({"data.amount": 1999}), true),
        (json!({"data.amount": 1999.0}), true),
        (json!({"data.amount": 5}), false),
        (json!({"data.amount": "1999"}), false),
        (json!({"data": {"customer": {"tier": "gold", "address.country": "FR"}}}), true),
        (json!({"data": {"customer": {"tier": "gold", "address.country": "DE"}}}), false),
        (json!({"data.customer": {"$eq": {"id": "cus_1", "tier": "gold", "address": {"country": "FR"}}}}), true),
        (json!({"data.customer": {"$eq": {"id": "cus_1"}}}), false),
        (json!({"type": "invoice.paid", "id": "evt_1"}), true),
        (json!({"timestamp": {"$gte": "2023-11-14T00:00:00Z", "$lt": "2023-11-15T00:00:00Z"}}), true),
        // $eq, $ne; a missing path is not equal to anything.
        (json!({"data.currency": {"$eq": "usd"}}), true),
        (json!({"data.currency": {"$ne": "usd"}}), false),
        (json!({"data.missing": {"$ne": "usd"}}), true),
        (json!({"data.missing": {"$eq": "usd"}}), false),
        // null is a value: it equals only null, and a missing path is not null.
        (json!({"data.note": null}), true),
        (json!({"data.missing": null}), false),
        (json!({"data.note": {"$exists": true}}), true),
        (json!({"data.note": {"$ne": null}}), false),
        // $in, $nin.
        (json!({"data.currency": {"$in": ["eur", "usd"]}}), true),
        (json!({"data.currency": {"$in": ["eur"]}}), false),
        (json!({"data.currency": {"$nin": ["eur"]}}), true),
        (json!({"data.missing": {"$nin": ["eur"]}}), true),
        (json!({"data.missing": {"$in": ["eur", null]}}), false),
        // Comparisons: numbers with numbers, strings with strings, anything else false.
        (json!({"data.amount": {"$gt": 1000}}), true),
        (json!({"data.amount": {"$gt": 1999}}), false),
        (json!({"data.amount": {"$gte": 1999}}), true),
        (json!({"data.amount": {"$lt": 1999.5}}), true),
        (json!({"data.amount": {"$lte": 1998}}), false),
        (json!({"data.ratio": {"$gt": 0.25, "$lt": 1}}), true),
        (json!({"data.amount": {"$gt": "1000"}}), false),
        (json!({"data.amount": {"$lt": "1000"}}), false),
        (json!({"data.currency": {"$gt": "eur"}}), true),
        (json!({"data.currency": {"$gt": 1}}), false),
        (json!({"data.paid": {"$gt": 0}}), false),
        (json!({"data.missing": {"$lt": 1}}), false),
        (json!({"data.big": {"$gt": 9223372036854775807i64}}), true),
        (json!({"data.big": {"$lt": -1}}), false),
        // $exists.
        (json!({"data.customer.tier": {"$exists": true}}), true),
        (json!({"data.customer.plan": {"$exists": true}}), false),
        (json!({"data.customer.plan": {"$exists": false}}), true),
        (json!({"data.amount.cents": {"$exists": true}}), false),
        // Arrays: a test holds if the array or an item passes; a key looks into each
        // object; a number indexes.
        (json!({"data.tags": "vip"}), true),
        (json!({"data.tags": ["vip", "eu"]}), true),
        (json!({"data.tags": ["eu", "vip"]}), false),
        (json!({"data.tags": {"$in": ["eu"]}}), true),
        (json!({"data.tags": {"$nin": ["vip"]}}), false),
        (json!({"data.tags": {"$ne": "us"}}), true),
        (json!({"data.items.sku": "b"}), true),
        (json!({"data.items.qty": {"$gt": 2}}), true),
        (json!({"data.items.qty": {"$gt": 3}}), false),
        (json!({"data.items.0.sku": "a"}), true),
        (json!({"data.items.1.sku": "a"}), false),
        (json!({"data.items.5.sku": {"$exists": false}}), true),
        (json!({"data.tags.1": "eu"}), true),
        // $and, $or, $not, at the top and on a path.
        (json!({"$and": [{"data.amount": {"$gt": 1000}}, {"data.currency": "usd"}]}), true),
        (json!({"$and": [{"data.amount": {"$gt": 1000}}, {"data.currency": "eur"}]}), false),
        (json!({"$or": [{"data.currency": "eur"}, {"data.customer.tier": "gold"}]}), true),
        (json!({"$or": [{"data.currency": "eur"}, {"data.customer.tier": "silver"}]}), false),
        (json!({"$not": {"data.currency": "eur"}}), true),
        (json!({"$not": {"data.currency": "usd"}}), false),
        (json!({"data.amount": {"$not": {"$gt": 5000}}}), true),
        (json!({"data.amount": {"$not": {"$gt": 1000, "$lt": 2000}}}), false),
        (
            json!({"$or": [{"$and": [{"type": "invoice.paid"}, {"data.amount": {"$gte": 1999}}]}, {"data.paid": false}]}),
            true,
        ),
    ];
    let e = event();
    for (f, want) in cases {
        let filter = parse(f.clone());
        assert_eq!(filter.matches(&e), *want, "{f}");
        assert_eq!(filter.explain(&e).is_ok(), *want, "explain {f}");
    }
}

#[test]
fn a_payload_that_is_not_an_object_has_no_fields() {
    for data in [json!(null), json!(5), json!("x"), json!([1, 2])] {
        let e = filter_subject("evt_1", "t", 0, data.clone());
        assert!(!parse(json!({"data.amount": 5})).matches(&e), "{data}");
        assert!(parse(json!({"data.amount": {"$exists": false}})).matches(&e), "{data}");
    }
    assert!(parse(json!({"data": 5})).matches(&filter_subject("evt_1", "t", 0, json!(5))));
    assert!(parse(json!({"data": {"$in": [1, 2]}})).matches(&filter_subject("evt_1", "t", 0, json!([2, 3]))));
}

#[test]
fn refusals_name_the_place_and_the_reason() {
    let cases: &[(Value, &str)] = &[
        (json!([]), "filter: must be an object of clauses, got an array"),
        (json!("x"), "filter: must be an object of clauses, got a string"),
        (json!({}), "filter: is an empty object; a filter needs at least one clause (null removes the filter)"),
        (
            json!({"$and": [{"data.currency": "usd"}, {"data.amount": {"$gt": []}}]}),
            "filter.$and[1].data.amount: $gt expects a number or string, got an array",
        ),
        (json!({"data.amount": {"$lte": null}}), "filter.data.amount: $lte expects a number or string, got null"),
        (json!({"data.tags": {"$in": "vip"}}), "filter.data.tags: $in expects an array, got a string"),
        (json!({"data.tags": {"$nin": {}}}), "filter.data.tags: $nin expects an array, got an object"),
        (json!({"data.x": {"$exists": 1}}), "filter.data.x: $exists expects true or false, got a number"),
        (
            json!({"data.x": {"$regex": "a.*"}}),
            "filter.data.x: unknown operator $regex (one of $eq, $ne, $in, $nin, $gt, $gte, $lt, $lte, $exists, $not)",
        ),
        (
            json!({"data": {"x": {"$gt": 1, "y": 2}}}),
            "filter.data.x: mixes operators and path segments; to match an object exactly write {\"$eq\": {…}}",
        ),
        (json!({"data.x": {}}), "filter.data.x: is an empty object; to match {} write {\"$eq\": {}}"),
        (
            json!({"amount": 5}),
            "filter.amount: a path starts with data (the payload), type, id or timestamp, not \"amount\"",
        ),
        (json!({"data..x": 5}), "filter.data..x: \"data..x\" has an empty path segment"),
        (json!({"data": {"x.": 5}}), "filter.data.x.: \"x.\" has an empty path segment"),
        (json!({"$and": {}}), "filter.$and: $and expects an array of filters, got an object"),
        (json!({"$or": []}), "filter.$or: $or expects at least one filter"),
        (json!({"$or": [{"data.x": 1}, 5]}), "filter.$or[1]: must be an object of clauses, got a number"),
        (json!({"$not": {}}), "filter.$not: is an empty object; a filter needs at least one clause"),
        (
            json!({"$nor": [{"data.x": 1}]}),
            "filter.$nor: $nor is not a clause here (a filter's keys are paths, $and, $or and $not)",
        ),
        (
            json!({"data.x": {"$not": 5}}),
            "filter.data.x: $not on a path expects an object of operators, e.g. {\"$not\": {\"$gt\": 5}}",
        ),
        (json!({"data.x": {"$not": {"$in": 5}}}), "filter.data.x: $in expects an array, got a number"),
    ];
    for (f, want) in cases {
        let got = Filter::parse(f).err().unwrap_or_else(|| panic!("{f} was taken"));
        assert_eq!(got.to_string(), *want, "{f}");
    }
}

#[test]
fn limits_are_clear() {
    let mut deep = json!({"data.x": 1});
    for _ in 0..10 {
        deep = json!({"$not": deep});
    }
    let e = Filter::parse(&deep).unwrap_err();
    assert_eq!(e.reason, format!("nests deeper than {MAX_FILTER_DEPTH} levels"));
    assert!(e.at.starts_with("filter.$not.$not."), "{}", e.at);
    let within = (0..MAX_FILTER_DEPTH - 2).fold(json!({"data.x": 1}), |f, _| json!({"$not": f}));
    Filter::parse(&within).unwrap();

    let wide = json!({"data.x": {"$in": (0..MAX_FILTER_VALUES).collect::<Vec<_>>()}});
    assert_eq!(
        Filter::parse(&wide).unwrap_err().to_string(),
        format!("filter: has more than {MAX_FILTER_VALUES} values (operands included)")
    );
    let big = json!({"data.x": "y".repeat(MAX_FILTER_BYTES)});
    assert!(Filter::parse(&big).unwrap_err().to_string().starts_with("filter: is 16"), "over the byte limit");
}

#[test]
fn a_miss_names_the_failing_clause() {
    let e = event();
    let miss = |f: Value| parse(f).explain(&e).unwrap_err();
    let m = miss(json!({"$and": [{"data.currency": "usd"}, {"data.amount": {"$gt": 5000}}]}));
    assert_eq!(
        (m.at.as_str(), m.clause.as_str(), m.reason.as_str()),
        ("filter.$and[1].data.amount", "data.amount $gt 5000", "data.amount is 1999")
    );
    let m = miss(json!({"data.customer.plan": "pro"}));
    assert_eq!(
        (m.clause.as_str(), m.reason.as_str()),
        ("data.customer.plan $eq \"pro\"", "data.customer.plan is missing")
    );
    let m = miss(json!({"$or": [{"data.currency": "eur"}, {"type": "invoice.created"}]}));
    assert_eq!(m.at, "filter.$or");
    assert_eq!(
        m.reason,
        "none of its 2 filters matched (filter.$or[0].data.currency: data.currency is \"usd\"; filter.$or[1].type: type is \"invoice.paid\")"
    );
    let m = miss(json!({"$not": {"data.paid": true}}));
    assert_eq!((m.at.as_str(), m.clause.as_str()), ("filter.$not", "$not data.paid $eq true"));
}

#[test]
fn it_round_trips_as_written() {
    let f = json!({"data": {"amount": {"$gte": 100}}, "$or": [{"type": "a"}, {"type": "b"}]});
    let parsed: Filter = serde_json::from_value(f.clone()).unwrap();
    assert_eq!(serde_json::to_value(&parsed).unwrap(), f);
    let refused = serde_json::from_value::<Filter>(json!({"data.x": {"$gt": [1]}})).unwrap_err();
    assert_eq!(refused.to_string(), "filter.data.x: $gt expects a number or string, got an array");
}
