//! Content filters on subscriptions: a JSON filter beside an endpoint's `event_types` that
//! an event must match for the endpoint to get a delivery of it. A filter is parsed once,
//! when the endpoint is written, into a typed tree ([`Filter`]); intake's fan-out and
//! replays evaluate that tree against each event ([`filter_subject`]), never the filter's JSON,
//! and every filter that parses evaluates. Pure: no I/O, no clock.
//!
//! The language (`docs/features/filters.md`): an object of clauses, all of which must hold.
//! A clause is a dotted path into the event as delivered (`data.…` is the payload; `type`,
//! `id` and `timestamp` are the envelope's) with a value to equal, an object of operators
//! (`$eq`, `$ne`, `$in`, `$nin`, `$gt`, `$gte`, `$lt`, `$lte`, `$exists`, `$not`) or an
//! object of further path segments; or `$and`/`$or` (arrays of filters) or `$not` (a
//! filter). A path through an array looks into each of its objects, and a test of an array
//! holds when the array or any of its items passes (as MongoDB reads them); a value of
//! another type than the operand compares false, and a missing path fails every test but
//! `$ne`, `$nin` and `$exists: false`.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Number, Value};

/// The longest filter, as compact JSON, in bytes.
pub const MAX_FILTER_BYTES: usize = 16 * 1024;
/// How deeply a filter may nest objects and arrays.
pub const MAX_FILTER_DEPTH: usize = 10;
/// The most JSON values (objects, arrays and scalars, operands included) in a filter.
pub const MAX_FILTER_VALUES: usize = 256;
/// The names a path starts with: the fields of the envelope Herald delivers.
pub const FILTER_ROOTS: [&str; 4] = ["data", "type", "id", "timestamp"];

/// A validated filter: the JSON as written (shown back and stored) and its parsed tree.
#[derive(Debug, Clone)]
pub struct Filter {
    raw: Value,
    root: Node,
}

/// Why a filter was refused: where (`filter.$and[1].data.amount`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct FilterError {
    pub at: String,
    pub reason: String,
}

/// Where an event failed a filter: the clause's place in the filter, the clause, and what
/// the event holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Miss {
    /// The clause's place in the filter (`filter.$and[1].data.amount`).
    pub at: String,
    /// The clause (`data.amount $gt 100`).
    pub clause: String,
    /// What the event holds there (`data.amount is 50`, `data.amount is missing`).
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Node {
    /// Where it was written, for [`Miss::at`].
    at: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    All(Vec<Node>),
    Any(Vec<Node>),
    Not(Box<Node>),
    Test(Path, Op),
}

/// A dotted path, split once.
#[derive(Debug, Clone)]
struct Path {
    text: String,
    keys: Box<[String]>,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(Value),
    Ne(Value),
    In(Vec<Value>),
    Nin(Vec<Value>),
    Cmp(Cmp, Bound),
    Exists(bool),
}

#[derive(Debug, Clone, Copy)]
enum Cmp {
    Gt,
    Gte,
    Lt,
    Lte,
}

/// What `$gt` and the others compare with: numbers with numbers, strings with strings.
#[derive(Debug, Clone)]
enum Bound {
    Number(Number),
    Text(String),
}

impl Filter {
    /// Parses and checks a filter as written, within the size, depth and count limits.
    /// Errors name the place in the filter, starting with `filter`.
    pub fn parse(raw: &Value) -> Result<Filter, FilterError> {
        let size = serde_json::to_string(raw).map_or(usize::MAX, |s| s.len());
        if size > MAX_FILTER_BYTES {
            return Err(refuse("filter", format!("is {size} bytes, over the limit of {MAX_FILTER_BYTES}")));
        }
        let mut values = 0;
        measure(raw, "filter", 1, &mut values)?;
        Ok(Filter { raw: raw.clone(), root: clauses(raw, "filter")? })
    }

    /// The filter as written.
    pub fn as_json(&self) -> &Value {
        &self.raw
    }

    /// Does the event ([`filter_subject`]) match?
    pub fn matches(&self, subject: &Value) -> bool {
        self.root.holds(subject)
    }

    /// Whether the event matches, and if not, the first clause it failed.
    pub fn explain(&self, subject: &Value) -> Result<(), Miss> {
        self.root.explain(subject)
    }
}

/// The event as a filter sees it: the envelope Herald delivers, with the payload as `data`.
pub fn filter_subject(id: &str, event_type: &str, created_at: super::Millis, data: Value) -> Value {
    serde_json::json!({"id": id, "type": event_type, "timestamp": super::rfc3339(created_at), "data": data})
}

impl PartialEq for Filter {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Serialize for Filter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Filter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Filter::parse(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

fn refuse(at: &str, reason: impl Into<String>) -> FilterError {
    FilterError { at: at.to_string(), reason: reason.into() }
}

/// What a JSON value is, in a user's words (`got an array`).
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks the depth (`depth` is `v`'s level) and counts the values, naming the first place
/// past a limit.
fn measure(v: &Value, at: &str, depth: usize, values: &mut usize) -> Result<(), FilterError> {
    *values += 1;
    if *values > MAX_FILTER_VALUES {
        return Err(refuse("filter", format!("has more than {MAX_FILTER_VALUES} values (operands included)")));
    }
    let container = matches!(v, Value::Array(_) | Value::Object(_));
    if container && depth > MAX_FILTER_DEPTH {
        return Err(refuse(at, format!("nests deeper than {MAX_FILTER_DEPTH} levels")));
    }
    match v {
        Value::Object(m) => m.iter().try_for_each(|(k, x)| measure(x, &format!("{at}.{k}"), depth + 1, values)),
        Value::Array(items) => {
            items.iter().enumerate().try_for_each(|(i, x)| measure(x, &format!("{at}[{i}]"), depth + 1, values))
        }
        _ => Ok(()),
    }
}

/// A filter object (the whole filter, an item of `$and`/`$or`, `$not`'s): its clauses, all
/// of which must hold.
fn clauses(v: &Value, at: &str) -> Result<Node, FilterError> {
    let Value::Object(m) = v else {
        return Err(refuse(at, format!("must be an object of clauses, got {}", json_kind(v))));
    };
    if m.is_empty() {
        let hint = if at == "filter" { " (null removes the filter)" } else { "" };
        return Err(refuse(at, format!("is an empty object; a filter needs at least one clause{hint}")));
    }
    let mut nodes = Vec::with_capacity(m.len());
    for (key, x) in m {
        let here = format!("{at}.{key}");
        match key.as_str() {
            "$and" | "$or" => {
                let Value::Array(items) = x else {
                    return Err(refuse(&here, format!("{key} expects an array of filters, got {}", json_kind(x))));
                };
                if items.is_empty() {
                    return Err(refuse(&here, format!("{key} expects at least one filter")));
                }
                let children = items
                    .iter()
                    .enumerate()
                    .map(|(i, f)| clauses(f, &format!("{here}[{i}]")))
                    .collect::<Result<_, _>>()?;
                let kind = if key == "$and" { Kind::All(children) } else { Kind::Any(children) };
                nodes.push(Node { at: here, kind });
            }
            "$not" => nodes.push(Node { kind: Kind::Not(Box::new(clauses(x, &here)?)), at: here }),
            op if op.starts_with('$') => {
                return Err(refuse(
                    &here,
                    format!("{op} is not a clause here (a filter's keys are paths, $and, $or and $not)"),
                ));
            }
            path => {
                let keys = segments(path, &here)?;
                if !FILTER_ROOTS.contains(&keys[0].as_str()) {
                    return Err(refuse(
                        &here,
                        format!("a path starts with data (the payload), type, id or timestamp, not {:?}", keys[0]),
                    ));
                }
                field(keys, &here, x, &mut nodes)?;
            }
        }
    }
    Ok(all(nodes, at))
}

/// One node for several that must all hold.
fn all(mut nodes: Vec<Node>, at: &str) -> Node {
    match nodes.len() {
        1 => nodes.remove(0),
        _ => Node { at: at.to_string(), kind: Kind::All(nodes) },
    }
}

/// A key's dotted segments, none empty.
fn segments(key: &str, at: &str) -> Result<Vec<String>, FilterError> {
    let keys: Vec<String> = key.split('.').map(str::to_string).collect();
    if keys.iter().any(String::is_empty) {
        return Err(refuse(at, format!("{key:?} has an empty path segment")));
    }
    Ok(keys)
}

/// What is written at path `keys` (at `at`): a value to equal, an object of operators, or
/// an object of deeper segments.
fn field(keys: Vec<String>, at: &str, v: &Value, out: &mut Vec<Node>) -> Result<(), FilterError> {
    let Value::Object(m) = v else {
        out.push(test(&keys, at, Op::Eq(v.clone())));
        return Ok(());
    };
    if m.is_empty() {
        return Err(refuse(at, "is an empty object; to match {} write {\"$eq\": {}}"));
    }
    let operators = m.keys().filter(|k| k.starts_with('$')).count();
    if operators == m.len() {
        for (op, operand) in m {
            out.push(operator(&keys, at, op, operand)?);
        }
        return Ok(());
    }
    if operators > 0 {
        return Err(refuse(at, "mixes operators and path segments; to match an object exactly write {\"$eq\": {…}}"));
    }
    for (key, x) in m {
        let here = format!("{at}.{key}");
        let mut deeper = keys.clone();
        deeper.extend(segments(key, &here)?);
        field(deeper, &here, x, out)?;
    }
    Ok(())
}

fn test(keys: &[String], at: &str, op: Op) -> Node {
    let path = Path { text: keys.join("."), keys: keys.into() };
    Node { at: at.to_string(), kind: Kind::Test(path, op) }
}

/// One operator on path `keys`.
fn operator(keys: &[String], at: &str, op: &str, v: &Value) -> Result<Node, FilterError> {
    let list = |v: &Value| match v {
        Value::Array(items) => Ok(items.clone()),
        _ => Err(refuse(at, format!("{op} expects an array, got {}", json_kind(v)))),
    };
    let bound = |v: &Value| match v {
        Value::Number(n) => Ok(Bound::Number(n.clone())),
        Value::String(s) => Ok(Bound::Text(s.clone())),
        _ => Err(refuse(at, format!("{op} expects a number or string, got {}", json_kind(v)))),
    };
    let parsed = match op {
        "$eq" => Op::Eq(v.clone()),
        "$ne" => Op::Ne(v.clone()),
        "$in" => Op::In(list(v)?),
        "$nin" => Op::Nin(list(v)?),
        "$gt" => Op::Cmp(Cmp::Gt, bound(v)?),
        "$gte" => Op::Cmp(Cmp::Gte, bound(v)?),
        "$lt" => Op::Cmp(Cmp::Lt, bound(v)?),
        "$lte" => Op::Cmp(Cmp::Lte, bound(v)?),
        "$exists" => Op::Exists(
            v.as_bool().ok_or_else(|| refuse(at, format!("$exists expects true or false, got {}", json_kind(v))))?,
        ),
        "$not" => {
            let inner = match v {
                Value::Object(m) if !m.is_empty() && m.keys().all(|k| k.starts_with('$')) => m,
                _ => {
                    return Err(refuse(
                        at,
                        "$not on a path expects an object of operators, e.g. {\"$not\": {\"$gt\": 5}}",
                    ));
                }
            };
            let nodes = inner.iter().map(|(o, x)| operator(keys, at, o, x)).collect::<Result<Vec<_>, _>>()?;
            return Ok(Node { at: at.to_string(), kind: Kind::Not(Box::new(all(nodes, at))) });
        }
        _ => {
            return Err(refuse(
                at,
                format!("unknown operator {op} (one of $eq, $ne, $in, $nin, $gt, $gte, $lt, $lte, $exists, $not)"),
            ));
        }
    };
    Ok(test(keys, at, parsed))
}

impl Node {
    fn holds(&self, s: &Value) -> bool {
        match &self.kind {
            Kind::All(nodes) => nodes.iter().all(|n| n.holds(s)),
            Kind::Any(nodes) => nodes.iter().any(|n| n.holds(s)),
            Kind::Not(n) => !n.holds(s),
            Kind::Test(path, op) => op.holds(&path.keys, s),
        }
    }

    fn explain(&self, s: &Value) -> Result<(), Miss> {
        let miss = |clause: String, reason: String| Err(Miss { at: self.at.clone(), clause, reason });
        match &self.kind {
            Kind::All(nodes) => nodes.iter().try_for_each(|n| n.explain(s)),
            Kind::Any(nodes) => {
                let misses: Vec<String> = nodes
                    .iter()
                    .filter_map(|n| n.explain(s).err())
                    .map(|m| format!("{}: {}", m.at, m.reason))
                    .collect();
                if misses.len() < nodes.len() {
                    return Ok(());
                }
                miss("$or".into(), format!("none of its {} filters matched ({})", nodes.len(), misses.join("; ")))
            }
            Kind::Not(n) => match n.holds(s) {
                true => miss(format!("$not {}", n.clause()), "the clause under $not matched".into()),
                false => Ok(()),
            },
            Kind::Test(path, op) => match op.holds(&path.keys, s) {
                true => Ok(()),
                false => miss(self.clause(), found(path, s)),
            },
        }
    }

    /// The clause as text: `data.amount $gt 100`.
    fn clause(&self) -> String {
        match &self.kind {
            Kind::All(nodes) => nodes.iter().map(Node::clause).collect::<Vec<_>>().join(" and "),
            Kind::Any(nodes) => format!("$or of {} filters", nodes.len()),
            Kind::Not(n) => format!("$not {}", n.clause()),
            Kind::Test(path, op) => format!("{} {op}", path.text),
        }
    }
}

/// What the event holds at `path`, for a miss: its (first) value, or that it is missing.
fn found(path: &Path, s: &Value) -> String {
    let mut first = None;
    at_path(s, &path.keys, &mut |v| {
        first = Some(short(v));
        true
    });
    match first {
        Some(v) => format!("{} is {v}", path.text),
        None => format!("{} is missing", path.text),
    }
}

/// A value's JSON, cut to about 100 bytes.
fn short(v: &Value) -> String {
    let mut text = v.to_string();
    if text.len() > 100 {
        let mut end = 100;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |xs: &Vec<Value>| Value::Array(xs.clone());
        match self {
            Op::Eq(x) => write!(f, "$eq {}", short(x)),
            Op::Ne(x) => write!(f, "$ne {}", short(x)),
            Op::In(xs) => write!(f, "$in {}", short(&list(xs))),
            Op::Nin(xs) => write!(f, "$nin {}", short(&list(xs))),
            Op::Exists(b) => write!(f, "$exists {b}"),
            Op::Cmp(c, b) => {
                let name = match c {
                    Cmp::Gt => "$gt",
                    Cmp::Gte => "$gte",
                    Cmp::Lt => "$lt",
                    Cmp::Lte => "$lte",
                };
                match b {
                    Bound::Number(n) => write!(f, "{name} {n}"),
                    Bound::Text(t) => write!(f, "{name} {}", Value::String(t.clone())),
                }
            }
        }
    }
}

impl Op {
    fn holds(&self, keys: &[String], s: &Value) -> bool {
        match self {
            Op::Eq(x) => at_path(s, keys, &mut |v| equal(v, x)),
            Op::Ne(x) => !at_path(s, keys, &mut |v| equal(v, x)),
            Op::In(xs) => at_path(s, keys, &mut |v| xs.iter().any(|x| equal(v, x))),
            Op::Nin(xs) => !at_path(s, keys, &mut |v| xs.iter().any(|x| equal(v, x))),
            Op::Cmp(c, b) => at_path(s, keys, &mut |v| compare(v, b).is_some_and(|o| c.accepts(o))),
            Op::Exists(want) => at_path(s, keys, &mut |_| true) == *want,
        }
    }
}

impl Cmp {
    fn accepts(self, o: Ordering) -> bool {
        match self {
            Cmp::Gt => o == Ordering::Greater,
            Cmp::Gte => o != Ordering::Less,
            Cmp::Lt => o == Ordering::Less,
            Cmp::Lte => o != Ordering::Greater,
        }
    }
}

/// Whether `test` holds for a value at path `keys` of `v`: a numeric key indexes an array,
/// another key looks into each object of an array, and at the end an array passes if it
/// or any of its items does.
fn at_path(v: &Value, keys: &[String], test: &mut dyn FnMut(&Value) -> bool) -> bool {
    let Some((key, rest)) = keys.split_first() else {
        return test(v) || matches!(v, Value::Array(items) if items.iter().any(&mut *test));
    };
    match v {
        Value::Object(m) => m.get(key).is_some_and(|x| at_path(x, rest, test)),
        Value::Array(items) => match key.parse::<usize>() {
            Ok(i) => items.get(i).is_some_and(|x| at_path(x, rest, test)),
            Err(_) => items.iter().any(|x| x.is_object() && at_path(x, keys, test)),
        },
        _ => false,
    }
}

/// JSON equality, numbers by value (`1` equals `1.0`).
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => compare_numbers(x, y) == Some(Ordering::Equal),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| equal(a, b)))
        }
        _ => a == b,
    }
}

/// `v` against a bound: `None` (the test fails) when their types differ.
fn compare(v: &Value, b: &Bound) -> Option<Ordering> {
    match (v, b) {
        (Value::Number(x), Bound::Number(y)) => compare_numbers(x, y),
        (Value::String(x), Bound::Text(y)) => Some(x.as_str().cmp(y.as_str())),
        _ => None,
    }
}

/// Integers exactly, anything else as floats.
fn compare_numbers(x: &Number, y: &Number) -> Option<Ordering> {
    if let (Some(a), Some(b)) = (x.as_i64(), y.as_i64()) {
        return Some(a.cmp(&b));
    }
    if let (Some(a), Some(b)) = (x.as_u64(), y.as_u64()) {
        return Some(a.cmp(&b));
    }
    x.as_f64()?.partial_cmp(&y.as_f64()?)
}

#[cfg(test)]
mod tests;
