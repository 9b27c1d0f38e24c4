//! How intents are delivered: one value that a runtime's delivery and a standalone drainer
//! take alike.

use std::sync::Arc;
use std::time::Duration;

use crate::model::build_error::BuildError;
use crate::model::policy::ClaimPolicy;
use crate::model::rate::{RateBucket, RateLimit};
use crate::outbox::drain::RetryPolicy;

/// How a drain delivers: retry policies, limits on deliveries at once, the attempt timeout,
/// the grace period after a stop, what a failure does, and the lease of each claim.
///
/// One value serves [`RuntimeBuilder::delivery`](crate::RuntimeBuilder::delivery) and
/// [`DrainerBuilder::delivery`](crate::DrainerBuilder::delivery), so a service that delivers
/// from its runtime and a worker that delivers from a drainer state their delivery once:
///
/// ```
/// use std::time::Duration;
/// use reactifact_core::{Context, DeliveryOptions, DispatchError, Drainer, Intent, RetryPolicy, Runtime};
///
/// let delivery = DeliveryOptions::new()
///     .concurrency(16)
///     .concurrency_for("email", 4)
///     .retry_policy_for("email", RetryPolicy::exponential(Duration::from_secs(5), Duration::from_secs(600)))
///     .timeout(Some(Duration::from_secs(10)));
/// let send = |_: Intent| async { Ok::<(), DispatchError>(()) };
///
/// let ctx = Context::new("orders");
/// let drainer = Drainer::builder(ctx.outbox(), send).delivery(delivery.clone()).build()?;
/// let runtime = Runtime::builder(ctx).dispatcher(send).delivery(delivery).build()?;
/// # Ok::<(), reactifact_core::error::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct DeliveryOptions {
    pub(crate) policy: RetryPolicy,
    pub(crate) policies: foldhash::HashMap<String, RetryPolicy>,
    pub(crate) concurrency: usize,
    pub(crate) kind_limits: foldhash::HashMap<String, usize>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) grace: Duration,
    pub(crate) errors: DeliveryErrors,
    /// `None`: the lease a runtime's context was opened with, or a drainer's default.
    pub(crate) lease: Option<Duration>,
    /// The rate limits (by bucket name), the priorities of kinds, and whether sessions take
    /// turns.
    pub(crate) claims: ClaimPolicy,
}

/// How many deliveries run at once by default.
const DEFAULT_CONCURRENCY: usize = 64;

impl Default for DeliveryOptions {
    /// 64 deliveries at once, [`RetryPolicy::default`] for every kind, a 30 s attempt timeout,
    /// a 10 s grace period, [`DeliveryErrors::Continue`], and the default lease.
    fn default() -> Self {
        DeliveryOptions {
            policy: RetryPolicy::default(),
            policies: Default::default(),
            concurrency: DEFAULT_CONCURRENCY,
            kind_limits: Default::default(),
            timeout: Some(Duration::from_secs(30)),
            grace: Duration::from_secs(10),
            errors: DeliveryErrors::default(),
            lease: None,
            claims: ClaimPolicy::default(),
        }
    }
}

impl DeliveryOptions {
    /// The defaults (see [`Default`](DeliveryOptions::default)).
    pub fn new() -> Self {
        Self::default()
    }

    /// At most this many deliveries at once (default 64; at least 1). This also bounds what a
    /// crash of the process can cause: at most this many intents are delivered again.
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.concurrency = limit.max(1);
        self
    }

    /// At most this many deliveries of one action kind at once (at least 1), within
    /// [`concurrency`](DeliveryOptions::concurrency).
    pub fn concurrency_for(mut self, kind: &str, limit: usize) -> Self {
        self.kind_limits.insert(kind.to_owned(), limit.max(1));
        self
    }

    /// The retry policy of every action kind without one of its own (default:
    /// [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The retry policy of one action kind.
    pub fn retry_policy_for(mut self, kind: &str, policy: RetryPolicy) -> Self {
        self.policies.insert(kind.to_owned(), policy);
        self
    }

    /// Bounds each attempt (default 30 s): an attempt that takes longer is cancelled and
    /// counts as a retryable failure. `None` waits as long as the dispatcher takes. A timeout
    /// of zero would cancel every attempt: the builders refuse it
    /// ([`BuildError::Delivery`](crate::error::BuildError::Delivery)).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long deliveries already running may finish after a stop or a turn's deadline
    /// (default 10 s). Those still running then are cancelled and recorded as attempts of
    /// unknown outcome (the receiver may have seen them), due again at once; they do not count
    /// against the retry policy.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What a failed delivery does to the drain (default: [`DeliveryErrors::Continue`]).
    pub fn errors(mut self, mode: DeliveryErrors) -> Self {
        self.errors = mode;
        self
    }

    /// The lease of each claim, renewed every third of it while the delivery runs. If the
    /// process dies, its intents in flight go out again (with the same key) once their lease
    /// expired. At least [`MIN_LEASE`](crate::MIN_LEASE) (shorter is taken as that). Unset,
    /// a runtime uses the lease its context was opened with
    /// ([`OpenOptions`](crate::OpenOptions), 30 s by default) and a drainer 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease.max(crate::model::delivery::MIN_LEASE));
        self
    }

    /// At most `limit` intents of `kind` handed to dispatchers, counted across every drain
    /// of the store (every drainer and runtime, in every process, that states the limit):
    /// the limit's bucket is kept in the store, and claims spend from it. Intents of the kind
    /// beyond the limit stay pending (due, not claimed) until the bucket allows them.
    ///
    /// A failed attempt of the kind whose error carries a
    /// [`retry_after`](crate::DispatchError::retry_after) (a 429 or 503 with `Retry-After`
    /// through `reactifact-webhook`) pauses the whole bucket until then, for every drain of
    /// the store, not only its own key; intents of the kind already claimed by this drain but
    /// not yet started are given back.
    ///
    /// The same as [`rate_limit_shared`](DeliveryOptions::rate_limit_shared) with a bucket
    /// named after the kind. Every drain of a store should state the same limit: the bucket's
    /// state is shared, the limit is each drain's.
    pub fn rate_limit(self, kind: &str, limit: RateLimit) -> Self {
        self.rate_limit_shared(kind, [kind], limit)
    }

    /// One rate limit for several kinds that reach the same receiver (a route of a
    /// [`Router`](crate::Router) whose handlers call one provider): their intents together
    /// are at most `limit`, spent from the bucket `name`. A kind spends from one bucket only:
    /// the builders refuse a kind named by two
    /// ([`BuildError::Delivery`](crate::error::BuildError::Delivery)). Stating a bucket's name
    /// again replaces it.
    pub fn rate_limit_shared<S: AsRef<str>>(
        mut self,
        name: &str,
        kinds: impl IntoIterator<Item = S>,
        limit: RateLimit,
    ) -> Self {
        let bucket = RateBucket {
            name: Arc::from(name),
            kinds: kinds.into_iter().map(|k| Arc::from(k.as_ref())).collect(),
            limit,
        };
        match self.claims.rates.iter_mut().find(|b| b.name == bucket.name) {
            Some(old) => *old = bucket,
            None => self.claims.rates.push(bucket),
        }
        self
    }

    /// The priority of an action kind (default 0): after the sessions' turns (see
    /// [`take_turns`](DeliveryOptions::take_turns)), a claim takes the due intents of
    /// higher-priority kinds before those of lower ones, and due order among equals, across
    /// every drain of the store that states it. A backlog of a low-priority kind then waits
    /// behind every due intent of a higher one. Stating a kind's priority again replaces it.
    pub fn priority(mut self, kind: &str, priority: i32) -> Self {
        match self.claims.priorities.iter_mut().find(|(k, _)| &**k == kind) {
            Some(old) => old.1 = priority,
            None => self.claims.priorities.push((Arc::from(kind), priority)),
        }
        self
    }

    /// Whether sessions take turns in this drain's claims (default: no, due order). With
    /// turns, a claim of several sessions (a drainer of `Scope::all()`, or a scope of several
    /// sessions, without a kind filter) first takes the earliest due intent of each session
    /// that registered one, then the rest of its batch: one session's backlog (a tenant's, a
    /// conversation's) then delays another session's intent by one claim at most, instead of
    /// by the whole backlog. When more sessions wait than a claim takes, which of them get a
    /// turn is drawn anew for every claim. It costs each claim one index probe per other
    /// session with a due or scheduled intent (docs/outbox.md, "Sessions take turns").
    pub fn take_turns(mut self, turns: bool) -> Self {
        self.claims.turns = turns;
        self
    }

    /// Refuses options that cannot deliver as given, as both builders do.
    pub(crate) fn check(&self) -> Result<(), BuildError> {
        let refuse = |problem: String| Err(BuildError::Delivery { problem });
        if self.timeout == Some(Duration::ZERO) {
            return refuse("an attempt timeout of zero cancels every attempt; give a positive timeout, or None to wait as long as the dispatcher takes".to_owned());
        }
        for (i, bucket) in self.claims.rates.iter().enumerate() {
            if let Some(problem) = bucket.limit.problem() {
                return refuse(format!("rate limit `{}`: {problem}", bucket.name));
            }
            if bucket.kinds.is_empty() {
                return refuse(format!("rate limit `{}` names no action kind", bucket.name));
            }
            for kind in &bucket.kinds {
                if let Some(other) = self.claims.rates[..i].iter().find(|b| b.covers(kind)) {
                    return refuse(format!(
                        "action kind `{kind}` is in two rate limits, `{}` and `{}`; a kind spends from one",
                        other.name, bucket.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The rate limit `kind` spends from, if any.
    pub(crate) fn bucket_of(&self, kind: &str) -> Option<&RateBucket> {
        self.claims.rates.iter().find(|b| b.covers(kind))
    }

    /// The retry policy of `kind`.
    pub(crate) fn policy_for(&self, kind: &str) -> &RetryPolicy {
        self.policies.get(kind).unwrap_or(&self.policy)
    }
}

/// What a failed delivery does to the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryErrors {
    /// Failures are recorded in the ledger and listed in the drain's report; the drain goes
    /// on with the other intents.
    #[default]
    Continue,
    /// The first failure stops the drain: deliveries already running finish and are
    /// recorded, none starts after it, and the turn returns
    /// [`RunError::Delivery`](crate::RunError::Delivery).
    FailLoud,
}
