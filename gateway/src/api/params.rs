//! Parameters many routes read alike: a listing's page limit and RFC 3339 times, refused
//! naming the field or query parameter.

use super::error::ApiError;
use super::extract;

/// A listing's `limit`: 1 to 1000, 100 when absent.
pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(100),
        Some(n @ 1..=1000) => Ok(n),
        Some(n) => Err(extract::bad_query(format!("limit: {n} is not 1 to 1000"))),
    }
}

/// Parses RFC 3339 into milliseconds (a body field's; see [`query_rfc3339`]).
pub(crate) fn parse_rfc3339(field: &str, s: &str) -> Result<i64, ApiError> {
    rfc3339_ms(s).ok_or_else(|| ApiError::bad_request(format!("{field}: {s:?} is not an RFC 3339 timestamp")))
}

/// Parses a query parameter's RFC 3339 into milliseconds; a bad one is `invalid_query`.
pub(crate) fn query_rfc3339(param: &str, s: &str) -> Result<i64, ApiError> {
    rfc3339_ms(s).ok_or_else(|| extract::bad_query(format!("{param}: {s:?} is not an RFC 3339 timestamp")))
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}
