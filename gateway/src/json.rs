//! JSON read strictly, with errors that start with the field path: a duplicate key at any
//! depth is refused (parsers disagree on which copy wins), and serde's words ("expected
//! f64", "missing field `url`") become a user's ("rate_per_sec: expected a number"). It
//! knows nothing of HTTP.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Parses `json` into a `Value`, refusing a syntax error (`body: …`) and a key given twice
/// in one object (`a.b: the key is given more than once`).
pub fn parse_strict(json: &[u8]) -> Result<Value, String> {
    walk(json, true)
}

/// Checks `json` as [`parse_strict`] does without building anything.
pub fn check_strict(json: &[u8]) -> Result<(), String> {
    walk(json, false).map(drop)
}

/// Why a typed deserialisation failed, starting with the field at fault. `at` is the path
/// of the value whose deserialisation failed (`serde_path_to_error`'s, `.` at the root);
/// `error` is serde's message.
pub fn describe(at: &str, error: &str) -> String {
    // `at` ends with the field when serde got as far as its key (unknown, duplicate), and
    // is its parent when it did not (missing).
    let prefix = |field: &str| match at {
        "" | "." => field.to_string(),
        named if named == field || named.ends_with(&format!(".{field}")) => named.to_string(),
        parent => format!("{parent}.{field}"),
    };
    let here = if matches!(at, "" | ".") { "body" } else { at };
    if let Some((field, rest)) = quoted(error, "unknown field `") {
        return format!("{}: unknown field{}", prefix(field), rest.replace(", expected", "; expected"));
    }
    if let Some((field, _)) = quoted(error, "missing field `") {
        return format!("{}: required", prefix(field));
    }
    if let Some((field, _)) = quoted(error, "duplicate field `") {
        return format!("{}: the key is given more than once", prefix(field));
    }
    for kind in ["invalid type: ", "invalid value: "] {
        if let Some((got, expected)) = error.strip_prefix(kind).and_then(|r| r.rsplit_once(", expected ")) {
            return format!("{here}: expected {}, got {}", expected_words(expected), got_words(got));
        }
    }
    match error {
        "invalid digit found in string" | "cannot parse integer from empty string" => {
            format!("{here}: expected a whole number")
        }
        "number too large to fit in target type" => format!("{here}: the number is too large"),
        "number too small to fit in target type" => format!("{here}: the number is too small"),
        "invalid float literal" => format!("{here}: expected a number"),
        "provided string was not `true` or `false`" => format!("{here}: expected true or false"),
        _ => format!("{here}: {error}"),
    }
}

/// `message` (which starts with a path, or `body`) as said of the value at `parent`:
/// `within("events[2]", "type: required")` is `events[2].type: required`, and
/// `within("payload", "body: must be …")` is `payload: must be …`. The one way a message
/// gets the path of what contains its field.
pub fn within(parent: &str, message: &str) -> String {
    match message.strip_prefix("body: ") {
        Some(rest) => format!("{parent}: {rest}"),
        None if message.starts_with('[') => format!("{parent}{message}"),
        None => format!("{parent}.{message}"),
    }
}

/// What a JSON value is, in a user's words (`got an array`); the vocabulary's, which a
/// content filter's refusals use too.
pub use crate::model::json_kind as kind;

/// A `T` read from a JSON object only. serde's derived structs also take an array of their
/// fields in order (`["evt_1", "a.b", {}]`), which no user means: through `Object` that is
/// refused as `expected a JSON object, got an array`.
pub struct Object<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Only<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Only(std::marker::PhantomData)).map(Object)
    }
}

/// serde_json's message without its ` at line L column C` suffix.
pub fn message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match (e.line(), text.rfind(" at line ")) {
        (1.., Some(cut)) => text[..cut].to_string(),
        _ => text,
    }
}

/// `error` after `lead` and up to the closing backquote, and what follows it.
fn quoted<'e>(error: &'e str, lead: &str) -> Option<(&'e str, &'e str)> {
    error.strip_prefix(lead)?.split_once('`')
}

/// serde's name of the value it got in a user's words (JSON's, not Rust's).
fn got_words(got: &str) -> &str {
    match got {
        "sequence" => "an array",
        "map" => "an object",
        "unit value" => "null",
        got => got,
    }
}

/// serde's name of an expected type in a user's words.
fn expected_words(expected: &str) -> String {
    match expected {
        "f64" | "f32" => "a number".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number, 0 or more".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "an array".into(),
        "a map" => "an object".into(),
        "a borrowed string" => "a string".into(),
        e if e.starts_with("struct ") => "an object".into(),
        e => e.to_string(),
    }
}

fn walk(json: &[u8], keep: bool) -> Result<Value, String> {
    let state = RefCell::new(State::default());
    let mut de = serde_json::Deserializer::from_slice(json);
    let parsed = Walk { state: &state, keep }.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| state.into_inner().duplicate.unwrap_or_else(|| format!("body: {e}")))
}

/// The path walked to the current value, and the duplicate found, if any.
#[derive(Default)]
struct State {
    path: Vec<String>,
    duplicate: Option<String>,
}

/// Visits any JSON value, building it when `keep`.
#[derive(Clone, Copy)]
struct Walk<'s> {
    state: &'s RefCell<State>,
    keep: bool,
}

impl Walk<'_> {
    fn leaf(self, value: impl FnOnce() -> Value) -> Value {
        if self.keep { value() } else { Value::Null }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(self.leaf(|| Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(self.leaf(|| Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(self.leaf(|| Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(self.leaf(|| Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(self.leaf(|| Value::String(v.to_string())))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            self.state.borrow_mut().path.push(format!("[{}]", items.len()));
            let item = seq.next_element_seed(self)?;
            self.state.borrow_mut().path.pop();
            match item {
                Some(v) if self.keep => items.push(v),
                Some(_) => items.push(Value::Null),
                None => break,
            }
        }
        Ok(self.leaf(|| Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let (mut seen, mut object) = (HashSet::new(), serde_json::Map::new());
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                let mut state = self.state.borrow_mut();
                let at = render(&state.path, &key);
                state.duplicate = Some(format!("{at}: the key is given more than once"));
                return Err(de::Error::custom("duplicate key"));
            }
            self.state.borrow_mut().path.push(key.clone());
            let value = map.next_value_seed(self)?;
            self.state.borrow_mut().path.pop();
            if self.keep {
                object.insert(key, value);
            }
        }
        Ok(self.leaf(|| Value::Object(object)))
    }
}

/// `a.b[2].key`.
fn render(path: &[String], key: &str) -> String {
    let mut out = String::new();
    for segment in path.iter().map(String::as_str).chain([key]) {
        if !out.is_empty() && !segment.starts_with('[') {
            out.push('.');
        }
        out.push_str(segment);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_named_with_its_path() {
        let cases = [
            (r#"{"id": "a", "id": "b"}"#, "id: the key is given more than once"),
            (r#"{"retry": {"base": "1s", "base": "2s"}}"#, "retry.base: the key is given more than once"),
            (r#"{"a": [1, {"k": 1, "k": 2}]}"#, "a[1].k: the key is given more than once"),
        ];
        for (json, expected) in cases {
            assert_eq!(parse_strict(json.as_bytes()), Err(expected.to_string()), "{json}");
            assert_eq!(check_strict(json.as_bytes()), Err(expected.to_string()), "{json}");
        }
    }

    #[test]
    fn a_strict_parse_equals_serde_json_parse() {
        let text = r#"{"a": [1, -2, 2.5, "x", null, true, {"b": {}}], "c": 18446744073709551615}"#;
        assert_eq!(parse_strict(text.as_bytes()), Ok(serde_json::from_str::<Value>(text).unwrap()));
        assert_eq!(parse_strict(b"{\"a\": 1} x").unwrap_err(), "body: trailing characters at line 1 column 10");
        assert!(parse_strict(b"{\"a\": ").unwrap_err().starts_with("body: EOF"));
        assert_eq!(check_strict(text.as_bytes()), Ok(()));
    }

    #[test]
    fn a_message_is_put_within_its_parent() {
        assert_eq!(within("events[2]", "type: required"), "events[2].type: required");
        assert_eq!(within("events[2]", "[0]: expected a string"), "events[2][0]: expected a string");
        assert_eq!(within("payload", "body: trailing characters"), "payload: trailing characters");
        assert_eq!(
            within("payload", "a.b: the key is given more than once"),
            "payload.a.b: the key is given more than once"
        );
    }

    #[test]
    fn an_object_is_never_read_from_an_array() {
        #[derive(Debug, serde::Deserialize)]
        struct Pair {
            #[allow(dead_code)]
            a: u8,
        }
        let read = |json: &str| {
            let mut de = serde_json::Deserializer::from_str(json);
            serde_path_to_error::deserialize::<_, Vec<Object<Pair>>>(&mut de)
                .map(|v| v.len())
                .map_err(|e| describe(&e.path().to_string(), &message(e.inner())))
        };
        assert_eq!(read(r#"[{"a": 1}]"#), Ok(1));
        assert_eq!(read("[[1]]"), Err("[0]: expected a JSON object, got an array".to_string()));
        assert_eq!(
            read(r#"[{"a": "x"}]"#),
            Err("[0].a: expected a whole number, 0 or more, got string \"x\"".to_string())
        );
    }

    #[test]
    fn serde_words_become_field_first() {
        let cases = [
            (".", "unknown field `foo`, expected `url` or `id`", "foo: unknown field; expected `url` or `id`"),
            (
                "retry.bse",
                "unknown field `bse`, expected one of `base`",
                "retry.bse: unknown field; expected one of `base`",
            ),
            ("retry", "missing field `base`", "retry.base: required"),
            (".", "missing field `url`", "url: required"),
            (
                "rate_per_sec",
                "invalid type: string \"fast\", expected f64",
                "rate_per_sec: expected a number, got string \"fast\"",
            ),
            (
                "burst",
                "invalid value: integer `-1`, expected u32",
                "burst: expected a whole number, 0 or more, got integer `-1`",
            ),
            (
                "retry",
                "invalid type: integer `1`, expected struct RetryIn",
                "retry: expected an object, got integer `1`",
            ),
            ("limit", "invalid digit found in string", "limit: expected a whole number"),
            (".", "something else", "body: something else"),
        ];
        for (at, error, expected) in cases {
            assert_eq!(describe(at, error), expected);
        }
    }
}
