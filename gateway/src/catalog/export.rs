//! A tenant's catalog as an OpenAPI 3.1 document: one entry of `webhooks` per event type,
//! whose request body is the envelope a receiver gets by default (`model::envelope`) with
//! the type's latest schema as `data`, and its examples. Customers generate receiver
//! types from it. Pure.

use serde_json::{Map, Value, json};

use super::DIALECT;
use crate::model::EventType;

/// The document for `types` (a tenant's own and inherited types, by name).
pub fn openapi(title: &str, version: &str, types: &[EventType]) -> Value {
    let mut webhooks = Map::new();
    let mut schemas = Map::new();
    for t in types {
        let key = component_name(&t.name);
        if let Some(schema) = &t.schema {
            schemas.insert(key.clone(), rebase_refs(schema.clone(), &format!("#/components/schemas/{key}")));
        }
        webhooks.insert(t.name.clone(), json!({"post": operation(t, &key)}));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "The webhooks Herald sends: each request is signed (Standard Webhooks) and its body is the default envelope around the event's payload.",
        },
        "jsonSchemaDialect": DIALECT,
        "webhooks": webhooks,
        "components": {"schemas": schemas},
    })
}

/// The request Herald sends for type `t` (its schema under `key`): signed, with its
/// envelope as body and the type's examples.
fn operation(t: &EventType, key: &str) -> Value {
    let mut media = json!({"schema": envelope(t, key)});
    let examples = examples(t);
    if !examples.is_empty() {
        media["examples"] = Value::Object(examples);
    }
    let mut operation = json!({
        "operationId": key,
        "summary": t.name,
        "parameters": signature_headers(),
        "requestBody": {"required": true, "content": {"application/json": media}},
        "responses": {"2XX": {"description": "Received: any 2xx acknowledges the delivery; anything else is retried"}},
    });
    if !t.description.is_empty() {
        operation["description"] = json!(t.description);
    }
    if t.deprecated {
        operation["deprecated"] = json!(true);
    }
    if t.schema.is_some() {
        // Which version of the type's schema `data` is (an endpoint's pin, else the latest).
        operation["x-herald-schema-version"] = json!(t.version);
    }
    operation
}

/// The default envelope's schema, with the type's schema (under `key`) as `data`.
fn envelope(t: &EventType, key: &str) -> Value {
    let data = match &t.schema {
        Some(_) => json!({"$ref": format!("#/components/schemas/{key}")}),
        None => json!({}),
    };
    json!({
        "type": "object",
        "required": ["id", "type", "timestamp", "data"],
        "properties": {
            "id": {"type": "string", "description": "The event's id (`evt_…`), the same on every retry."},
            "type": {"const": t.name},
            "timestamp": {"type": "string", "format": "date-time"},
            "data": data,
        },
    })
}

/// The type's example payloads, each in an envelope, as `example0`, `example1`, ….
fn examples(t: &EventType) -> Map<String, Value> {
    t.examples
        .iter()
        .enumerate()
        .map(|(i, payload)| {
            let envelope = json!({
                "id": "evt_2qdbm4a2v5nhcx0sfz1rrh2t6a",
                "type": t.name,
                "timestamp": "2026-01-01T00:00:00.000Z",
                "data": payload,
            });
            (format!("example{i}"), json!({"value": envelope}))
        })
        .collect()
}

/// The Standard Webhooks headers every request carries.
fn signature_headers() -> Value {
    let header = |name: &str, description: &str| json!({"name": name, "in": "header", "required": true, "description": description, "schema": {"type": "string"}});
    json!([
        header("webhook-id", "The message id: the same on every retry of a delivery."),
        header("webhook-timestamp", "Unix seconds when this attempt was signed."),
        header(
            "webhook-signature",
            "`v1,<base64 HMAC-SHA256>` and/or `v1a,<base64 ed25519>` of `id.timestamp.body`, per the endpoint's \
             `signatures` (space-separated, v1 first, when several keys are live)."
        ),
    ])
}

/// A components key for a type name (`^[a-zA-Z0-9._-]+$`: `:` becomes `_`).
fn component_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

/// The schema with its local references (`#/$defs/x`) pointing into `base`, where it is
/// placed in the document (`#/components/schemas/t/$defs/x`).
fn rebase_refs(schema: Value, base: &str) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) if r.starts_with('#') => {
                        let r = format!("{base}{}", &r[1..]);
                        (k, Value::String(r))
                    }
                    (_, v) => (k, rebase_refs(v, base)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| rebase_refs(v, base)).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CatalogOwner;

    #[test]
    fn local_refs_point_into_the_components() {
        let s =
            json!({"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"$ref": "#"}}});
        let out = rebase_refs(s, "#/components/schemas/t");
        assert_eq!(out["properties"]["x"]["$ref"], "#/components/schemas/t/$defs/a");
        assert_eq!(out["properties"]["y"]["$ref"], "#/components/schemas/t");
    }

    #[test]
    fn every_type_is_a_webhook_with_its_examples() {
        let t = EventType {
            owner: CatalogOwner::Operator,
            name: "invoice:paid".into(),
            description: "Paid".into(),
            deprecated: true,
            examples: vec![json!({"n": 1})],
            version: 2,
            schema: Some(json!({"type": "object"})),
            adapters: vec![],
            created_at: 0,
            updated_at: 0,
        };
        let doc = openapi("acme", "1", &[t]);
        let op = &doc["webhooks"]["invoice:paid"]["post"];
        assert_eq!(op["deprecated"], true);
        let media = &op["requestBody"]["content"]["application/json"];
        assert_eq!(media["schema"]["properties"]["data"]["$ref"], "#/components/schemas/invoice_paid");
        assert_eq!(media["examples"]["example0"]["value"]["data"], json!({"n": 1}));
        assert_eq!(doc["components"]["schemas"]["invoice_paid"], json!({"type": "object"}));
    }
}
