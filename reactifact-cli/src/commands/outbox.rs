//! `outbox …`: the delivery ledger. `list`, `show` and `stats` read it through a read-only
//! connection; `retry`, `cancel`, `approve`, `reject` and `purge` are the store's own operations
//! ([`OutboxStore`]), so fencing applies and they are safe while drainers run.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use reactifact_core::error::{ApprovalError, CancelError, RetryError};
use reactifact_core::ledger::{AttemptOutcome, Delivery, DeliveryStatus, LedgerQuery, PurgeFilter};
use reactifact_core::Scope;
use serde_json::{json, Value};

use super::Env;
use crate::cli::{OutboxCommand, RetryArgs, StatusArg};
use crate::failure::{Failure, Outcome};
use crate::output::{
    age, attempt_json, attempt_outcome, cut, decision_line, delivery_json, json_time, print_fields, print_json, status,
    time, time_or_dash, Table,
};
use reactifact_admin::json::{counts_json, run_json};
use reactifact_admin::json_value;

/// How many final entries one purge operation deletes (it runs until none is left).
const PURGE_BATCH: usize = 1000;

/// Runs an `outbox` command.
pub fn outbox(env: &Env, command: OutboxCommand) -> Outcome {
    match command {
        OutboxCommand::List {
            status,
            kind,
            session,
            limit,
            after,
        } => list(env, status, kind, session, limit, after),
        OutboxCommand::Show { key } => show(env, &key),
        OutboxCommand::Stats { session } => stats(env, session),
        OutboxCommand::Retry(args) => retry(env, args),
        OutboxCommand::Cancel { key, reason } => cancel(env, &key, &reason),
        OutboxCommand::Approve { key, by } => decide(env, &key, &by, None),
        OutboxCommand::Reject { key, by, reason } => decide(env, &key, &by, Some(&reason)),
        OutboxCommand::Purge {
            delivered,
            cancelled,
            rejected,
            older_than,
        } => purge(env, &purge_filters(delivered, cancelled, rejected), older_than),
    }
}

fn scope(env: &Env, session: Option<&str>, kind: Option<&str>) -> Outcome<Scope> {
    let mut scope = Scope::all();
    if let Some(session) = session {
        env.store.check_session(session)?;
        scope = scope.sessions([session]);
    }
    if let Some(kind) = kind {
        scope = scope.kinds([kind]);
    }
    Ok(scope)
}

fn unknown_key(env: &Env, key: &str) -> Failure {
    Failure::input(format!(
        "no intent with key `{key}` in the delivery ledger of {}; `reactifact outbox list` lists the keys",
        env.store.shown()
    ))
}

fn list(
    env: &Env,
    status_filter: Option<StatusArg>,
    kind: Option<String>,
    session: Option<String>,
    limit: usize,
    after: Option<u64>,
) -> Outcome {
    let scope = scope(env, session.as_deref(), kind.as_deref())?;
    let outbox = env.store.outbox()?;
    let query = LedgerQuery {
        scope,
        status: status_filter.map(StatusArg::status),
        after,
        limit: limit.max(1),
    };
    let page = env.wait(outbox.list(&query)).map_err(Failure::store)?;
    if env.json {
        print_json(&json!({
            "entries": page.entries.iter().map(delivery_json).collect::<Vec<_>>(),
            "next": page.next,
        }));
        return Ok(());
    }
    let mut table = Table::new(&["KEY", "KIND", "STATUS", "ATTEMPTS", "SESSION", "UPDATED", "LAST ERROR"]);
    for d in &page.entries {
        table.row(vec![
            d.key().to_string(),
            d.kind().to_owned(),
            status(d.status()).to_owned(),
            d.attempts().to_string(),
            d.origin().session().to_owned(),
            time(d.updated_at()),
            cut(d.last_error().unwrap_or("-"), 60),
        ]);
    }
    table.print();
    if let Some(next) = page.next {
        outln!("(more: --after {next})");
    }
    Ok(())
}

fn show(env: &Env, key: &str) -> Outcome {
    let outbox = env.store.outbox()?;
    let delivery = env
        .wait(outbox.get(key))
        .map_err(Failure::store)?
        .ok_or_else(|| unknown_key(env, key))?;
    // Read after the entry: an attempt that ended in between shows in the history, and the
    // entry above may still show it in flight.
    let attempts = env
        .wait(outbox.attempts(key))
        .map_err(Failure::store)?
        .unwrap_or_default();
    let payload = delivery.intent().payload_bytes();
    // The run that recorded it, from the log of the session that did.
    let origin = delivery.origin();
    let run = match env.store.open_session(origin.session(), false) {
        Ok(ctx) => ctx
            .commit_of(origin)
            .ok()
            .flatten()
            .and_then(|c| c.runs.get(origin.run()))
            .map(run_json),
        Err(_) => None,
    };
    if env.json {
        let mut entry = delivery_json(&delivery);
        entry["payload"] = json_value::decode(payload).unwrap_or(Value::Null);
        entry["run"] = run.unwrap_or(Value::Null);
        entry["attempt_history"] = attempts.iter().map(attempt_json).collect();
        print_json(&entry);
        return Ok(());
    }
    let d = &delivery;
    let mut fields = vec![
        ("key", d.key().to_string()),
        ("kind", d.kind().to_owned()),
        ("status", status(d.status()).to_owned()),
        (
            "attempts",
            format!(
                "{} ({} failed, {} ended by an expired lease, {} interrupted)",
                d.attempts(),
                d.failed_attempts(),
                d.expired_leases(),
                d.interrupted_attempts()
            ),
        ),
        ("last error", d.last_error().unwrap_or("-").to_owned()),
        (
            "lease",
            d.lease().map_or_else(
                || "-".to_owned(),
                |l| format!("{} until {} (token {})", l.owner, time(l.expires_at), l.token),
            ),
        ),
        ("token", d.token().to_string()),
        ("next attempt", time_or_dash(d.next_attempt_at())),
        ("not before", time_or_dash(d.not_before())),
        ("group", d.group().unwrap_or("-").to_owned()),
        ("recorded", time(d.recorded_at())),
        ("updated", time(d.updated_at())),
        ("delivered", time_or_dash(d.delivered_at())),
    ];
    if let Some(reason) = d.cancel_reason() {
        fields.push(("cancelled", reason.to_owned()));
    }
    if let Some(decision) = d.decision() {
        fields.push(("decision", decision_line(decision)));
    }
    fields.push((
        "traceparent",
        d.intent()
            .trace_parent()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
    ));
    fields.push((
        "origin",
        format!(
            "session {}, commit {} ({}), run {}",
            origin.session(),
            origin.generation().0,
            origin.commit().short(),
            origin.run()
        ),
    ));
    fields.push((
        "recorded by",
        match &run {
            Some(run) => {
                let by = match (run["agent"].as_str(), run["produce"].as_str()) {
                    (Some(agent), Some(produce)) => format!("{agent}/{produce}"),
                    _ => "a direct write".to_owned(),
                };
                match run["trigger"].as_object() {
                    Some(t) => format!(
                        "{by}, triggered by {} v{}",
                        t["id"].as_str().unwrap_or("?"),
                        t["version"]
                    ),
                    None => by,
                }
            }
            None => format!("(the commit is not in session `{}`'s log)", origin.session()),
        },
    ));
    fields.push(("payload", json_value::pretty(payload)));
    print_fields(&fields);
    outln!();
    if attempts.is_empty() {
        outln!("no attempt yet");
        return Ok(());
    }
    let mut table = Table::new(&[
        "#",
        "TOKEN",
        "OUTCOME",
        "OWNER",
        "CLAIMED",
        "LEASE UNTIL",
        "ENDED",
        "ERROR",
    ]);
    for a in &attempts {
        let error = match &a.outcome {
            AttemptOutcome::Failed {
                error,
                retry_at: Some(at),
            } => format!("{error} (retry at {})", time(*at)),
            other => other.error().unwrap_or("-").to_owned(),
        };
        table.row(vec![
            a.number.to_string(),
            a.token.0.to_string(),
            attempt_outcome(&a.outcome).to_owned(),
            a.owner.to_string(),
            time(a.claimed_at),
            time(a.lease_expires_at),
            time_or_dash(a.ended_at),
            cut(&error, 60),
        ]);
    }
    table.print();
    Ok(())
}

fn stats(env: &Env, session: Option<String>) -> Outcome {
    let scope = scope(env, session.as_deref(), None)?;
    let outbox = env.store.outbox()?;
    let counts = env.wait(outbox.counts(&scope)).map_err(Failure::store)?;
    // Per kind: one pass over the ledger, a page at a time.
    let mut by_kind: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut after = None;
    loop {
        let query = LedgerQuery {
            scope: scope.clone(),
            status: None,
            after,
            limit: 1000,
        };
        let page = env.wait(outbox.list(&query)).map_err(Failure::store)?;
        for d in &page.entries {
            *by_kind
                .entry(d.kind().to_owned())
                .or_default()
                .entry(status(d.status()))
                .or_default() += 1;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let oldest_query = LedgerQuery {
        scope,
        status: Some(DeliveryStatus::Pending),
        after: None,
        limit: 1,
    };
    let oldest = env
        .wait(outbox.list(&oldest_query))
        .map_err(Failure::store)?
        .entries
        .into_iter()
        .next();
    let now = SystemTime::now();
    // The rate limits' buckets: a time that has passed is shown as none (not paused; the
    // bucket is full).
    let rates = env.wait(outbox.rate_states()).map_err(Failure::store)?;
    let ahead = |us: u64| {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(us);
        (at > now).then_some(at)
    };
    if env.json {
        print_json(&json!({
            "counts": counts_json(&counts),
            "by_kind": by_kind,
            "oldest_pending": oldest.as_ref().map(|d| json!({
                "key": d.key().as_str(),
                "recorded_at": time(d.recorded_at()),
                "age_seconds": age(now, d.recorded_at()).as_secs(),
            })),
            "rate_limits": rates.iter().map(|(name, state)| json!({
                "name": name,
                "paused_until": json_time(ahead(state.paused_until)),
                "spent_until": json_time(ahead(state.tat)),
            })).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    let mut table = Table::new(&["STATUS", "COUNT"]);
    for s in DeliveryStatus::ALL {
        let label = if s == DeliveryStatus::Failed {
            format!("failed ({} retrying)", counts.retrying)
        } else {
            status(s).to_owned()
        };
        table.row(vec![label, counts.of(s).to_string()]);
    }
    table.row(vec!["total".to_owned(), counts.total().to_string()]);
    table.print();
    outln!();
    let columns = DeliveryStatus::ALL.map(status);
    let mut headers = vec!["KIND"];
    headers.extend(columns.iter().copied());
    let upper: Vec<String> = headers.iter().map(|h| h.to_uppercase()).collect();
    let mut table = Table::new(&upper.iter().map(String::as_str).collect::<Vec<_>>());
    for (kind, per) in &by_kind {
        let mut row = vec![kind.clone()];
        row.extend(columns.iter().map(|c| per.get(c).copied().unwrap_or(0).to_string()));
        table.row(row);
    }
    table.print();
    outln!();
    match &oldest {
        Some(d) => outln!(
            "oldest pending: {} ({} ago, recorded {})",
            d.key(),
            humantime::format_duration(age(now, d.recorded_at())),
            time(d.recorded_at())
        ),
        None => outln!("oldest pending: none"),
    }
    if !rates.is_empty() {
        outln!();
        let mut table = Table::new(&["RATE LIMIT", "PAUSED UNTIL", "SPENT UNTIL"]);
        for (name, state) in &rates {
            table.row(vec![
                name.clone(),
                time_or_dash(ahead(state.paused_until)),
                time_or_dash(ahead(state.tat)),
            ]);
        }
        table.print();
    }
    Ok(())
}

fn retry(env: &Env, args: RetryArgs) -> Outcome {
    if let Some(key) = args.key {
        let outbox = env.store.outbox()?;
        let entry = env.wait(outbox.retry(&key, SystemTime::now())).map_err(|e| match e {
            RetryError::UnknownKey(_) => unknown_key(env, &key),
            RetryError::NotFailed { status: s, .. } => Failure::input(format!(
                "intent `{key}` is {}; only failed, dead and held intents can be retried",
                status(s)
            )),
            e => Failure::input(e.to_string()),
        })?;
        return report_changed(env, "retried", &[entry], &[]);
    }
    // --all-dead: the dead keys first, then each re-armed by the store's operation.
    let scope = scope(env, None, args.kind.as_deref())?;
    let outbox = env.store.outbox()?;
    let mut dead = Vec::new();
    let mut after = None;
    loop {
        let query = LedgerQuery {
            scope: scope.clone(),
            status: Some(DeliveryStatus::Dead),
            after,
            limit: 1000,
        };
        let page = env.wait(outbox.list(&query)).map_err(Failure::store)?;
        dead.extend(page.entries.iter().map(|d| d.key().clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut retried = Vec::new();
    let mut skipped = Vec::new();
    for key in dead {
        match env.wait(outbox.retry(key.as_str(), SystemTime::now())) {
            Ok(entry) => retried.push(entry),
            // Another operator or process changed it since it was listed.
            Err(e @ (RetryError::NotFailed { .. } | RetryError::UnknownKey(_))) => {
                skipped.push((key.to_string(), e.to_string()))
            }
            Err(e) => return Err(Failure::input(e.to_string())),
        }
    }
    report_changed(env, "retried", &retried, &skipped)
}

fn cancel(env: &Env, key: &str, reason: &str) -> Outcome {
    let outbox = env.store.outbox()?;
    let entry = env
        .wait(outbox.cancel(key, reason, SystemTime::now()))
        .map_err(|e| match e {
            CancelError::UnknownKey(_) => unknown_key(env, key),
            CancelError::NotCancellable { status: s, .. } => Failure::input(format!(
                "intent `{key}` is {} and cannot be cancelled (only pending, failed, dead and held intents can)",
                status(s)
            )),
            e => Failure::input(e.to_string()),
        })?;
    report_changed(env, "cancelled", &[entry], &[])
}

/// `outbox approve` (no `reason`) and `outbox reject`.
fn decide(env: &Env, key: &str, by: &str, reason: Option<&str>) -> Outcome {
    let outbox = env.store.outbox()?;
    let now = SystemTime::now();
    let decided = match reason {
        None => env.wait(outbox.approve(key, by, now)),
        Some(reason) => env.wait(outbox.reject(key, by, reason, now)),
    };
    let entry = decided.map_err(|e| match e {
        ApprovalError::UnknownKey(_) => unknown_key(env, key),
        ApprovalError::NotAwaiting { status: s, .. } => Failure::input(format!(
            "intent `{key}` is {}, not awaiting approval; only an intent acted with approval can be approved or rejected",
            status(s)
        )),
        e => Failure::input(e.to_string()),
    })?;
    let what = if reason.is_none() { "approved" } else { "rejected" };
    if env.json {
        return report_changed(env, what, &[entry], &[]);
    }
    // What the decision is bound to: only these bytes ever go out under it.
    let digest = entry
        .decision()
        .and_then(|d| d.digest)
        .map_or_else(|| "none (an older build decided)".to_owned(), |h| h.to_string());
    outln!(
        "{what} {}: now {}, digest {digest}",
        entry.key(),
        status(entry.status())
    );
    Ok(())
}

fn report_changed(env: &Env, what: &str, entries: &[Delivery], skipped: &[(String, String)]) -> Outcome {
    if env.json {
        print_json(&json!({
            what: entries.iter().map(delivery_json).collect::<Vec<_>>(),
            "skipped": skipped.iter().map(|(key, reason)| json!({"key": key, "reason": reason})).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    for d in entries {
        outln!("{what} {}: now {}", d.key(), status(d.status()));
    }
    for (key, reason) in skipped {
        outln!("skipped {key}: {reason}");
    }
    if entries.is_empty() && skipped.is_empty() {
        outln!("nothing to do: no intent matched");
    }
    Ok(())
}

/// What `--delivered`, `--cancelled` and `--rejected` ask to purge (clap requires at least
/// one): the store's filters, one per status asked for, or all final entries for all three.
fn purge_filters(delivered: bool, cancelled: bool, rejected: bool) -> Vec<PurgeFilter> {
    if delivered && cancelled && rejected {
        return vec![PurgeFilter::Final];
    }
    [
        (delivered, PurgeFilter::Delivered),
        (cancelled, PurgeFilter::Cancelled),
        (rejected, PurgeFilter::Rejected),
    ]
    .into_iter()
    .filter_map(|(asked, filter)| asked.then_some(filter))
    .collect()
}

fn purge(env: &Env, filters: &[PurgeFilter], older_than: Duration) -> Outcome {
    let now = SystemTime::now();
    let before = now.checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH);
    let outbox = env.store.outbox()?;
    let mut purged = 0u64;
    for &filter in filters {
        loop {
            let n = env
                .wait(outbox.purge(filter, before, PURGE_BATCH))
                .map_err(Failure::store)?;
            purged += n;
            if n < PURGE_BATCH as u64 {
                break;
            }
        }
    }
    let statuses: Vec<&str> = DeliveryStatus::ALL
        .into_iter()
        .filter(|s| filters.iter().any(|f| f.admits(*s)))
        .map(status)
        .collect();
    let which = statuses.join(" or ");
    if env.json {
        print_json(&json!({"purged": purged, "before": time(before), "statuses": statuses}));
    } else {
        print_fields(&[
            ("purged", format!("{purged} final entries ({which})")),
            (
                "before",
                format!(
                    "{} (last changed longer ago than {})",
                    time(before),
                    humantime::format_duration(older_than)
                ),
            ),
        ]);
    }
    Ok(())
}
