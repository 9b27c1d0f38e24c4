//! Rate limits: how many intents of some kinds may be handed to dispatchers per interval,
//! and the rule (a generic cell rate algorithm) by which every store spends and refills a
//! limit's bucket.
//!
//! A bucket's state is two times: the *theoretical arrival time* of the next send at the
//! steady rate, and the end of a pause (a receiver's `Retry-After`). Stores keep the state in
//! a table, so that every drainer of a store spends from one bucket; the limit itself (how
//! many per interval, the burst) is the drainers', given in their
//! [`DeliveryOptions`](crate::DeliveryOptions).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// At most `count` intents per `per`, in bursts of at most `burst` at once: over any window
/// of time `w`, at most `burst + count × w / per` are handed to dispatchers.
///
/// The default burst is 1: sends are spread evenly, one every `per / count`. A larger burst
/// lets that many go at once after a quiet spell, and refills at the steady rate.
///
/// ```
/// use std::time::Duration;
/// use reactifact_core::RateLimit;
///
/// let mail = RateLimit::per_second(100).burst(10);
/// assert_eq!(mail.interval(), Duration::from_millis(10));
/// let slow = RateLimit::new(5, Duration::from_secs(60));
/// assert_eq!(slow.interval(), Duration::from_secs(12));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    count: u32,
    per: Duration,
    burst: u32,
}

impl RateLimit {
    /// `count` per `per`, with a burst of 1. A count or interval of zero is refused by the
    /// builders ([`BuildError::Delivery`](crate::error::BuildError::Delivery)).
    pub fn new(count: u32, per: Duration) -> Self {
        RateLimit { count, per, burst: 1 }
    }

    /// `count` per second.
    pub fn per_second(count: u32) -> Self {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` per minute.
    pub fn per_minute(count: u32) -> Self {
        Self::new(count, Duration::from_secs(60))
    }

    /// At most this many at once (at least 1).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst.max(1);
        self
    }

    /// How many per [`per`](RateLimit::per).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The interval [`count`](RateLimit::count) is counted over.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// How many may go at once.
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The time between two sends at the steady rate: `per / count`, rounded up to the
    /// microsecond (so that rounding never sends faster than the limit).
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_us())
    }

    /// Why this limit cannot deliver as given, if it cannot.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self.count == 0 {
            Some("a rate limit of zero per interval never delivers; cancel the intents, or give a positive count")
        } else if self.per.is_zero() {
            Some("a rate limit over an interval of zero limits nothing; give a positive interval")
        } else {
            None
        }
    }

    fn interval_us(&self) -> u64 {
        let per = u64::try_from(self.per.as_micros()).unwrap_or(u64::MAX);
        per.div_ceil(u64::from(self.count.max(1))).max(1)
    }

    /// How many may be handed out at `now` from a bucket in `state`: at most the burst,
    /// none while the bucket is paused.
    pub fn allowance(&self, state: RateState, now: SystemTime) -> u32 {
        let now = micros(now);
        if state.paused_until > now {
            return 0;
        }
        let t = self.interval_us();
        let base = state.tat.max(now);
        let end = now.saturating_add(t.saturating_mul(u64::from(self.burst)));
        u32::try_from(end.saturating_sub(base) / t)
            .unwrap_or(u32::MAX)
            .min(self.burst)
    }

    /// The state after `taken` were handed out at `now` (no more than the
    /// [`allowance`](RateLimit::allowance)).
    pub fn take(&self, state: RateState, taken: u32, now: SystemTime) -> RateState {
        if taken == 0 {
            return state;
        }
        let t = self.interval_us();
        RateState {
            tat: state
                .tat
                .max(micros(now))
                .saturating_add(t.saturating_mul(u64::from(taken))),
            paused_until: state.paused_until,
        }
    }

    /// When a bucket in `state` next allows one: the end of its pause, or the moment its
    /// steady rate gives it one more.
    pub fn next_allowed(&self, state: RateState) -> SystemTime {
        let t = self.interval_us();
        let refilled = state
            .tat
            .saturating_sub(t.saturating_mul(u64::from(self.burst.saturating_sub(1))));
        SystemTime::UNIX_EPOCH + Duration::from_micros(refilled.max(state.paused_until))
    }
}

/// The state of one rate limit's bucket, as a store keeps it: two times, in microseconds
/// since the Unix epoch. A bucket the store has never written is [`RateState::default`]:
/// full, and not paused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RateState {
    /// The theoretical arrival time of the next send at the steady rate.
    pub tat: u64,
    /// Nothing of the bucket goes out before this time (a receiver asked to wait).
    pub paused_until: u64,
}

impl RateState {
    /// The state with its pause extended to `until` (a pause only ever lengthens).
    pub fn paused(self, until: SystemTime) -> RateState {
        RateState {
            tat: self.tat,
            paused_until: self.paused_until.max(micros(until)),
        }
    }
}

/// A rate limit as a claim applies it ([`ClaimPolicy::rates`](crate::model::policy::ClaimPolicy::rates)):
/// the bucket's name, the action kinds that spend from it, and the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateBucket {
    /// The bucket's name: the stores key its state by it. A limit of one kind is named after
    /// the kind.
    pub name: Arc<str>,
    /// The kinds that spend from it.
    pub kinds: Vec<Arc<str>>,
    /// The limit.
    pub limit: RateLimit,
}

impl RateBucket {
    /// Whether intents of `kind` spend from this bucket.
    pub fn covers(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| &**k == kind)
    }
}

/// What one claim spends from its rate limits: each bucket's state as the claim found it
/// (locked, in a store with concurrent claims), how many it allows, and how many the claim
/// took. Every store's claim follows it: take at most [`allowances`](RateSpend::allowances) of
/// each bucket (asking [`take`](RateSpend::take) for each intent), then write back
/// [`spent`](RateSpend::spent) and report [`throttled`](RateSpend::throttled).
#[derive(Clone, Debug)]
pub struct RateSpend<'a> {
    now: SystemTime,
    buckets: Vec<Spending<'a>>,
}

#[derive(Clone, Debug)]
struct Spending<'a> {
    bucket: &'a RateBucket,
    state: RateState,
    allowance: u32,
    taken: u32,
}

impl<'a> RateSpend<'a> {
    /// The spending of a claim at `now` from `buckets`, each with its stored state.
    pub fn new(buckets: impl IntoIterator<Item = (&'a RateBucket, RateState)>, now: SystemTime) -> Self {
        RateSpend {
            now,
            buckets: buckets
                .into_iter()
                .map(|(bucket, state)| Spending {
                    bucket,
                    state,
                    allowance: bucket.limit.allowance(state, now),
                    taken: 0,
                })
                .collect(),
        }
    }

    /// Whether the claim spends from no bucket.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The buckets, each with how many the claim may still take of its kinds.
    pub fn allowances(&self) -> impl Iterator<Item = (&'a RateBucket, u32)> + '_ {
        self.buckets.iter().map(|s| (s.bucket, s.allowance - s.taken))
    }

    /// Every kind that spends from a bucket of the claim: the claim takes intents of these
    /// only through [`take`](RateSpend::take).
    pub fn limited_kinds(&self) -> impl Iterator<Item = &'a Arc<str>> + '_ {
        self.buckets.iter().flat_map(|s| s.bucket.kinds.iter())
    }

    /// Whether the claim may take one more intent of `kind`; if so, it is counted.
    pub fn take(&mut self, kind: &str) -> bool {
        match self.buckets.iter_mut().find(|s| s.bucket.covers(kind)) {
            None => true,
            Some(s) if s.taken < s.allowance => {
                s.taken += 1;
                true
            }
            Some(_) => false,
        }
    }

    /// The buckets the claim took from, each with its state to store.
    pub fn spent(&self) -> impl Iterator<Item = (&'a Arc<str>, RateState)> + '_ {
        self.buckets
            .iter()
            .filter(|s| s.taken > 0)
            .map(|s| (&s.bucket.name, s.bucket.limit.take(s.state, s.taken, self.now)))
    }

    /// [`Claimed::throttled`](crate::Claimed::throttled): the earliest time a bucket
    /// the claim spent to the last allows one more.
    pub fn throttled(&self) -> Option<SystemTime> {
        self.buckets
            .iter()
            .filter(|s| s.taken == s.allowance)
            .map(|s| {
                s.bucket
                    .limit
                    .next_allowed(s.bucket.limit.take(s.state, s.taken, self.now))
            })
            .min()
    }
}

/// Microseconds since the Unix epoch (0 before it, saturating far after).
pub fn micros(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_full_bucket_allows_its_burst_then_one_per_interval() {
        let limit = RateLimit::per_second(100).burst(5);
        let mut state = RateState::default();
        assert_eq!(limit.allowance(state, at(1_000)), 5);
        state = limit.take(state, 5, at(1_000));
        assert_eq!(limit.allowance(state, at(1_000)), 0);
        assert_eq!(limit.next_allowed(state), at(1_010));
        assert_eq!(limit.allowance(state, at(1_009)), 0);
        assert_eq!(limit.allowance(state, at(1_010)), 1);
        assert_eq!(limit.allowance(state, at(1_030)), 3);
        // A long quiet spell refills only up to the burst.
        assert_eq!(limit.allowance(state, at(100_000)), 5);
    }

    #[test]
    fn over_any_window_no_more_than_the_burst_plus_the_rate() {
        // Take greedily every millisecond for 3 s, and count every 1 s window.
        let limit = RateLimit::per_second(100).burst(10);
        let mut state = RateState::default();
        let mut sends = Vec::new();
        for ms in 0..3_000 {
            let n = limit.allowance(state, at(ms));
            state = limit.take(state, n, at(ms));
            sends.extend(std::iter::repeat_n(ms, n as usize));
        }
        for start in 0..2_000 {
            let in_window = sends.iter().filter(|&&t| t >= start && t < start + 1_000).count();
            assert!(in_window <= 110, "{in_window} sends in the second from {start} ms");
        }
        assert!(sends.len() >= 300, "the steady rate is reached: {}", sends.len());
    }

    #[test]
    fn a_pause_allows_nothing_until_it_ends_and_only_lengthens() {
        let limit = RateLimit::per_second(10).burst(3);
        let state = RateState::default().paused(at(5_000)).paused(at(2_000));
        assert_eq!(limit.allowance(state, at(4_999)), 0);
        assert_eq!(limit.next_allowed(state), at(5_000));
        assert_eq!(limit.allowance(state, at(5_000)), 3);
    }

    #[test]
    fn extreme_limits_saturate_instead_of_overflowing() {
        let fast = RateLimit::new(u32::MAX, Duration::from_nanos(1)).burst(u32::MAX);
        assert_eq!(fast.interval(), Duration::from_micros(1));
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400_000 * 365 * 86_400);
        let state = fast.take(RateState::default(), u32::MAX, far);
        assert_eq!(fast.allowance(state, far), 0);
        let slow = RateLimit::new(1, Duration::MAX);
        assert_eq!(slow.allowance(RateState::default(), at(0)), 1);
        let state = slow.take(RateState::default(), 1, at(0));
        assert_eq!(slow.allowance(state, far), 0);
    }
}
