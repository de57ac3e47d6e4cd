//! Lease decisions: how many deliveries a partition claims at once and how long it holds
//! them. Pure: `now` comes in, nothing is read from a clock.

use std::time::Duration;

use crate::model::Millis;

/// The most deliveries one claim takes.
pub const MAX_CLAIM: u32 = 512;

/// How many deliveries an endpoint partition should claim: about one second of its paced
/// rate, at least its in-flight cap plus its burst, never more than `MAX_CLAIM`.
pub fn claim_size(rate_per_sec: f64, burst: u32, max_in_flight: u32) -> u32 {
    let per_second = rate_per_sec.ceil().min(f64::from(MAX_CLAIM)) as u32;
    per_second.max(max_in_flight.saturating_add(burst)).clamp(1, MAX_CLAIM)
}

/// When a lease on `claimed` deliveries must end: the time to send them all at the paced
/// rate, plus the request deadline, plus a safety margin. A lease always outlives the
/// request it covers, so a live worker never loses a delivery it is sending.
pub fn lease_until(now: Millis, claimed: u32, rate_per_sec: f64, timeout: Duration, margin: Duration) -> Millis {
    let drain_ms = (f64::from(claimed) / rate_per_sec.max(f64::MIN_POSITIVE) * 1000.0).ceil();
    let drain_ms = drain_ms.min(86_400_000.0) as i64;
    now.saturating_add(drain_ms).saturating_add(timeout.as_millis() as i64).saturating_add(margin.as_millis() as i64)
}

/// Which of a cluster's live nodes should pace `endpoint` (rendezvous hashing): each
/// node scores every endpoint, the highest score wins. Every node computes the same answer
/// from the same membership; a node joining takes about 1/n of every other node's
/// endpoints, a node leaving hands only its own to the others. `None`: no members.
pub fn preferred_node<'a>(endpoint: &str, members: &'a [String]) -> Option<&'a str> {
    let e = fnv1a(endpoint.as_bytes());
    members.iter().max_by_key(|m| (mix(e ^ fnv1a(m.as_bytes()).rotate_left(17)), m.as_str())).map(String::as_str)
}

/// FNV-1a, 64 bits: stable across builds and platforms (unlike `DefaultHasher`), so
/// nodes of two versions agree during a rolling upgrade.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// SplitMix64's finaliser: spreads the combined hashes evenly over the range.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_sizes() {
        let cases =
            [(10.0, 10, 4, 14), (1000.0, 10, 4, 512), (0.5, 1, 1, 2), (100.0, 1, 4, 100), (1e9, 1, 1, MAX_CLAIM)];
        for (rate, burst, cap, want) in cases {
            assert_eq!(claim_size(rate, burst, cap), want, "{rate} {burst} {cap}");
        }
    }

    #[test]
    fn leases_outlive_the_drain_and_the_request() {
        let t = Duration::from_secs(10);
        let m = Duration::from_secs(30);
        assert_eq!(lease_until(1_000, 10, 10.0, t, m), 1_000 + 1_000 + 10_000 + 30_000);
        assert_eq!(lease_until(0, 0, 10.0, t, m), 40_000);
        // Absurdly slow rates are capped rather than overflowing.
        assert!(lease_until(0, 512, 1e-9, t, m) <= 86_400_000 + 40_000);
    }

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn endpoints_spread_evenly_over_the_nodes() {
        for n in [2, 3, 4, 8] {
            let members = nodes(n);
            let mut counts = std::collections::HashMap::new();
            for e in 0..1000 {
                *counts.entry(preferred_node(&format!("ep_{e:026}"), &members).unwrap()).or_insert(0) += 1;
            }
            let max = *counts.values().max().unwrap() as f64;
            assert_eq!(counts.len(), n, "every node gets endpoints");
            assert!(max / (1000.0 / n as f64) < 1.2, "{n} nodes: {counts:?}");
        }
    }

    #[test]
    fn a_node_leaving_moves_only_its_own_endpoints_and_one_joining_takes_a_fair_share() {
        let (three, four) = (nodes(3), nodes(4));
        let mut moved = 0;
        for e in 0..1000 {
            let id = format!("ep_{e:026}");
            let (before, after) = (preferred_node(&id, &four).unwrap(), preferred_node(&id, &three).unwrap());
            if before != "node-3" {
                assert_eq!(before, after, "{id} moved though its node stayed");
            }
            moved += usize::from(before != after);
        }
        // node-3 had about a quarter of them, and only those moved.
        assert!((200..300).contains(&moved), "{moved}");
        assert_eq!(preferred_node("ep", &[]), None);
        // The members' order does not matter.
        let reversed: Vec<String> = four.iter().rev().cloned().collect();
        assert_eq!(preferred_node("ep_x", &four), preferred_node("ep_x", &reversed));
    }
}
