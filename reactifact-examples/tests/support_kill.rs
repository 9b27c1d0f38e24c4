//! The support agent on SQLite, SIGKILLed at random points 20 times and restarted each time,
//! then run to the end (issue 41's target): the model calls beyond an uninterrupted run's are
//! at most the calls that were unanswered at the kills (counted at the stand-in model), and
//! every tool intent is delivered, its effect applied once per key.
//!
//! Real processes: the agent is the `support-agent --agent` program over one SQLite file; the
//! stand-in model (answering after a delay, so kills land mid-call) and the MCP server are
//! served by this test, so they outlive the kills and count everything.

#![cfg(unix)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::Context;
use reactifact_examples::support::agent::{triage_id, Triage};
use reactifact_examples::support::process::{tickets, SESSION};
use reactifact_examples::support::stand_in;
use reactifact_examples::support::ToolServer;
use reactifact_model::stand_in::StandIn;

/// How many tickets the store holds: 40 model calls in an uninterrupted run.
const TICKETS: usize = 20;
/// How many times the agent is killed.
const KILLS: usize = 20;
/// How long the stand-in model takes to answer.
const MODEL_DELAY: Duration = Duration::from_millis(150);
/// How long the MCP server takes to answer a tool call.
const TOOL_DELAY: Duration = Duration::from_millis(20);
/// The seed of the kill points.
const SEED: u64 = 0x5eed_0041;

/// A small deterministic generator (xorshift64*), for the kill points.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn agent(db: &Path, model_url: &str, mcp_url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_support-agent"))
        .arg("--agent")
        .args(["--db", db.to_str().unwrap()])
        .args(["--model-url", model_url, "--mcp-url", mcp_url])
        .args(["--tickets", &TICKETS.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the support-agent program starts")
}

/// Waits for `child` to exit, within `deadline`; whether it exited successfully.
async fn finish(mut child: Child, deadline: Duration) -> (bool, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            return (status.success(), stderr);
        }
        if start.elapsed() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return (false, "the agent did not finish in time".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `condition` holds or `deadline` passes; whether it holds.
async fn wait_for(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !condition() {
        if start.elapsed() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

/// The model calls an uninterrupted run makes, counted at a stand-in of its own.
async fn uninterrupted_calls(dir: &Path) -> u64 {
    let model = StandIn::start(stand_in::answer).await.unwrap();
    let tools = ToolServer::start().await.unwrap();
    let child = agent(&dir.join("uninterrupted.db"), &model.base_url(), &tools.url());
    let (ok, stderr) = finish(child, Duration::from_secs(60)).await;
    assert!(ok, "the uninterrupted run failed: {stderr}");
    model.requests()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_twenty_times_the_agent_asks_again_only_what_was_unanswered_and_delivers_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let first_run = uninterrupted_calls(dir.path()).await;
    assert_eq!(
        first_run,
        2 * TICKETS as u64,
        "an uninterrupted run asks twice per ticket"
    );

    let model = StandIn::start(|index, request| stand_in::answer(index, request).after(MODEL_DELAY))
        .await
        .unwrap();
    let tools = ToolServer::start_with_delay(TOOL_DELAY).await.unwrap();
    let db = dir.path().join("killed.db");
    let mut rng = Rng(SEED);
    let mut unanswered_at_kills = Vec::new();
    let mut mid_call = 0;
    for kill in 0..KILLS {
        let mut child = agent(&db, &model.base_url(), &tools.url());
        // A random point: 80..350 ms into the process's life, then — to keep clear of an
        // answer on its way into the store — at a moment a model call is in flight, if one
        // comes within 300 ms (past the model calls, anywhere).
        let life = Duration::from_millis(80 + rng.below(270));
        tokio::time::sleep(life).await;
        let in_flight = wait_for(Duration::from_millis(300), || model.unanswered() > 0).await;
        mid_call += usize::from(in_flight);
        let done_before = model.answered() + model.abandoned();
        let exited = child.try_wait().unwrap();
        assert!(exited.is_none(), "kill {kill}: the agent exited before it ({exited:?})");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Received by the time the process was dead, and neither answered nor abandoned (by an
        // earlier process) before the kill.
        unanswered_at_kills.push(model.requests() - done_before);
    }
    let child = agent(&db, &model.base_url(), &tools.url());
    let (ok, stderr) = finish(child, Duration::from_secs(60)).await;
    assert!(ok, "the run after the kills failed: {stderr}");

    let calls = model.requests();
    let beyond = calls - first_run;
    let unanswered: u64 = unanswered_at_kills.iter().sum();
    let received = tools.received();
    let redelivered = received.values().filter(|r| r.calls > 1).count();
    eprintln!(
        "{KILLS} kills ({mid_call} mid-call): {calls} model calls, {beyond} beyond the uninterrupted run's {first_run}; \
         unanswered at the kills: {unanswered} ({unanswered_at_kills:?}); {} keys delivered, {} calls, {redelivered} keys received more than once",
        received.len(),
        tools.calls(),
    );
    assert!(
        beyond <= unanswered,
        "{beyond} calls beyond the first run's, but only {unanswered} were unanswered at the kills"
    );
    assert!(unanswered > 0, "no kill landed while a model call was unanswered");

    // Every tool intent the triages name was delivered, and its effect applied once: the MCP
    // server holds each key once, with the key in `_meta`; the ledger says delivered.
    let ctx = Context::open(&db, SESSION).unwrap();
    let mut keys = Vec::new();
    for (id, _) in tickets(TICKETS) {
        let triage = ctx
            .get::<Triage>(&triage_id(&id))
            .unwrap()
            .expect("every ticket triaged");
        keys.extend(triage.data.intents.clone());
    }
    let refunds = keys.iter().filter(|k| k.starts_with("issue_refund:")).count();
    assert_eq!(keys.len(), TICKETS + refunds, "a reply per ticket, and the refunds");
    assert!(refunds > 0);
    assert_eq!(tools.calls_without_key(), 0);
    let mut delivered: Vec<&String> = received.keys().collect();
    delivered.sort();
    let mut expected: Vec<&String> = keys.iter().collect();
    expected.sort();
    assert_eq!(
        delivered, expected,
        "the MCP server applied each intent's key once, and no other"
    );
    for key in &keys {
        let delivery = ctx.ledger().get(key).await.unwrap().expect("in the ledger");
        assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
    }
}
