//! Backoff, limits and jitter: table tests and statistical checks.

use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

const S: u64 = 1000; // one second in Millis

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

/// base 1 s ×2 capped at 900 s, ±20 % jitter, 13 attempts.
fn seed_preset() -> RetryPolicy {
    RetryPolicy::try_new(secs(1), 2.0, secs(900), Jitter::Proportional(0.2), 13, secs(86_400)).unwrap()
}

fn fixed(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::try_new(secs(10), 2.0, secs(100), Jitter::None, max_attempts, secs(3600)).unwrap()
}

#[test]
fn defaults_follow_the_design() {
    let p = RetryPolicy::default();
    assert_eq!(p.base(), secs(30));
    assert_eq!(p.factor(), 2.0);
    assert_eq!(p.cap(), secs(6 * 3600));
    assert_eq!(p.jitter(), Jitter::Full);
    assert_eq!(p.max_attempts(), 10);
    assert_eq!(p.ttl(), secs(24 * 3600));
    let rebuilt = RetryPolicy::try_new(p.base(), 2.0, p.cap(), Jitter::Full, 10, p.ttl());
    assert_eq!(rebuilt, Ok(p));
}

#[test]
fn seed_preset_window_is_about_47_minutes() {
    let p = seed_preset();
    let delays: Vec<u64> = (0..12).map(|i| p.nominal_delay(i).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]);
    assert_eq!(p.nominal_window(), secs(2823));
    let minutes = p.nominal_window().as_secs_f64() / 60.0;
    assert!((46.5..=47.5).contains(&minutes), "{minutes} min");
}

#[test]
fn nominal_delay_table() {
    let p = fixed(5);
    let cases = [(0, 10), (1, 20), (2, 40), (3, 80), (4, 100), (5, 100), (60, 100)];
    for (i, want) in cases {
        assert_eq!(p.nominal_delay(i), secs(want), "retry {i}");
    }
}

#[test]
fn factor_one_is_constant() {
    let p = RetryPolicy::try_new(secs(5), 1.0, secs(5), Jitter::None, 3, secs(60)).unwrap();
    for i in [0, 1, 1000, u32::MAX] {
        assert_eq!(p.nominal_delay(i), secs(5));
    }
}

#[test]
fn huge_retry_index_is_capped_without_panic() {
    let mut r = rng();
    for p in [RetryPolicy::default(), seed_preset(), fixed(3)] {
        for i in [64, 1024, 1_000_000, u32::MAX] {
            assert_eq!(p.nominal_delay(i), p.cap());
            let d = p.delay(i, &mut r);
            assert!(d <= p.cap().mul_f64(1.2) + Duration::from_nanos(1), "{d:?}");
        }
    }
    let big = RetryPolicy::try_new(secs(1), 1e300, Duration::MAX, Jitter::Full, 2, secs(1));
    assert_eq!(big.unwrap().nominal_delay(u32::MAX), Duration::MAX);
}

#[test]
fn nominal_window_with_huge_attempts_saturates() {
    let p = RetryPolicy::try_new(secs(1), 2.0, secs(10), Jitter::None, u32::MAX, secs(1)).unwrap();
    assert_eq!(p.nominal_window(), secs(1 + 2 + 4 + 8) + secs(10) * (u32::MAX - 5));
    assert_eq!(fixed(1).nominal_window(), Duration::ZERO);
}

#[test]
fn no_jitter_is_exact() {
    let mut r = rng();
    assert_eq!(fixed(5).delay(2, &mut r), secs(40));
}

#[test]
fn full_jitter_stays_in_zero_to_delay_and_spreads() {
    let p = RetryPolicy::default();
    let mut r = rng();
    let draws: Vec<Duration> = (0..10_000).map(|_| p.delay(3, &mut r)).collect();
    let d = secs(240);
    assert!(draws.iter().all(|x| *x <= d));
    let (lo, hi) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
    assert!(*lo < secs(3) && *hi > secs(237), "{lo:?}..{hi:?}");
    let mean = draws.iter().sum::<Duration>() / 10_000;
    assert!(mean > secs(114) && mean < secs(126), "mean {mean:?}");
}

#[test]
fn proportional_jitter_stays_within_bounds() {
    let p = seed_preset();
    let mut r = rng();
    for (i, nominal) in [(0u32, 1.0f64), (4, 16.0), (10, 900.0), (500, 900.0)] {
        let draws: Vec<f64> = (0..5000).map(|_| p.delay(i, &mut r).as_secs_f64()).collect();
        let (lo, hi) = (nominal * 0.8, nominal * 1.2);
        assert!(draws.iter().all(|x| (lo - 1e-9..=hi + 1e-9).contains(x)), "retry {i}");
        let min = draws.iter().cloned().fold(f64::MAX, f64::min);
        let max = draws.iter().cloned().fold(0.0, f64::max);
        assert!(min < lo + nominal * 0.01 && max > hi - nominal * 0.01, "retry {i}");
    }
}

#[test]
fn jitter_parse_and_display_round_trip() {
    let cases = [
        ("none", Jitter::None, "none"),
        ("FULL", Jitter::Full, "full"),
        (" full ", Jitter::Full, "full"),
        ("20%", Jitter::Proportional(0.2), "20%"),
        ("±20%", Jitter::Proportional(0.2), "20%"),
        ("7%", Jitter::Proportional(0.07), "7%"),
        ("12.5%", Jitter::Proportional(0.125), "12.5%"),
        ("100%", Jitter::Proportional(1.0), "100%"),
    ];
    for (input, want, shown) in cases {
        let j: Jitter = input.parse().unwrap();
        assert_eq!(j, want, "{input}");
        assert_eq!(j.to_string(), shown);
        assert_eq!(shown.parse::<Jitter>().unwrap(), want);
    }
}

#[test]
fn jitter_parse_rejects_garbage() {
    for bad in ["", "half", "20", "%", "abc%", "0%", "-5%", "150%", "NaN%"] {
        assert!(bad.parse::<Jitter>().is_err(), "{bad:?} accepted");
    }
}

#[test]
fn jitter_serde_uses_the_string_form() {
    use serde::de::IntoDeserializer;
    use serde::de::value::{Error, StrDeserializer};
    let de: StrDeserializer<'_, Error> = "20%".into_deserializer();
    let j: Result<Jitter, Error> = serde::Deserialize::deserialize(de);
    assert_eq!(j.unwrap(), Jitter::Proportional(0.2));
    let de: StrDeserializer<'_, Error> = "sometimes".into_deserializer();
    assert!(<Jitter as serde::Deserialize<'_>>::deserialize(de).is_err());
    assert_eq!(String::from(Jitter::Full), "full");
}

#[test]
fn invalid_constructor_args_are_rejected() {
    let ok = |b, f, c, j, m, t| RetryPolicy::try_new(secs(b), f, secs(c), j, m, secs(t));
    let n = Jitter::None;
    assert!(ok(1, 2.0, 10, n, 3, 60).is_ok());
    assert_eq!(ok(0, 2.0, 10, n, 3, 60), Err(PolicyError::ZeroBase));
    assert_eq!(ok(1, 0.5, 10, n, 3, 60), Err(PolicyError::InvalidFactor(0.5)));
    assert!(matches!(ok(1, f64::NAN, 10, n, 3, 60), Err(PolicyError::InvalidFactor(_))));
    assert!(ok(1, f64::INFINITY, 10, n, 3, 60).is_err());
    let below = Err(PolicyError::CapBelowBase { cap: secs(1), base: secs(2) });
    assert_eq!(ok(2, 2.0, 1, n, 3, 60), below);
    assert_eq!(ok(1, 2.0, 10, n, 0, 60), Err(PolicyError::ZeroMaxAttempts));
    assert_eq!(ok(1, 2.0, 10, n, 3, 0), Err(PolicyError::ZeroTtl));
    for p in [0.0, -0.1, 1.5, f64::NAN] {
        assert!(ok(1, 2.0, 10, Jitter::Proportional(p), 3, 60).is_err(), "{p}");
    }
    assert!(ok(1, 2.0, 10, Jitter::Proportional(1.0), 3, 60).is_ok());
}

#[test]
fn override_replaces_only_given_fields_and_revalidates() {
    let base = RetryPolicy::default();
    assert_eq!(base.with_override(&RetryOverride::default()), Ok(base.clone()));
    let o = RetryOverride {
        base: Some(secs(1)),
        cap: Some(secs(900)),
        jitter: Some(Jitter::Proportional(0.2)),
        max_attempts: Some(13),
        ..Default::default()
    };
    let p = base.with_override(&o).unwrap();
    assert_eq!(p.nominal_window(), secs(2823));
    assert_eq!((p.factor(), p.ttl()), (2.0, base.ttl()));
    let bad = RetryOverride { cap: Some(secs(1)), ..Default::default() };
    assert!(matches!(base.with_override(&bad), Err(PolicyError::CapBelowBase { .. })));
}

#[test]
fn next_attempt_table() {
    use GiveUpReason::*;
    use RetryDecision::*;
    let p = fixed(5); // 10, 20, 40, 80 s; no jitter
    let now: Millis = 1_700_000_000_000;
    let far = now + 86_400 * S as i64;
    let ra = |s| Some(secs(s));
    #[rustfmt::skip]
    let cases: [(u32, Millis, Millis, Option<Duration>, RetryDecision); 14] = [
        // attempts, now, deadline, retry-after, decision
        (0, now, far, None, RetryAt(now + 10_000)),
        (1, now, far, None, RetryAt(now + 10_000)),
        (2, now, far, None, RetryAt(now + 20_000)),
        (4, now, far, None, RetryAt(now + 80_000)),
        (5, now, far, None, GiveUp(Exhausted)),
        (9, now, far, None, GiveUp(Exhausted)),
        (5, now, now - 1, None, GiveUp(Exhausted)),
        (1, now, now, None, GiveUp(Expired)),
        (1, now, now - 1, ra(1), GiveUp(Expired)),
        (1, now, now + 9_999, None, GiveUp(Expired)),
        (1, now, now + 10_000, None, RetryAt(now + 10_000)),
        (1, now, far, ra(3), RetryAt(now + 3_000)),
        (1, now, now + 3_000, ra(3), RetryAt(now + 3_000)),
        (1, now, now + 2_999, ra(3), GiveUp(RetryAfterBeyondDeadline)),
    ];
    let mut r = rng();
    for (i, (attempts, now, deadline, retry_after, want)) in cases.into_iter().enumerate() {
        let got = p.next_attempt(attempts, now, deadline, retry_after, &mut r);
        assert_eq!(got, want, "case {i}");
    }
}

#[test]
fn next_attempt_retry_after_zero_and_huge() {
    let p = fixed(5);
    let mut r = rng();
    let got = p.next_attempt(1, 0, 10, Some(Duration::ZERO), &mut r);
    assert_eq!(got, RetryDecision::RetryAt(0));
    let got = p.next_attempt(1, 0, i64::MAX - 1, Some(Duration::MAX), &mut r);
    let want = RetryDecision::GiveUp(GiveUpReason::RetryAfterBeyondDeadline);
    assert_eq!(got, want);
}

#[test]
fn next_attempt_jittered_is_within_bounds() {
    let p = seed_preset();
    let mut r = rng();
    for attempts in 1..13u32 {
        let nominal = p.nominal_delay(attempts - 1).as_millis() as i64;
        let RetryDecision::RetryAt(at) = p.next_attempt(attempts, 0, i64::MAX, None, &mut r) else {
            panic!("attempt {attempts} gave up");
        };
        assert!(at >= nominal * 8 / 10 && at <= nominal * 12 / 10 + 1, "{attempts}: {at}");
    }
    let got = p.next_attempt(13, 0, i64::MAX, None, &mut r);
    assert_eq!(got, RetryDecision::GiveUp(GiveUpReason::Exhausted));
}

#[test]
fn give_up_reasons_as_str() {
    assert_eq!(GiveUpReason::Exhausted.as_str(), "exhausted");
    assert_eq!(GiveUpReason::Expired.as_str(), "expired");
    let r = GiveUpReason::RetryAfterBeyondDeadline;
    assert_eq!(r.as_str(), "retry_after_beyond_deadline");
    assert_eq!(r.to_string(), r.as_str());
}
