//! [`RetryPolicy`]: how a [`ChatClient`](crate::ChatClient) retries a retryable failure.

use std::time::Duration;

/// How the client retries a retryable failure ([`ModelError::is_retryable`](crate::ModelError::is_retryable):
/// 408, 409, 429, 5xx, a transport error) before returning it.
///
/// Attempt `n + 1` waits `first_backoff × 2^(n-1)`, capped at `max_backoff`, and no less than
/// the failed answer's `Retry-After`. An answer whose `Retry-After` is longer than
/// `max_retry_after` is returned at once instead of waited for (a server that asks for an hour
/// is better reported than slept on). A failure that is not retryable is returned at once.
///
/// The default ([`RetryPolicy::default`]): 4 attempts in all, backoff 1 s, 2 s, 4 s (at most
/// 30 s), `Retry-After` honoured up to 60 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    attempts: u32,
    first_backoff: Duration,
    max_backoff: Duration,
    max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub fn none() -> Self {
        RetryPolicy::default().attempts(1)
    }

    /// The policy with `attempts` attempts in all, the first included (0 counts as 1).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The policy with a backoff that starts at `first` and doubles up to `max`.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max;
        self
    }

    /// The policy with another cap on `Retry-After`: a longer one fails at once.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// The attempts in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.attempts
    }

    /// How long to wait before the attempt after failed attempt `attempt` (1 for the first),
    /// given the failed answer's `Retry-After`; `None` when no attempt follows: `attempt` was
    /// the last, or `Retry-After` is beyond the cap.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if attempt >= self.attempts {
            return None;
        }
        if retry_after.is_some_and(|asked| asked > self.max_retry_after) {
            return None;
        }
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        let backoff = self
            .first_backoff
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_backoff);
        Some(backoff.max(retry_after.unwrap_or(Duration::ZERO)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_stops_after_the_last_attempt() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.max_attempts(), 4);
        assert_eq!(policy.delay(1, None), Some(S(1)));
        assert_eq!(policy.delay(2, None), Some(S(2)));
        assert_eq!(policy.delay(3, None), Some(S(4)));
        assert_eq!(policy.delay(4, None), None);
        let long = RetryPolicy::default().attempts(u32::MAX);
        assert_eq!(long.delay(6, None), Some(S(30)));
        assert_eq!(long.delay(40, None), Some(S(30)), "no overflow");
        assert_eq!(long.delay(u32::MAX - 1, None), Some(S(30)));
        let huge = long.backoff(Duration::MAX, Duration::MAX);
        assert_eq!(huge.delay(3, None), Some(Duration::MAX));
    }

    #[test]
    fn retry_after_is_a_floor_and_beyond_the_cap_it_stops() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(1, Some(S(10))), Some(S(10)));
        assert_eq!(policy.delay(3, Some(S(1))), Some(S(4)));
        assert_eq!(policy.delay(1, Some(S(60))), Some(S(60)));
        assert_eq!(policy.delay(1, Some(S(61))), None);
        assert_eq!(policy.delay(1, Some(Duration::MAX)), None);
    }

    #[test]
    fn none_and_zero_attempts_mean_one() {
        assert_eq!(RetryPolicy::none().delay(1, None), None);
        assert_eq!(RetryPolicy::default().attempts(0).max_attempts(), 1);
    }
}
