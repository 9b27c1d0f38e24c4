//! `why` and `graph`: an intent's provenance — the commit and run that recorded it, its
//! trigger and reads, and its delivery — as text, JSON, Mermaid or DOT.

use reactifact_admin::json::why_json;
use reactifact_core::audit::{Cause, Provenance};
use reactifact_core::ledger::Delivery;
use reactifact_core::runtime::{CallOutcome, RecordedCall};
use reactifact_core::Context;
use serde_json::json;

use super::Env;
use crate::cli::GraphFormat;
use crate::failure::{Failure, Outcome};
use crate::output::{decision_line, print_fields, print_json, status};

/// Opens the session to look for `key` in: the one named, or the one whose commit recorded
/// the intent (from the ledger). Returns it with the ledger entry, if the ledger has one.
fn session_of(env: &Env, key: &str, session: Option<&str>) -> Outcome<(Context, Option<Delivery>)> {
    let outbox = env.store.outbox()?;
    let delivery = env.wait(outbox.get(key)).map_err(Failure::store)?;
    let session = match (session, &delivery) {
        (Some(named), _) => env.store.session(Some(named))?,
        (None, Some(d)) => d.origin().session().to_owned(),
        (None, None) => {
            return Err(Failure::input(format!(
                "no intent with key `{key}` in the delivery ledger of {}; `reactifact outbox list` lists the keys",
                env.store.shown()
            )))
        }
    };
    Ok((env.store.open_session(&session, false)?, delivery))
}

fn provenance<'a>(env: &Env, ctx: &'a Context, key: &str, delivery: Option<&Delivery>) -> Outcome<Provenance<'a>> {
    env.wait(ctx.provenance(key)).map_err(Failure::store)?.ok_or_else(|| {
        let recorded = delivery.map_or_else(String::new, |d| {
            format!(
                "; it was recorded in session `{}` (try --session {})",
                d.origin().session(),
                d.origin().session()
            )
        });
        Failure::input(format!(
            "no commit of session `{}` acts `{key}`{recorded}",
            ctx.session()
        ))
    })
}

/// `why KEY`.
pub fn why(env: &Env, key: &str, session: Option<&str>) -> Outcome {
    let (ctx, delivery) = session_of(env, key, session)?;
    let p = provenance(env, &ctx, key, delivery.as_ref())?;
    if env.json {
        print_json(&why_json(key, ctx.session(), &p));
        return Ok(());
    }
    let by = match (p.agent(), p.produce()) {
        (Some(agent), Some(produce)) => format!("{agent}/{produce}"),
        _ => "a direct write".to_owned(),
    };
    let reads = if p.reads().is_empty() {
        "nothing recorded".to_owned()
    } else {
        p.reads()
            .iter()
            .map(|r| match r.version {
                Some(v) => format!("{} v{}", r.id, v.0),
                None => format!("{} (absent)", r.id),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    print_fields(&[
        ("key", key.to_owned()),
        ("session", ctx.session().to_owned()),
        ("commit", format!("{} ({})", p.generation.0, p.commit.short())),
        ("run", format!("{} by {by}", p.run)),
        (
            "trigger",
            p.trigger().map_or_else(
                || "none (a direct write)".to_owned(),
                |t| format!("{} v{} (content {})", t.id, t.version.0, t.hash.short()),
            ),
        ),
        ("reads", reads),
        ("calls", calls_line(p.calls())),
        ("chain", chain_line(&p.chain)),
        (
            "approval",
            match (p.requires_approval, p.decision()) {
                (false, _) => "not required".to_owned(),
                (true, None) => "required, not given yet".to_owned(),
                (true, Some(d)) => decision_line(d),
            },
        ),
        (
            "delivery",
            p.delivery.as_ref().map_or_else(
                || "not in this store's ledger".to_owned(),
                |d| format!("{} after {} attempt(s)", status(d.status()), d.attempts()),
            ),
        ),
    ]);
    Ok(())
}

/// The run's recorded calls on one line: `draft (small-model, 12+34 tokens, answer 1a2b3c4d5e6f)`.
fn calls_line(calls: &[RecordedCall]) -> String {
    if calls.is_empty() {
        return "none".to_owned();
    }
    calls
        .iter()
        .map(|call| {
            let mut parts = Vec::new();
            if let Some(model) = &call.model {
                parts.push(model.to_string());
            }
            if !call.usage.is_zero() {
                parts.push(format!("{}+{} tokens", call.usage.tokens_in, call.usage.tokens_out));
            }
            parts.push(match &call.outcome {
                CallOutcome::Answered { hash, .. } => format!("answer {}", hash.short()),
                CallOutcome::Failed { .. } => "failed".to_owned(),
                CallOutcome::Unrecordable { .. } => "unrecordable".to_owned(),
                _ => "abandoned".to_owned(),
            });
            format!("{} ({})", call.name, parts.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The chain back to the outside write, nearest first:
/// `receipt:order:1 v1 by billing/process_order (commit 2) ← order:1 v1 written from outside (commit 1)`.
fn chain_line(chain: &[Cause<'_>]) -> String {
    if chain.is_empty() {
        return "none recorded in this session".to_owned();
    }
    let mut line = chain
        .iter()
        .map(|cause| {
            let wrote = format!("{} v{}", cause.wrote.id, cause.wrote.version.0);
            match (cause.record.agent.as_deref(), cause.record.produce.as_deref()) {
                (Some(agent), Some(produce)) => {
                    format!("{wrote} by {agent}/{produce} (commit {})", cause.generation.0)
                }
                _ => format!("{wrote} written from outside (commit {})", cause.generation.0),
            }
        })
        .collect::<Vec<_>>()
        .join(" ← ");
    if chain.last().is_some_and(|cause| !cause.is_outside_write()) {
        line.push_str(" ← (earlier runs are not in this session's log)");
    }
    line
}

/// `graph KEY`: trigger → run → intent, reads → run.
pub fn graph(env: &Env, key: &str, session: Option<&str>, format: GraphFormat) -> Outcome {
    let (ctx, delivery) = session_of(env, key, session)?;
    let p = provenance(env, &ctx, key, delivery.as_ref())?;
    let run = match (p.agent(), p.produce()) {
        (Some(agent), Some(produce)) => format!("{agent}/{produce}"),
        _ => "direct write".to_owned(),
    };
    let run = format!("{run}\ncommit {} ({}), run {}", p.generation.0, p.commit.short(), p.run);
    let intent = match &p.delivery {
        Some(d) => format!("{key}\n{}, {} attempt(s)", status(d.status()), d.attempts()),
        None => key.to_owned(),
    };
    let trigger = p.trigger().map(|t| format!("{} v{}", t.id, t.version.0));
    let reads: Vec<String> = p
        .reads()
        .iter()
        .filter(|r| p.trigger().is_none_or(|t| t.id != r.id))
        .map(|r| match r.version {
            Some(v) => format!("{} v{}", r.id, v.0),
            None => format!("{} (absent)", r.id),
        })
        .collect();
    // The graph: (node id, shape, label) and (from, to, label, dashed).
    let mut nodes = vec![("run", "box", run), ("intent", "ellipse", intent)];
    let mut edges = vec![("run".to_owned(), "intent".to_owned(), "acted", false)];
    if let Some(trigger) = trigger {
        nodes.push(("trigger", "box", trigger));
        edges.insert(0, ("trigger".to_owned(), "run".to_owned(), "triggered", false));
    }
    let read_ids: Vec<String> = (0..reads.len()).map(|i| format!("read{i}")).collect();
    for (id, read) in read_ids.iter().zip(reads) {
        nodes.push((id.as_str(), "box", read));
        edges.push((id.clone(), "run".to_owned(), "read", true));
    }
    if env.json {
        print_json(&json!({
            "key": key,
            "session": ctx.session(),
            "nodes": nodes.iter().map(|(id, _, label)| json!({"id": id, "label": label})).collect::<Vec<_>>(),
            "edges": edges.iter().map(|(from, to, label, _)| json!({"from": from, "to": to, "label": label})).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    match format {
        GraphFormat::Mermaid => {
            let label = |text: &str| format!("\"{}\"", text.replace('"', "#quot;").replace('\n', "<br/>"));
            outln!("flowchart LR");
            for (id, shape, text) in &nodes {
                match *shape {
                    "ellipse" => outln!("  {id}([{}])", label(text)),
                    _ => outln!("  {id}[{}]", label(text)),
                }
            }
            for (from, to, text, dashed) in &edges {
                let arrow = if *dashed { "-.->" } else { "-->" };
                outln!("  {from} {arrow}|{text}| {to}");
            }
        }
        GraphFormat::Dot => {
            let label = |text: &str| {
                format!(
                    "\"{}\"",
                    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
                )
            };
            outln!("digraph provenance {{");
            outln!("  rankdir=LR;");
            for (id, shape, text) in &nodes {
                outln!("  {id} [shape={shape}, label={}];", label(text));
            }
            for (from, to, text, dashed) in &edges {
                let style = if *dashed { ", style=dashed" } else { "" };
                outln!("  {from} -> {to} [label=\"{text}\"{style}];");
            }
            outln!("}}");
        }
    }
    Ok(())
}
