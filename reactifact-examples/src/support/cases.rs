//! The support-agent program's cases (the `support-agent` program): a model triages five
//! support tickets through three tools — it looks the order up (a recorded call), replies to
//! the customer (an intent delivered through MCP) and asks for refunds (intents an operator
//! approves) — and nothing is sent, paid for or asked twice, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin support-agent
//! OPENAI_API_KEY=… cargo run -p reactifact-examples --features openai-tls --bin support-agent -- --openai
//! ```
//!
//! Each case starts its own stand-in model (a `reactifact_model::stand_in::StandIn` server
//! on 127.0.0.1 answering with [`stand_in::answer`](super::stand_in::answer)), its own MCP
//! server ([`ToolServer`]) and a SQLite file, and checks what it claims with counts it measures
//! itself: the requests the model server received, the lookups of the order book, and the
//! calls the MCP server received, by idempotency key. Every claim is printed with `PASS` or
//! `FAIL`; the program exits non-zero if one fails. See the "support-agent example" section of
//! `docs/agents.md`.
//!
//! 1. **first run**: 5 triages, 10 model calls, 5 recorded lookups; 5 replies delivered
//!    through MCP, each key once, with the key in `_meta`; 2 refunds wait for approval.
//! 2. **retry**: the model refuses one request; the turn fails and nothing is committed; the
//!    rerun asks only that request again (11 calls in all) and looks nothing up again.
//! 3. **re-asked**: a ticket edited five times is triaged again five times; the model answers
//!    the same tool calls under new ids each time; one intent per tool call, each sent once.
//! 4. **approval**: a refund is delivered once after `approve`, not before; `why` names the
//!    model call that asked for it and the chain back to the ticket.
//! 5. **replay**: the replay calls neither the model, the order book nor the MCP server;
//!    another model's name is a miss naming the call.
//! 6. **token budget**: one run at a time, a token budget stops the turn partway; the next
//!    turn finishes, and no call is paid for twice.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use reactifact_core::audit::{Difference, ReplayError};
use reactifact_core::error::MissKind;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, Resources, TurnOutcome};
use reactifact_core::{Agent, ArtifactId, Context, Runtime};
use reactifact_mcp::McpDispatcher;
use reactifact_model::stand_in::{Reply, StandIn};
use reactifact_model::ChatClient;

use super::agent::{triage, triage_id, ModelSettings, Orders, Ticket, Triage};
use super::process::{orders, tickets, AGENT, OPERATOR, SESSION};
use super::stand_in::{self, ACT_TOKENS, PLAN_TOKENS};
use super::tool_server::ToolServer;

/// What a case's steps return.
type Outcome<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How many tickets each case triages.
pub const TICKETS: usize = 5;

/// The model calls a ticket takes: one that asks to look the order up, one that acts.
const CALLS_PER_TICKET: u64 = 2;

/// The tickets of the five whose orders are refunded (billing, paid).
const REFUNDS: usize = 2;

/// The model's name in the requests when the stand-in answers them.
pub const STAND_IN_NAME: &str = "stand-in";

/// Which model the cases ask.
#[derive(Clone)]
pub enum ModelChoice {
    /// The scripted stand-in, a server each case starts: every case runs, every claim is
    /// checked.
    StandIn,
    /// Another model, such as an OpenAI-compatible server: the first-run and replay cases run,
    /// and the claims that depend on what the model decides are not checked.
    Other {
        /// The client.
        client: Box<ChatClient>,
        /// The model's name, sent in every request.
        name: String,
    },
}

impl ModelChoice {
    fn name(&self) -> &str {
        match self {
            ModelChoice::StandIn => STAND_IN_NAME,
            ModelChoice::Other { name, .. } => name,
        }
    }

    fn is_stand_in(&self) -> bool {
        matches!(self, ModelChoice::StandIn)
    }
}

impl fmt::Display for ModelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelChoice::StandIn => f.write_str("the stand-in model"),
            ModelChoice::Other { name, client } => write!(f, "`{name}` at {}", client.endpoint()),
        }
    }
}

/// One case of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Five tickets, ten model calls, five replies through MCP once each, two refunds waiting.
    FirstRun,
    /// The model refuses one request: the turn fails, the rerun asks only that one again.
    Retry,
    /// A ticket edited five times: new tool-call ids each time, one intent per tool call.
    ReAsked,
    /// A refund is delivered once after `approve`; `why` names the model call and the chain.
    Approval,
    /// The replay calls nothing; another model's name is a miss.
    Replay,
    /// A token budget stops the turn partway; the next turn finishes; nothing paid twice.
    TokenBudget,
}

impl Case {
    /// Every case, in the order the program runs them.
    pub const ALL: [Case; 6] = [
        Case::FirstRun,
        Case::Retry,
        Case::ReAsked,
        Case::Approval,
        Case::Replay,
        Case::TokenBudget,
    ];

    /// The case's number, from 1.
    pub fn number(self) -> u32 {
        Case::ALL.iter().position(|c| *c == self).map_or(0, |i| i as u32 + 1)
    }

    /// The case's title.
    pub fn title(self) -> &'static str {
        match self {
            Case::FirstRun => "first run",
            Case::Retry => "retry",
            Case::ReAsked => "re-asked, new tool-call ids",
            Case::Approval => "approval and why",
            Case::Replay => "replay",
            Case::TokenBudget => "token budget",
        }
    }

    /// Whether the case needs the scripted stand-in (it injects a failure, or counts on what
    /// the model decides).
    pub fn needs_stand_in(self) -> bool {
        !matches!(self, Case::FirstRun | Case::Replay)
    }
}

/// One checked claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Whether it held.
    pub holds: bool,
    /// What it says, with what was measured.
    pub text: String,
}

/// One line of a case's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A checked claim.
    Claim(Claim),
    /// Something the case shows besides: a turn's usage, an error or a divergence message.
    Note(String),
}

/// What a case found: its claims and notes, in the order it made them, and the error that
/// stopped it, if one did.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// The case.
    pub case: Case,
    /// Its claims and notes, in order.
    pub entries: Vec<Entry>,
    /// The error that stopped the case before it checked everything.
    pub error: Option<String>,
}

impl CaseReport {
    /// The claims the case checked, in order.
    pub fn claims(&self) -> impl Iterator<Item = &Claim> {
        self.entries.iter().filter_map(|entry| match entry {
            Entry::Claim(claim) => Some(claim),
            Entry::Note(_) => None,
        })
    }

    /// Whether the case ran to its end and every claim held.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.claims().next().is_some() && self.claims().all(|c| c.holds)
    }

    /// Checks a claim: `holds` and its text.
    fn check(&mut self, holds: bool, text: impl Into<String>) {
        self.entries.push(Entry::Claim(Claim {
            holds,
            text: text.into(),
        }));
    }

    /// Checks that `actual == expected`; the text names both when they differ.
    fn check_eq<T: PartialEq + fmt::Debug>(&mut self, actual: T, expected: T, text: impl fmt::Display) {
        if actual == expected {
            self.check(true, text.to_string());
        } else {
            self.check(false, format!("{text} (expected {expected:?}, got {actual:?})"));
        }
    }

    fn note(&mut self, line: impl Into<String>) {
        self.entries.push(Entry::Note(line.into()));
    }
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  {}. {}", self.case.number(), self.case.title())?;
        for entry in &self.entries {
            match entry {
                Entry::Claim(claim) => {
                    let mark = if claim.holds { "PASS" } else { "FAIL" };
                    writeln!(f, "     {mark} {}", claim.text)?;
                }
                Entry::Note(note) => writeln!(f, "          {note}")?,
            }
        }
        if let Some(error) = &self.error {
            writeln!(f, "     FAIL the case stopped: {error}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// A case's world: the model server, the MCP server, the order book, the store
// ---------------------------------------------------------------------------------------------

/// One case's servers and store.
struct Fixture {
    /// The stand-in model server (`None` with another model).
    server: Option<StandIn>,
    client: ChatClient,
    tools: ToolServer,
    orders: Orders,
    /// The number (from 0) of the request the stand-in refuses, once (`u64::MAX`: none).
    refuse: Arc<AtomicU64>,
}

impl Fixture {
    /// Has the stand-in refuse request number `index` (from 0) with a 400, which the client
    /// does not retry.
    fn refuse_at(&self, index: u64) {
        self.refuse.store(index, Ordering::SeqCst);
    }

    /// The requests the model server received (0 with another model: not counted).
    fn model_calls(&self) -> u64 {
        self.server.as_ref().map_or(0, StandIn::requests)
    }

    fn dispatcher(&self) -> Outcome<McpDispatcher> {
        Ok(McpDispatcher::new(self.tools.url())?)
    }

    /// Whether the MCP server received exactly `keys`, each once, each with the key in `_meta`.
    fn received_once(&self, keys: &[String]) -> bool {
        let received = self.tools.received();
        self.tools.calls_without_key() == 0
            && received.len() == keys.len()
            && keys.iter().all(|k| received.get(k).is_some_and(|r| r.calls == 1))
    }
}

/// The program's cases, over one directory (each case writes a SQLite file of its own there,
/// `case-<n>.db`) and one model.
pub struct Cases {
    dir: PathBuf,
    model: ModelChoice,
}

impl Cases {
    /// The cases, writing their stores in `dir` (which must exist), asking `model`.
    pub fn new(dir: impl Into<PathBuf>, model: ModelChoice) -> Self {
        Cases { dir: dir.into(), model }
    }

    /// The directory the stores are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cases this model runs: all of them with the stand-in, those that do not need it
    /// otherwise.
    pub fn cases(&self) -> Vec<Case> {
        Case::ALL
            .into_iter()
            .filter(|case| self.model.is_stand_in() || !case.needs_stand_in())
            .collect()
    }

    /// Runs `case` on a new store, and reports what it found.
    pub async fn run(&self, case: Case) -> CaseReport {
        let mut report = CaseReport {
            case,
            entries: Vec::new(),
            error: None,
        };
        let outcome = match case {
            Case::FirstRun => self.first_run(&mut report).await,
            Case::Retry => self.retry(&mut report).await,
            Case::ReAsked => self.re_asked(&mut report).await,
            Case::Approval => self.approval(&mut report).await,
            Case::Replay => self.replay(&mut report).await,
            Case::TokenBudget => self.token_budget(&mut report).await,
        };
        if let Err(e) = outcome {
            report.error = Some(e.to_string());
        }
        report
    }

    /// Runs every case this model runs, printing each report; whether every claim held.
    pub async fn run_all(&self) -> bool {
        println!(
            "The support agent, asking {}, on SQLite in {}:",
            self.model,
            self.dir.display()
        );
        let mut ok = true;
        for case in self.cases() {
            let report = self.run(case).await;
            print!("{report}");
            ok &= report.passed();
        }
        ok
    }

    /// A new store for `case` with the five tickets in it, a model server (the stand-in, which
    /// refuses a request when told to), an MCP server and the order book.
    async fn fixture(&self, case: Case) -> Outcome<(Fixture, Context)> {
        let path = self.dir.join(format!("case-{}.db", case.number()));
        if path.exists() {
            return Err(format!("{} exists; the cases need a new directory", path.display()).into());
        }
        let mut context = Context::open(&path, SESSION)?;
        for (id, ticket) in tickets(TICKETS) {
            context.create(id, ticket)?;
        }
        let refuse_at = Arc::new(AtomicU64::new(u64::MAX));
        let (server, client) = match &self.model {
            ModelChoice::StandIn => {
                let refuse = refuse_at.clone();
                let server = StandIn::start(move |index, request| {
                    if refuse.load(Ordering::SeqCst) == index {
                        return Reply::status(400, r#"{"error": {"message": "the stand-in refuses this one"}}"#);
                    }
                    stand_in::answer(index, request)
                })
                .await?;
                let client = ChatClient::new(server.base_url(), None)?;
                (Some(server), client)
            }
            ModelChoice::Other { client, .. } => (None, (**client).clone()),
        };
        let fixture = Fixture {
            server,
            client,
            tools: ToolServer::start().await?,
            orders: orders(TICKETS),
            refuse: refuse_at,
        };
        Ok((fixture, context))
    }

    /// The resources `triage` uses: the client, the model's name and the order book.
    fn resources(&self, fixture: &Fixture, name: &str) -> Resources {
        Resources::new()
            .with(fixture.client.clone())
            .with(ModelSettings { model: name.to_owned() })
            .with(fixture.orders.clone())
    }

    /// A runtime over `context` running `triage`, delivering to the fixture's MCP server,
    /// one run at a time if `one_at_a_time`.
    fn runtime(&self, context: Context, fixture: &Fixture, one_at_a_time: bool) -> Outcome<Runtime> {
        let mut builder = Runtime::builder(context)
            .resources(&self.resources(fixture, self.model.name()))
            .agent(Agent::new(AGENT).produce(triage))
            .dispatcher(fixture.dispatcher()?);
        if one_at_a_time {
            builder = builder.max_concurrency(1);
        }
        Ok(builder.build()?)
    }

    /// The intents the triages name, split into replies and refunds, after checking that each
    /// ticket has its triage.
    fn intents(&self, report: &mut CaseReport, rt: &Runtime) -> Outcome<(Vec<String>, Vec<String>)> {
        let (mut replies, mut refunds) = (Vec::new(), Vec::new());
        let mut categories = Vec::new();
        for (id, _) in tickets(TICKETS) {
            let Some(triage) = rt.context().get::<Triage>(&triage_id(&id))? else {
                report.check(false, format!("{id} was triaged (no {})", triage_id(&id)));
                return Ok((replies, refunds));
            };
            categories.push(triage.data.category.as_str());
            for key in &triage.data.intents {
                if key.starts_with("issue_refund:") {
                    refunds.push(key.clone());
                } else {
                    replies.push(key.clone());
                }
            }
        }
        report.check(
            categories.len() == TICKETS,
            format!("{TICKETS} tickets → {TICKETS} triages: {}", categories.join(", ")),
        );
        Ok((replies, refunds))
    }

    /// Case 1: five tickets; the model looks each order up and replies; the replies go out
    /// through MCP once each; the refunds wait.
    async fn first_run(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::FirstRun).await?;
        let mut rt = self.runtime(context, &fixture, false)?;
        let turn = rt.run().await?;
        rt.settle().await?;
        report.check_eq(turn.outcome, TurnOutcome::Completed, "the turn completed");
        let (replies, refunds) = self.intents(report, &rt)?;
        if self.model.is_stand_in() {
            report.check_eq(
                fixture.model_calls(),
                CALLS_PER_TICKET * TICKETS as u64,
                format!(
                    "{} model calls through ChatClient: one asks to look the order up, one acts, per ticket",
                    CALLS_PER_TICKET * TICKETS as u64
                ),
            );
            report.check_eq(
                fixture.orders.lookups(),
                TICKETS as u64,
                "lookup_order ran 5 times, each a recorded call",
            );
            report.check_eq(
                (replies.len(), refunds.len()),
                (TICKETS, REFUNDS),
                "the model called send_reply for each ticket and issue_refund for the 2 billing tickets",
            );
        }
        let tool_keys = replies.iter().chain(&refunds).all(|k| {
            let ticket = k.split(':').nth(1).unwrap_or("");
            !k.contains("call_") && ticket == "ticket"
        });
        report.check(
            tool_keys,
            "every intent is keyed `{tool}:{ticket id}:{hash of the arguments}`, never by the model's tool-call id",
        );
        report.check(
            fixture.received_once(&replies),
            format!(
                "the MCP server received each of the {} replies once, with its key in `_meta`",
                replies.len()
            ),
        );
        let ledger = rt.context().ledger();
        let mut waiting = 0;
        for key in &refunds {
            waiting += usize::from(
                ledger
                    .get(key)
                    .await?
                    .is_some_and(|d| d.status() == DeliveryStatus::AwaitingApproval),
            );
        }
        report.check(
            waiting == refunds.len() && fixture.tools.received().keys().all(|k| !refunds.contains(k)),
            format!("the {} refunds wait for approval; none was sent", refunds.len()),
        );
        let used = turn.total_usage();
        report.note(format!(
            "usage: {} recorded calls (model, lookups, clock), {} tokens ({} in, {} out)",
            turn.usage.iter().map(|u| u.calls).sum::<u64>(),
            used.total_tokens(),
            used.tokens_in,
            used.tokens_out
        ));
        Ok(())
    }

    /// Case 2: the model refuses one request (the fourth it receives); the turn fails, nothing is committed;
    /// the rerun reuses every answer the failed turn got and asks only that request again.
    async fn retry(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::Retry).await?;
        fixture.refuse_at(3);
        let mut rt = self.runtime(context, &fixture, false)?;
        let error = match rt.run().await {
            Ok(turn) => {
                report.check(false, format!("the turn failed (it ended {:?})", turn.outcome));
                return Ok(());
            }
            Err(e) => e.to_string(),
        };
        let first = fixture.model_calls();
        let looked_up = fixture.orders.lookups();
        report.check(
            error.contains("400"),
            "the turn failed loudly, naming the model's refusal",
        );
        report.note(format!("error: {error}"));
        report.check(
            rt.context().list::<Triage>().count() == 0 && fixture.tools.calls() == 0,
            "nothing was committed or sent",
        );
        let turn = rt.run().await?;
        rt.settle().await?;
        let reused: u64 = turn.usage.iter().map(|u| u.reused).sum();
        report.check_eq(turn.outcome, TurnOutcome::Completed, "the rerun completed");
        report.check_eq(
            reused,
            first - 1 + looked_up,
            format!(
                "the rerun reused what the failed turn got: {} model answers and {looked_up} lookups",
                first - 1
            ),
        );
        report.check_eq(
            fixture.model_calls(),
            CALLS_PER_TICKET * TICKETS as u64 + 1,
            format!(
                "model calls in all: {} (the refused one asked twice)",
                CALLS_PER_TICKET * TICKETS as u64 + 1
            ),
        );
        report.check_eq(fixture.orders.lookups(), TICKETS as u64, "no order was looked up twice");
        let (replies, _) = self.intents(report, &rt)?;
        report.check(fixture.received_once(&replies), "each reply was delivered once");
        Ok(())
    }

    /// Case 3: ticket 1 edited five times: each edit triages it again, the model answers the
    /// same tool calls under new ids, and no second intent is made.
    async fn re_asked(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::ReAsked).await?;
        let mut rt = self.runtime(context, &fixture, false)?;
        rt.run().await?;
        rt.settle().await?;
        let (replies, refunds) = self.intents(report, &rt)?;
        let id = ArtifactId::from("ticket:1");
        let before = rt
            .context()
            .get::<Triage>(&triage_id(&id))?
            .ok_or("no triage of ticket:1")?;
        let (_, ticket) = tickets(1).remove(0);
        for n in 1..=5 {
            let edited = Ticket {
                body: format!("{} Any news? ({n})", ticket.body),
                ..ticket.clone()
            };
            rt.context_mut().update(id.clone(), edited)?;
            rt.run().await?;
            rt.settle().await?;
        }
        report.check_eq(
            fixture.model_calls(),
            CALLS_PER_TICKET * (TICKETS as u64 + 5),
            "the model was asked again on every edit: 10 more calls",
        );
        let ids = self.tool_call_ids(&fixture, "Order: A1");
        report.check(
            ids.len() == 6,
            format!(
                "it answered under a new tool-call id every time: {} distinct lookup_order ids in 6 asks",
                ids.len()
            ),
        );
        let after = rt
            .context()
            .get::<Triage>(&triage_id(&id))?
            .ok_or("no triage of ticket:1")?;
        report.check_eq(
            after.data.intents.clone(),
            before.data.intents.clone(),
            "the edited ticket's tool calls derive the same keys",
        );
        let ledger = rt.context().ledger().entries().await?;
        report.check_eq(
            ledger.len(),
            replies.len() + refunds.len(),
            "one intent per tool call in the ledger",
        );
        report.check(
            fixture.received_once(&replies),
            "the MCP server received each reply's key once",
        );
        Ok(())
    }

    /// The tool-call ids the model gave in the conversations whose user message contains
    /// `marker`, as the requests the stand-in received carry them back.
    fn tool_call_ids(&self, fixture: &Fixture, marker: &str) -> std::collections::BTreeSet<String> {
        let mut ids = std::collections::BTreeSet::new();
        let Some(server) = &fixture.server else {
            return ids;
        };
        for request in server.received() {
            let messages = request.body["messages"].as_array().cloned().unwrap_or_default();
            let ours = messages
                .iter()
                .any(|m| m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains(marker)));
            if !ours {
                continue;
            }
            for message in messages.iter().filter(|m| m["role"] == "assistant") {
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    if let Some(id) = call["id"].as_str() {
                        ids.insert(id.to_owned());
                    }
                }
            }
        }
        ids
    }

    /// Case 4: a refund waits until an operator approves it, is then delivered once, and
    /// `why` tells which model call asked for it and the chain back to the ticket.
    async fn approval(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::Approval).await?;
        let mut rt = self.runtime(context, &fixture, false)?;
        rt.run().await?;
        rt.settle().await?;
        let (_, refunds) = self.intents(report, &rt)?;
        let key = refunds.first().ok_or("the model asked for no refund")?.clone();
        report.check(
            !fixture.tools.received().contains_key(&key),
            format!("before approval, {key} was not sent"),
        );
        let approved = rt.approve(&key, OPERATOR).await?;
        rt.settle().await?;
        rt.approve(&key, OPERATOR).await?;
        rt.settle().await?;
        let received = fixture.tools.received();
        report.check(
            received
                .get(&key)
                .is_some_and(|r| r.calls == 1 && r.tool == "issue_refund")
                && approved.status() == DeliveryStatus::Pending,
            "approved (twice), it was delivered once, as an MCP call of issue_refund",
        );
        let delivered = rt.context().ledger().get(&key).await?;
        report.check(
            delivered.is_some_and(|d| d.status() == DeliveryStatus::Delivered),
            "the ledger says delivered",
        );
        let Some(why) = rt.context().provenance(&key).await? else {
            report.check(false, format!("why {key} finds the run"));
            return Ok(());
        };
        let asked = why
            .calls()
            .iter()
            .find(|c| c.name.starts_with("turn-") && c.usage.tokens_out == ACT_TOKENS.1);
        report.check(
            asked.is_some_and(|c| c.model.as_deref() == Some(STAND_IN_NAME))
                && why.calls().iter().any(|c| &*c.name == "lookup_order"),
            "why names the model call that asked for the refund (its model and tokens) and the lookup",
        );
        let ticket = refunds[0].split(':').skip(1).take(2).collect::<Vec<_>>().join(":");
        let started = why.started_by().map(|c| c.wrote.id.to_string());
        report.check_eq(
            started.as_deref(),
            Some(ticket.as_str()),
            "why follows the chain back to the outside write of the ticket",
        );
        if let Some(call) = asked {
            report.note(format!(
                "why {key}: {}/{} on {ticket}, call `{}` to `{}`, {} tokens; approved by {}",
                why.agent().unwrap_or("?"),
                why.produce().unwrap_or("?"),
                call.name,
                call.model.as_deref().unwrap_or("?"),
                call.usage.total_tokens(),
                why.decision().map_or("nobody", |d| d.by.as_str()),
            ));
        }
        Ok(())
    }

    /// Case 5: the replay oracle re-executes every run from the log without calling the
    /// model, the order book or the MCP server; another model's name is a miss naming the call.
    async fn replay(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::Replay).await?;
        let mut rt = self.runtime(context, &fixture, false)?;
        rt.run().await?;
        rt.settle().await?;
        let counts = |f: &Fixture| (f.model_calls(), f.orders.lookups(), f.tools.calls());
        let before = counts(&fixture);

        let replayed = rt.replay().await?;
        report.check_eq(
            replayed.runs,
            TICKETS,
            format!("the replay re-executed the {TICKETS} runs: the same patches"),
        );
        report.check_eq(
            counts(&fixture),
            before,
            "the replay made 0 model calls, 0 lookups and 0 MCP calls",
        );

        let resources = self.resources(&fixture, "another-model");
        let agents = [Agent::new(AGENT).produce(triage)];
        let result = rt.context().replay_with(&agents, &resources).await;
        let named = match &result {
            Err(ReplayError::Diverged(divergence)) => match &divergence.difference {
                Difference::Call(miss) => miss.call == "turn-1" && matches!(miss.kind, MissKind::RequestDiffers { .. }),
                _ => false,
            },
            _ => false,
        };
        report.check(
            named,
            "a replay with another model's name reports the miss at `turn-1`, the call whose request changed",
        );
        if let Err(error) = result {
            report.note(error.to_string());
        }
        report.check_eq(counts(&fixture), before, "the replay that missed called nothing either");
        Ok(())
    }

    /// Case 6: one run at a time, a token budget stops the turn partway; the tickets before
    /// the refused call commit; the next turn finishes and pays only for the calls not yet made.
    async fn token_budget(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::TokenBudget).await?;
        // Room for two tickets' calls: the third ticket's first call finds one token left and
        // is made, its second finds none.
        let per_ticket = PLAN_TOKENS.0 + PLAN_TOKENS.1 + ACT_TOKENS.0 + ACT_TOKENS.1;
        let limit = 2 * per_ticket + 1;
        let mut rt = self.runtime(context, &fixture, true)?;
        let turn = rt.run_with(Budget::default().max_tokens(limit)).await?;
        rt.settle().await?;
        let first = fixture.model_calls();
        report.check_eq(
            turn.outcome,
            TurnOutcome::TokensExhausted,
            format!("with a budget of {limit} tokens, the turn ended TokensExhausted"),
        );
        report.check_eq(
            first,
            2 * CALLS_PER_TICKET + 1,
            "it stopped at the third ticket's second call",
        );
        let committed = rt.context().list::<Triage>().count();
        report.check_eq(
            committed,
            2,
            "the first two tickets' triages committed; the rest stay queued",
        );
        let next = rt.run().await?;
        rt.settle().await?;
        let reused: u64 = next.usage.iter().map(|u| u.reused).sum();
        report.check_eq(next.outcome, TurnOutcome::Completed, "the next turn completed");
        report.check_eq(
            reused,
            2,
            "it reused what the stopped turn got for the third ticket: its first answer and its lookup",
        );
        report.check_eq(
            fixture.model_calls(),
            CALLS_PER_TICKET * TICKETS as u64,
            "model calls in all: 10, none paid twice",
        );
        let (replies, _) = self.intents(report, &rt)?;
        report.check(fixture.received_once(&replies), "each reply was delivered once");
        Ok(())
    }
}
