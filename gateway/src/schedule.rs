//! Retry schedule: capped exponential backoff with jitter, bounded by an attempt count and
//! by the event's deadline. Pure policy: it must not read the clock or a global RNG, and it
//! never sleeps; callers pass `now` and an `Rng` and apply the returned decision.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

use crate::model::{Millis, RetryOverrideDoc};

/// How a computed backoff delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Use the computed delay as is.
    None,
    /// Uniform in `[0, delay]` ("full jitter").
    Full,
    /// Uniform in `[delay × (1 - p), delay × (1 + p)]`; `Proportional(0.2)` is ±20 %.
    Proportional(f64),
}

/// A validated retry policy. Build it with [`RetryPolicy::try_new`] or [`Default`].
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    base: Duration,
    factor: f64,
    cap: Duration,
    jitter: Jitter,
    max_attempts: u32,
    ttl: Duration,
}

/// Per-endpoint changes to a policy; `None` keeps the inherited value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetryOverride {
    /// Delay before the first retry.
    pub base: Option<Duration>,
    /// Growth factor between consecutive retries.
    pub factor: Option<f64>,
    /// Upper bound of the un-jittered delay.
    pub cap: Option<Duration>,
    /// Randomisation of each delay.
    pub jitter: Option<Jitter>,
    /// Total attempts, the first one included.
    pub max_attempts: Option<u32>,
    /// How long an event stays deliverable after it was accepted.
    pub ttl: Option<Duration>,
}

impl RetryOverride {
    /// The override an endpoint's stored retry document asks for (only its jitter can be
    /// wrong: [`PolicyError::field`] is `jitter`).
    pub fn from_doc(doc: &RetryOverrideDoc) -> Result<RetryOverride, PolicyError> {
        let ms = |v: Option<u64>| v.map(Duration::from_millis);
        Ok(RetryOverride {
            base: ms(doc.base_ms),
            factor: doc.factor,
            cap: ms(doc.cap_ms),
            jitter: match &doc.jitter {
                Some(j) => Some(j.parse()?),
                None => None,
            },
            max_attempts: doc.max_attempts,
            ttl: ms(doc.ttl_ms),
        })
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again at this unix-millisecond instant.
    RetryAt(Millis),
    /// Stop and dead-letter the delivery.
    GiveUp(GiveUpReason),
}

/// Why a delivery is abandoned; `as_str` is the dead-letter reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GiveUpReason {
    /// `max_attempts` attempts were made.
    Exhausted,
    /// The event's deadline has passed, or the next try would fall after it.
    Expired,
    /// The receiver's `Retry-After` points past the event's deadline.
    RetryAfterBeyondDeadline,
}

/// A rejected policy or jitter value. It says the reason; [`PolicyError::field`] names the
/// setting, which the caller puts before it under its own path (`retry.jitter: …`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// `base` was zero.
    #[error("must be greater than zero")]
    ZeroBase,
    /// `factor` was below 1, NaN or infinite.
    #[error("must be a finite number >= 1, got {0}")]
    InvalidFactor(f64),
    /// `cap` was smaller than `base`.
    #[error("{} is less than the base delay ({})", humantime::format_duration(*cap), humantime::format_duration(*base))]
    CapBelowBase {
        /// The rejected cap.
        cap: Duration,
        /// The base it was compared with.
        base: Duration,
    },
    /// `max_attempts` was zero.
    #[error("must be at least 1")]
    ZeroMaxAttempts,
    /// `ttl` was zero.
    #[error("must be greater than zero")]
    ZeroTtl,
    /// A proportional jitter outside `(0, 1]`.
    #[error("must be \"none\", \"full\" or a percentage in (0%, 100%], got \"{}\"", Jitter::Proportional(*.0))]
    InvalidJitter(f64),
    /// A jitter string that is not `none`, `full` or `<p>%`.
    #[error("must be \"none\", \"full\" or a percentage like \"20%\", got {0:?}")]
    UnparsableJitter(String),
}

impl PolicyError {
    /// The setting at fault: `base`, `factor`, `cap`, `jitter`, `max_attempts` or `ttl`.
    pub fn field(&self) -> &'static str {
        match self {
            PolicyError::ZeroBase => "base",
            PolicyError::InvalidFactor(_) => "factor",
            PolicyError::CapBelowBase { .. } => "cap",
            PolicyError::ZeroMaxAttempts => "max_attempts",
            PolicyError::ZeroTtl => "ttl",
            PolicyError::InvalidJitter(_) | PolicyError::UnparsableJitter(_) => "jitter",
        }
    }
}

impl Default for RetryPolicy {
    /// Industry defaults: 30 s ×2 capped at 6 h, full jitter, 10 attempts, 24 h TTL.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(30),
            factor: 2.0,
            cap: Duration::from_secs(6 * 3600),
            jitter: Jitter::Full,
            max_attempts: 10,
            ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl RetryPolicy {
    /// Validates and builds a policy.
    pub fn try_new(
        base: Duration,
        factor: f64,
        cap: Duration,
        jitter: Jitter,
        max_attempts: u32,
        ttl: Duration,
    ) -> Result<Self, PolicyError> {
        if base.is_zero() {
            return Err(PolicyError::ZeroBase);
        }
        if !factor.is_finite() || factor < 1.0 {
            return Err(PolicyError::InvalidFactor(factor));
        }
        if cap < base {
            return Err(PolicyError::CapBelowBase { cap, base });
        }
        if max_attempts == 0 {
            return Err(PolicyError::ZeroMaxAttempts);
        }
        if ttl.is_zero() {
            return Err(PolicyError::ZeroTtl);
        }
        jitter.validate()?;
        Ok(Self { base, factor, cap, jitter, max_attempts, ttl })
    }

    /// Returns this policy with the override's fields applied, validated again as a whole.
    pub fn with_override(&self, o: &RetryOverride) -> Result<RetryPolicy, PolicyError> {
        Self::try_new(
            o.base.unwrap_or(self.base),
            o.factor.unwrap_or(self.factor),
            o.cap.unwrap_or(self.cap),
            o.jitter.unwrap_or(self.jitter),
            o.max_attempts.unwrap_or(self.max_attempts),
            o.ttl.unwrap_or(self.ttl),
        )
    }

    /// Delay before the first retry.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// Growth factor between consecutive retries.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// Upper bound of the un-jittered delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Randomisation applied to each delay.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Total attempts allowed, the first one included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long an event stays deliverable after acceptance (`expires_at - created_at`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Un-jittered delay before retry number `retry_index` (0 = the first retry):
    /// `min(base × factor^retry_index, cap)`. Never overflows.
    pub fn nominal_delay(&self, retry_index: u32) -> Duration {
        let cap = self.cap.as_secs_f64();
        let raw = self.base.as_secs_f64() * self.factor.powf(f64::from(retry_index));
        // Also catches an infinite product (base × factor^n cannot be NaN).
        if raw >= cap {
            return self.cap;
        }
        Duration::from_secs_f64(raw)
    }

    /// Jittered delay before retry number `retry_index` (0 = the first retry).
    pub fn delay(&self, retry_index: u32, rng: &mut impl Rng) -> Duration {
        self.jitter.apply(self.nominal_delay(retry_index), rng)
    }

    /// Sum of the un-jittered delays of all `max_attempts - 1` retries: how long the
    /// schedule spans when no deadline cuts it short.
    pub fn nominal_window(&self) -> Duration {
        let retries = self.max_attempts - 1;
        let mut total = Duration::ZERO;
        for i in 0..retries {
            let d = self.nominal_delay(i);
            if d == self.cap {
                // Every later delay is capped too: finish in one multiplication.
                return total.saturating_add(self.cap.saturating_mul(retries - i));
            }
            total = total.saturating_add(d);
        }
        total
    }

    /// Decides what follows a failed attempt, given how many attempts were made so far,
    /// the current time, the event's deadline and the receiver's `Retry-After`, if any.
    pub fn next_attempt(
        &self,
        attempts_made: u32,
        now: Millis,
        deadline: Millis,
        retry_after: Option<Duration>,
        rng: &mut impl Rng,
    ) -> RetryDecision {
        if attempts_made >= self.max_attempts {
            return RetryDecision::GiveUp(GiveUpReason::Exhausted);
        }
        if now >= deadline {
            return RetryDecision::GiveUp(GiveUpReason::Expired);
        }
        let (delay, too_late) = match retry_after {
            Some(d) => (d, GiveUpReason::RetryAfterBeyondDeadline),
            None => (self.delay(attempts_made.saturating_sub(1), rng), GiveUpReason::Expired),
        };
        let at = add_millis(now, delay);
        if at > deadline { RetryDecision::GiveUp(too_late) } else { RetryDecision::RetryAt(at) }
    }
}

impl GiveUpReason {
    /// The dead-letter reason string.
    pub fn as_str(&self) -> &'static str {
        match self {
            GiveUpReason::Exhausted => "exhausted",
            GiveUpReason::Expired => "expired",
            GiveUpReason::RetryAfterBeyondDeadline => "retry_after_beyond_deadline",
        }
    }
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Jitter {
    fn validate(self) -> Result<Self, PolicyError> {
        match self {
            Jitter::Proportional(p) if !(p > 0.0 && p <= 1.0) => Err(PolicyError::InvalidJitter(p)),
            ok => Ok(ok),
        }
    }

    /// Randomises `d` according to this jitter.
    pub fn apply(self, d: Duration, rng: &mut impl Rng) -> Duration {
        let secs = d.as_secs_f64();
        let jittered = match self {
            Jitter::None => return d,
            Jitter::Full => rng.random_range(0.0..=secs),
            Jitter::Proportional(p) => rng.random_range(secs * (1.0 - p)..=secs * (1.0 + p)),
        };
        Duration::try_from_secs_f64(jittered).unwrap_or(Duration::MAX)
    }
}

impl FromStr for Jitter {
    type Err = PolicyError;

    /// Parses `none`, `full` or a percentage such as `20%` (also `±20%`), case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "none" => return Ok(Jitter::None),
            "full" => return Ok(Jitter::Full),
            _ => {}
        }
        let pct = t
            .strip_suffix('%')
            .map(|n| n.trim_start_matches('±').trim())
            .and_then(|n| n.parse::<f64>().ok())
            .ok_or_else(|| PolicyError::UnparsableJitter(s.to_owned()))?;
        Jitter::Proportional(pct / 100.0).validate()
    }
}

impl fmt::Display for Jitter {
    /// The inverse of `FromStr`: `none`, `full` or e.g. `20%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jitter::None => f.write_str("none"),
            Jitter::Full => f.write_str("full"),
            Jitter::Proportional(p) => {
                // Round away float noise (0.07 × 100 = 7.000000000000001).
                let pct = format!("{:.6}", p * 100.0);
                let pct = pct.trim_end_matches('0').trim_end_matches('.');
                write!(f, "{pct}%")
            }
        }
    }
}

impl TryFrom<String> for Jitter {
    type Error = PolicyError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Jitter> for String {
    fn from(j: Jitter) -> Self {
        j.to_string()
    }
}

impl serde::Serialize for Jitter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Jitter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `now + d` in milliseconds, saturating instead of overflowing.
fn add_millis(now: Millis, d: Duration) -> Millis {
    now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
