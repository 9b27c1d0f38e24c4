//! What an attempt's outcome does to the ledger row of its intent: the outcomes a drain
//! records, and the one table of their effects every store applies (memory and SQLite to
//! their rows, PostgreSQL as the values of its statement), so that no store states a rule of
//! its own.

use std::time::{Duration, SystemTime};

use crate::model::delivery::{ceil_millis, later, AttemptOutcome, DeliveryStatus};

/// The outcome of one attempt, for [`OutboxStore::record`](crate::OutboxStore::record).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The dispatcher reported success: delivered, final.
    Delivered,
    /// The attempt failed with `error`; `next` says what follows.
    Failed {
        /// The error, as recorded in [`Delivery::last_error`](crate::ledger::Delivery::last_error).
        error: String,
        /// A retry at a time, a wait for an operator's retry, or a dead letter.
        next: FailedAttempt,
    },
    /// No route handles the intent's kind: held, and the attempt (which reached no handler)
    /// not counted.
    Held {
        /// Why, as recorded in [`Delivery::last_error`](crate::ledger::Delivery::last_error).
        reason: String,
    },
    /// The attempt was cut off before its outcome was known: pending again, due at once, the
    /// attempt counted and counted as interrupted.
    Interrupted {
        /// Why, as recorded in [`Delivery::last_error`](crate::ledger::Delivery::last_error).
        reason: String,
    },
    /// The claim was never handed to a dispatcher: pending again, due at once, the attempt
    /// not counted.
    Released,
}

impl Outcome {
    /// How the attempt this outcome ends is kept in the attempt history: `None` for a
    /// delivered attempt (the ledger entry itself keeps the last attempt) and for a released
    /// claim (never handed out, not an attempt). A retry time is kept in whole milliseconds,
    /// rounded up, and at most [`FAR_FUTURE`](crate::FAR_FUTURE), as the entry keeps it.
    pub fn attempt_outcome(&self) -> Option<AttemptOutcome> {
        Some(match self {
            Outcome::Delivered | Outcome::Released => return None,
            Outcome::Failed { error, next } => match next {
                FailedAttempt::RetryAt(at) => AttemptOutcome::Failed {
                    error: error.clone(),
                    retry_at: Some(ceil_millis(later(*at, Duration::ZERO))),
                },
                FailedAttempt::AwaitRetry => AttemptOutcome::Failed {
                    error: error.clone(),
                    retry_at: None,
                },
                FailedAttempt::Dead => AttemptOutcome::Dead { error: error.clone() },
            },
            Outcome::Held { reason } => AttemptOutcome::Held { reason: reason.clone() },
            Outcome::Interrupted { reason } => AttemptOutcome::Interrupted { reason: reason.clone() },
        })
    }
}

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailedAttempt {
    /// The retry policy tries again then (kept in whole milliseconds, rounded up).
    RetryAt(SystemTime),
    /// No automatic retry: it waits for an operator's `retry`.
    AwaitRetry,
    /// Given up: a dead letter.
    Dead,
}

/// What an [`Outcome`] does to the row of an intent in flight under the recording's token
/// ([`Outcome::transition`]). A store applies every field, then [`due_at`](Transition::due_at);
/// the lease ends (no owner, no lease) and `updated_at` is the time of the record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transition<'a> {
    /// The row's new status.
    pub status: DeliveryStatus,
    /// The attempt is not counted after all (`attempts − 1`, at least 0): it reached no
    /// handler, or was never handed out.
    pub uncount_attempt: bool,
    /// The row counts one more interrupted attempt.
    pub count_interrupted: bool,
    /// What becomes of `last_error`.
    pub last_error: LastError<'a>,
    /// `delivered_at` is the time of the record.
    pub delivered: bool,
    /// The row's new `next_attempt_at` (whole milliseconds, rounded up).
    pub next_attempt_at: Option<SystemTime>,
    /// The entry of the attempt history the record ends the attempt with (`None`: the row
    /// itself keeps a delivered attempt, and a released claim was no attempt).
    pub history: Option<AttemptOutcome>,
}

/// What a record does to a row's `last_error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastError<'a> {
    /// Cleared (a delivery).
    Clear,
    /// Kept as it was (a released claim).
    Keep,
    /// Set to this text.
    Set(&'a str),
}

impl Outcome {
    /// The effect of recording this outcome on the row of an intent in flight under the
    /// recording's token.
    pub fn transition(&self) -> Transition<'_> {
        let history = self.attempt_outcome();
        let plain = |status, last_error| Transition {
            status,
            uncount_attempt: false,
            count_interrupted: false,
            last_error,
            delivered: false,
            next_attempt_at: None,
            history: history.clone(),
        };
        match self {
            Outcome::Delivered => Transition {
                delivered: true,
                ..plain(DeliveryStatus::Delivered, LastError::Clear)
            },
            Outcome::Failed { error, next } => match *next {
                FailedAttempt::RetryAt(at) => Transition {
                    next_attempt_at: Some(ceil_millis(later(at, Duration::ZERO))),
                    ..plain(DeliveryStatus::Failed, LastError::Set(error))
                },
                FailedAttempt::AwaitRetry => plain(DeliveryStatus::Failed, LastError::Set(error)),
                FailedAttempt::Dead => plain(DeliveryStatus::Dead, LastError::Set(error)),
            },
            Outcome::Held { reason } => Transition {
                uncount_attempt: true,
                ..plain(DeliveryStatus::Held, LastError::Set(reason))
            },
            Outcome::Interrupted { reason } => Transition {
                count_interrupted: true,
                ..plain(DeliveryStatus::Pending, LastError::Set(reason))
            },
            Outcome::Released => Transition {
                uncount_attempt: true,
                ..plain(DeliveryStatus::Pending, LastError::Keep)
            },
        }
    }
}

impl Transition<'_> {
    /// When the row is due next, recorded at `now`: at once when pending again, at its
    /// retry time when failed with one, never otherwise.
    pub fn due_at(&self, now: SystemTime) -> Option<SystemTime> {
        due_at(self.status, self.next_attempt_at, now)
    }
}

/// When a row in `status` with `next_attempt_at` is due, as of a change at `now`: at once
/// when pending, at its retry time when failed, never otherwise (in flight, final, held or
/// awaiting approval).
pub fn due_at(status: DeliveryStatus, next_attempt_at: Option<SystemTime>, now: SystemTime) -> Option<SystemTime> {
    match status {
        DeliveryStatus::Pending => Some(now),
        DeliveryStatus::Failed => next_attempt_at,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table, written out: what each outcome does to a row.
    #[test]
    fn each_outcome_does_what_the_ledger_says() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_500);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        let failed = |next| Outcome::Failed {
            error: "503".into(),
            next,
        };
        let cases = [
            (
                Outcome::Delivered,
                DeliveryStatus::Delivered,
                false,
                false,
                LastError::Clear,
                true,
                None,
            ),
            (
                failed(FailedAttempt::RetryAt(at)),
                DeliveryStatus::Failed,
                false,
                false,
                LastError::Set("503"),
                false,
                Some(at),
            ),
            (
                failed(FailedAttempt::AwaitRetry),
                DeliveryStatus::Failed,
                false,
                false,
                LastError::Set("503"),
                false,
                None,
            ),
            (
                failed(FailedAttempt::Dead),
                DeliveryStatus::Dead,
                false,
                false,
                LastError::Set("503"),
                false,
                None,
            ),
            (
                Outcome::Held {
                    reason: "no route".into(),
                },
                DeliveryStatus::Held,
                true,
                false,
                LastError::Set("no route"),
                false,
                None,
            ),
            (
                Outcome::Interrupted { reason: "cut".into() },
                DeliveryStatus::Pending,
                false,
                true,
                LastError::Set("cut"),
                false,
                Some(now),
            ),
            (
                Outcome::Released,
                DeliveryStatus::Pending,
                true,
                false,
                LastError::Keep,
                false,
                Some(now),
            ),
        ];
        for (outcome, status, uncount, interrupted, last_error, delivered, due) in cases {
            let t = outcome.transition();
            assert_eq!(
                (
                    t.status,
                    t.uncount_attempt,
                    t.count_interrupted,
                    t.last_error,
                    t.delivered
                ),
                (status, uncount, interrupted, last_error, delivered),
                "{outcome:?}"
            );
            assert_eq!(t.history, outcome.attempt_outcome(), "{outcome:?}");
            let due = due.map(|d| if d == at { ceil_millis(at) } else { d });
            assert_eq!(t.due_at(now), due, "{outcome:?}");
        }
    }
}
