//! W3C Trace Context (`traceparent`, `tracestate`): what a producer's request or outbox row
//! carries, stored with its event, and the `traceparent` each attempt sends (the event's
//! trace id, a span id of the attempt's own). Pure: span ids are drawn from the rng passed
//! in. A malformed `traceparent` is no context at all (the W3C rule: ignore it, never
//! refuse the request); a `tracestate` travels only beside a valid `traceparent`.

use rand::Rng;

/// The request header naming the caller's span.
pub const TRACEPARENT: &str = "traceparent";
/// The vendors' state that travels with it, passed on as received.
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` carried (the W3C limit a vendor must propagate: 32 members of
/// at most 256 characters would be more, but 512 is what every hop must keep). A longer
/// one is dropped, not cut, since a cut member would be corrupt.
pub const MAX_TRACESTATE: usize = 512;

/// A trace context: which trace, which span is the parent of what comes next, the flags,
/// and the vendors' state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// Bit 0: sampled.
    pub flags: u8,
    pub state: Option<String>,
}

impl TraceContext {
    /// Parses a `traceparent` (and its `tracestate`) as the W3C spec says a receiver must:
    /// version `00` exactly, or a later version read by its first four fields; lowercase
    /// hex; neither id all zeros; version `ff` invalid. `None` for anything else.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let t = traceparent.trim_matches([' ', '\t']).as_bytes();
        if t.len() < 55 {
            return None;
        }
        let version = hex_byte(&t[0..2])?;
        let exact = t.len() == 55;
        // A future version may append fields after a dash; version 00 may not.
        if version == 0xff || (version == 0 && !exact) || (!exact && t[55] != b'-') {
            return None;
        }
        if t[2] != b'-' || t[35] != b'-' || t[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&t[3 + 2 * i..5 + 2 * i])?;
        }
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&t[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&t[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let state = tracestate.map(|s| s.trim_matches([' ', '\t'])).filter(|s| is_valid_state(s)).map(str::to_string);
        Some(TraceContext { trace_id, span_id, flags, state })
    }

    /// A new trace, for an event that came without one: random ids, sampled as `sampled` says.
    pub fn root(sampled: bool, rng: &mut impl Rng) -> TraceContext {
        let mut trace_id: [u8; 16] = rng.random();
        if trace_id == [0; 16] {
            trace_id[15] = 1;
        }
        TraceContext { trace_id, span_id: span_id(rng), flags: u8::from(sampled), state: None }
    }

    /// The same trace with `span_id` as the parent of what follows (a span of Herald's own).
    pub fn child(&self, span_id: [u8; 8]) -> TraceContext {
        TraceContext { span_id, ..self.clone() }
    }

    /// Whether the caller sampled this trace.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` header of this context, version 00.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        push_hex(&mut s, &self.trace_id);
        s
    }
}

/// A random span id (never all zeros, which W3C reserves for "none").
pub fn span_id(rng: &mut impl Rng) -> [u8; 8] {
    let mut id: [u8; 8] = rng.random();
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// A `tracestate` worth carrying: at most [`MAX_TRACESTATE`] characters, all printable
/// ASCII (members are `key=value` lists; their inner grammar is the vendors' business).
fn is_valid_state(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_TRACESTATE && s.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some((digit(two[0])? << 4) | digit(two[1])?)
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_version_00() {
        let t = TraceContext::parse(GOOD, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.traceparent(), GOOD);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(t.sampled());
        assert_eq!(t.state.as_deref(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn malformed_traceparents_are_no_context() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for b in bad {
            assert_eq!(TraceContext::parse(b, Some("a=b")), None, "{b:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let t = TraceContext::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever", None).unwrap();
        assert_eq!(t.traceparent(), GOOD);
    }

    #[test]
    fn tracestate_is_kept_only_when_carriable() {
        let long = "a=".to_string() + &"b".repeat(MAX_TRACESTATE);
        assert_eq!(TraceContext::parse(GOOD, Some(&long)).unwrap().state, None);
        assert_eq!(TraceContext::parse(GOOD, Some("a=\u{7}")).unwrap().state, None);
        assert_eq!(TraceContext::parse(GOOD, None).unwrap().state, None);
    }

    #[test]
    fn a_child_keeps_the_trace_with_a_new_span() {
        let mut rng = rand::rng();
        let parent = TraceContext::parse(GOOD, None).unwrap();
        let (a, b) = (parent.child(span_id(&mut rng)), parent.child(span_id(&mut rng)));
        assert_eq!(a.trace_id, parent.trace_id);
        assert_ne!(a.span_id, b.span_id);
        let root = TraceContext::root(false, &mut rng);
        assert!(!root.sampled() && root.trace_id != [0; 16]);
    }
}
