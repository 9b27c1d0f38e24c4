//! The endpoints: each reads or changes the store through its own operations and answers one
//! JSON document (the CLI's `--json` schema, from [`crate::json`]).

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use reactifact_core::error::{ApprovalError, CancelError, RetryError};
use reactifact_core::ledger::{Delivery, DeliveryStatus, LedgerQuery};
use reactifact_core::runtime::Generation;
use reactifact_core::Scope;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::auth::Principal;
use crate::config::Config;
use crate::error::ApiError;
use crate::json::{
    artifact_json, attempt_json, commit_json, counts_json, delivery_json, run_json, session_json, status,
    unreadable_json, verified_json, why_json,
};
use crate::params::Params;

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) config: Config,
}

type Answer = Result<Json<Value>, ApiError>;

/// A path's parameters, or 400 (a segment that is not UTF-8 once decoded, …).
fn path<T>(extracted: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    extracted
        .map(|Path(value)| value)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))
}

/// The scope of `session` (which must exist) and `kind` filters.
async fn scope(shared: &Shared, params: &Params) -> Result<Scope, ApiError> {
    let mut scope = Scope::all();
    if let Some(session) = params.text("session") {
        check_session(shared, session).await?;
        scope = scope.sessions([session]);
    }
    if let Some(kind) = params.text("kind") {
        scope = scope.kinds([kind]);
    }
    Ok(scope)
}

async fn check_session(shared: &Shared, session: &str) -> Result<(), ApiError> {
    let sessions = shared.config.store.sessions().await?;
    if sessions.iter().any(|s| s.name == session) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no session `{}`", clip(session))))
    }
}

/// `text` cut to 200 characters, for messages that quote what a request sent.
fn clip(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

fn unknown_key(key: &str) -> ApiError {
    ApiError::not_found(format!("no intent with key `{}` in the delivery ledger", clip(key)))
}

/// `GET /sessions`.
pub(crate) async fn sessions(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Answer {
    Params::parse(query.as_deref(), &[])?;
    let sessions = shared.config.store.sessions().await?;
    Ok(Json(
        json!({ "sessions": sessions.iter().map(session_json).collect::<Vec<_>>() }),
    ))
}

/// `GET /sessions/{session}/log?before=&limit=`: commits newest first.
pub(crate) async fn log(
    State(shared): State<Arc<Shared>>,
    session: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Answer {
    let session = path(session)?;
    let params = Params::parse(query.as_deref(), &["before", "limit"])?;
    let limit = params.limit(20)?;
    let before = params.number("before")?;
    check_session(&shared, &session).await?;
    let ctx = shared.config.store.open_session(&session, false).await?;
    let log = ctx.log().map_err(ApiError::store)?;
    let head = ctx.generation().0;
    // Commits with a generation <= `before` (the head by default), newest first.
    let end = before.map_or(head, |b| b.min(head));
    let end = usize::try_from(end).unwrap_or(usize::MAX).min(log.len());
    let start = end.saturating_sub(limit);
    let commits: Vec<Value> = log[start..end].iter().rev().map(commit_json).collect();
    let next = (start > 0).then_some(start as u64);
    Ok(Json(json!({
        "session": session,
        "generation": head,
        "commits": commits,
        "next": next,
    })))
}

/// `GET /sessions/{session}/artifacts/{id}?at=`: an artifact at the head or right after a
/// commit.
pub(crate) async fn artifact(
    State(shared): State<Arc<Shared>>,
    ids: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Answer {
    let (session, id) = path(ids)?;
    let params = Params::parse(query.as_deref(), &["at"])?;
    check_session(&shared, &session).await?;
    let ctx = shared.config.store.open_session(&session, false).await?;
    let head = ctx.generation();
    let at = match params.number("at")? {
        None => head,
        Some(at) if at <= head.0 => Generation(at),
        Some(at) => {
            return Err(ApiError::not_found(format!(
                "session `{session}` has no commit {at}: its log ends at commit {}",
                head.0
            )))
        }
    };
    let snapshot = if at == head {
        ctx.snapshot()
    } else {
        ctx.state_at(at).map_err(|e| ApiError::bad_request(e.to_string()))?
    };
    let stored = snapshot.stored(&id).ok_or_else(|| {
        ApiError::not_found(format!(
            "no artifact `{}` in session `{session}` at commit {}",
            clip(&id),
            at.0
        ))
    })?;
    Ok(Json(artifact_json(&session, at.0, &stored)))
}

/// `GET /outbox/counts?session=&kind=`.
pub(crate) async fn counts(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Answer {
    let params = Params::parse(query.as_deref(), &["session", "kind"])?;
    let scope = scope(&shared, &params).await?;
    let outbox = shared.config.store.outbox().await?;
    let counts = outbox.counts(&scope).await?;
    Ok(Json(json!({ "counts": counts_json(&counts) })))
}

/// A page of the ledger: `status` fixed (the approval queue) or from the parameters.
async fn page(shared: &Shared, params: &Params, status: Option<DeliveryStatus>) -> Answer {
    let scope = scope(shared, params).await?;
    let query = LedgerQuery {
        scope,
        status,
        after: params.number("after")?,
        limit: params.limit(100)?,
    };
    let outbox = shared.config.store.outbox().await?;
    let page = outbox.list(&query).await?;
    let prefix = params.text("key_prefix").unwrap_or("");
    let entries: Vec<Value> = page
        .entries
        .iter()
        .filter(|d| d.key().as_str().starts_with(prefix))
        .map(delivery_json)
        .collect();
    Ok(Json(json!({ "entries": entries, "next": page.next })))
}

/// `GET /outbox?status=&kind=&session=&key_prefix=&after=&limit=`.
pub(crate) async fn outbox(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Answer {
    let params = Params::parse(
        query.as_deref(),
        &["status", "kind", "session", "key_prefix", "after", "limit"],
    )?;
    let status = params.status()?;
    page(&shared, &params, status).await
}

/// `GET /approvals?kind=&session=&key_prefix=&after=&limit=`: the intents awaiting approval.
pub(crate) async fn approvals(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Answer {
    let params = Params::parse(query.as_deref(), &["kind", "session", "key_prefix", "after", "limit"])?;
    page(&shared, &params, Some(DeliveryStatus::AwaitingApproval)).await
}

/// `GET /outbox/{key}`: the entry, its payload (or its hash and size), the run that recorded
/// it, its attempts, and its provenance (`why`).
pub(crate) async fn intent(
    State(shared): State<Arc<Shared>>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Answer {
    let key = path(key)?;
    Params::parse(query.as_deref(), &[])?;
    let outbox = shared.config.store.outbox().await?;
    let delivery = outbox.get(&key).await?.ok_or_else(|| unknown_key(&key))?;
    let attempts = outbox.attempts(&key).await?.unwrap_or_default();
    let payload = delivery.intent().payload_bytes();
    let mut entry = delivery_json(&delivery);
    entry["payload"] = if shared.config.show_payloads {
        crate::json_value::decode(payload).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    entry["payload_hidden"] = json!(!shared.config.show_payloads);
    entry["payload_sha256"] = json!(hex(&Sha256::digest(payload)));
    entry["payload_bytes"] = json!(payload.len());
    entry["attempt_history"] = attempts.iter().map(attempt_json).collect();
    let origin = delivery.origin();
    let (run, why) = match shared.config.store.open_session(origin.session(), false).await {
        Ok(ctx) => {
            let run = ctx
                .commit_of(origin)
                .ok()
                .flatten()
                .and_then(|c| c.runs.get(origin.run()))
                .map(run_json);
            let why = ctx.provenance(&key).await?.map(|p| why_json(&key, ctx.session(), &p));
            (run, why)
        }
        Err(_) => (None, None),
    };
    entry["run"] = run.unwrap_or(Value::Null);
    entry["why"] = why.unwrap_or(Value::Null);
    Ok(Json(entry))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A POST body: empty, `null`, or a JSON object with an optional `reason`.
fn reason(body: &Bytes) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not a JSON object: {e}")))?;
    if value.is_null() {
        return Ok(None);
    }
    let Value::Object(map) = value else {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    };
    if let Some(other) = map.keys().find(|k| *k != "reason") {
        return Err(ApiError::bad_request(format!(
            "unknown body field `{}`; the body takes `reason`",
            clip(other)
        )));
    }
    match map.get("reason") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request("body field `reason` must be a string")),
    }
}

fn changed(what: &str, entry: &Delivery) -> Json<Value> {
    Json(json!({ what: [delivery_json(entry)], "skipped": [] }))
}

/// `POST /outbox/{key}/approve`: approved by the token's principal.
pub(crate) async fn approve(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<Principal>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Answer {
    let key = path(key)?;
    Params::parse(query.as_deref(), &[])?;
    reason(&body)?;
    let outbox = shared.config.store.outbox().await?;
    let entry = outbox
        .approve(&key, &who.name, SystemTime::now())
        .await
        .map_err(|e| refused_decision(&key, e))?;
    Ok(changed("approved", &entry))
}

/// `POST /outbox/{key}/reject` with `{"reason": …}` (required): rejected by the token's
/// principal.
pub(crate) async fn reject(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<Principal>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Answer {
    let key = path(key)?;
    Params::parse(query.as_deref(), &[])?;
    let Some(why) = reason(&body)? else {
        return Err(ApiError::bad_request(
            "a rejection needs a reason: send {\"reason\": \"…\"}",
        ));
    };
    let outbox = shared.config.store.outbox().await?;
    let entry = outbox
        .reject(&key, &who.name, &why, SystemTime::now())
        .await
        .map_err(|e| refused_decision(&key, e))?;
    Ok(changed("rejected", &entry))
}

fn refused_decision(key: &str, e: ApprovalError) -> ApiError {
    match e {
        ApprovalError::UnknownKey(_) => unknown_key(key),
        ApprovalError::NotAwaiting { status: s, .. } => ApiError::conflict(format!(
            "intent `{}` is {}, not awaiting approval",
            clip(key),
            status(s)
        )),
        ApprovalError::Store(e) => ApiError::store(e),
        e => ApiError::conflict(e.to_string()),
    }
}

/// `POST /outbox/{key}/retry`: a failed, dead or held intent re-armed.
pub(crate) async fn retry(
    State(shared): State<Arc<Shared>>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Answer {
    let key = path(key)?;
    Params::parse(query.as_deref(), &[])?;
    reason(&body)?;
    let outbox = shared.config.store.outbox().await?;
    let entry = outbox.retry(&key, SystemTime::now()).await.map_err(|e| match e {
        RetryError::UnknownKey(_) => unknown_key(&key),
        RetryError::NotFailed { status: s, .. } => ApiError::conflict(format!(
            "intent `{}` is {}; only failed, dead and held intents can be retried",
            clip(&key),
            status(s)
        )),
        RetryError::Store(e) => ApiError::store(e),
        e => ApiError::conflict(e.to_string()),
    })?;
    Ok(changed("retried", &entry))
}

/// `POST /outbox/{key}/cancel` with an optional `{"reason": …}`: cancelled, the reason
/// recorded with the token's principal.
pub(crate) async fn cancel(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<Principal>,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Answer {
    let key = path(key)?;
    Params::parse(query.as_deref(), &[])?;
    let why = reason(&body)?.unwrap_or_else(|| "cancelled from the console".to_owned());
    let recorded = format!("{why} (by {})", who.name);
    let outbox = shared.config.store.outbox().await?;
    let entry = outbox
        .cancel(&key, &recorded, SystemTime::now())
        .await
        .map_err(|e| match e {
            CancelError::UnknownKey(_) => unknown_key(&key),
            CancelError::NotCancellable { status: s, .. } => ApiError::conflict(format!(
                "intent `{}` is {} and cannot be cancelled",
                clip(&key),
                status(s)
            )),
            CancelError::Store(e) => ApiError::store(e),
            e => ApiError::conflict(e.to_string()),
        })?;
    Ok(changed("cancelled", &entry))
}

/// `GET /verify?session=`: every session's log (or one's) refolded and checked.
pub(crate) async fn verify(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Answer {
    let params = Params::parse(query.as_deref(), &["session"])?;
    let names: Vec<String> = match params.text("session") {
        Some(name) => {
            check_session(&shared, name).await?;
            vec![name.to_owned()]
        }
        None => shared
            .config
            .store
            .sessions()
            .await?
            .into_iter()
            .map(|s| s.name)
            .collect(),
    };
    let mut results = Vec::new();
    for name in &names {
        let result = match shared.config.store.open_session(name, false).await {
            Ok(ctx) => match ctx.verify() {
                Ok(report) => verified_json(name, Ok(&report)),
                Err(e) => verified_json(
                    name,
                    Err((ctx.generation().0, ctx.head().map(|h| h.to_string()), e.to_string())),
                ),
            },
            Err(e) => unreadable_json(name, &e.to_string()),
        };
        results.push(result);
    }
    let ok = results.iter().all(|r| r["ok"] == true);
    Ok(Json(json!({ "ok": ok, "sessions": results })))
}

/// Any other path: 404.
pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint; docs/console.md lists them")
}

/// A known path with another method: 405.
pub(crate) async fn wrong_method() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: "method not allowed on this endpoint".to_owned(),
    }
}
