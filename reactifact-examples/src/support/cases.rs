//! The support-agent program's cases (the `support-agent` program): a model triages five
//! support tickets and drafts the replies, and each reply is emailed once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin support-agent
//! OPENAI_API_KEY=… cargo run -p reactifact-examples --features openai-tls --bin support-agent -- --openai
//! ```
//!
//! Each case runs [`triage`](fn@super::agent::triage) on five tickets, in a SQLite file of its
//! own, and checks what it claims with counts it measures itself: the calls that reached the
//! model (a counting wrapper around it) and the emails a stand-in mail service received, by
//! idempotency key. Every claim is printed with `PASS` or `FAIL`; the program exits non-zero
//! if one fails. See the "support-agent example" section of `docs/agents.md`.
//!
//! 1. **first run**: 5 triages, 10 model calls (two per ticket), 5 emails sent once each.
//! 2. **retry**: the model fails one call; the turn fails and nothing is committed; the rerun
//!    asks the model only the failed call (and what followed it in its run): 11 calls in all.
//! 3. **crash-resume**: a runtime without a dispatcher commits and stops, its emails pending;
//!    the store is reopened in a new runtime, which sends the 5 emails and asks the model
//!    nothing.
//! 4. **replay**: the replay oracle re-executes every run from the log: 0 model calls, 0
//!    emails; a changed drafting prompt, or another model name, is a miss naming the call.
//! 5. **token budget**: one run at a time, a token budget stops the turn partway: the tickets
//!    before the refused call commit, the rest stay queued; the next turn finishes, and no call
//!    is paid for twice.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use reactifact_core::audit::{Difference, ReplayError};
use reactifact_core::error::MissKind;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, Resources, TurnOutcome, TurnReport, Usage};
use reactifact_core::{
    produce, Agent, ArtifactId, Context, DispatchError, Dispatcher, Intent, PendingAction, ProduceCall, ProduceError,
    Runtime,
};

use super::agent::{email_key, triage, triage_id, triage_with, Email, ModelClient, ModelSettings, Ticket, Triage};
use super::model::{CompletionFuture, CompletionRequest, Model, ModelError};
use super::stand_in::{draft_request, triage_request, Category, StandIn};

/// What a case's steps return.
type Outcome<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How many tickets each case triages.
pub const TICKETS: u64 = 5;

/// The model calls a ticket takes: `classify`, then `draft`.
const CALLS_PER_TICKET: u64 = 2;

/// The model's name in the requests when the stand-in answers them.
pub const STAND_IN_NAME: &str = "stand-in";

/// The agent the produce runs in.
const AGENT: &str = "support";

/// The session each case's store holds.
const SESSION: &str = "support";

/// Which model the cases ask.
#[derive(Clone)]
pub enum ModelChoice {
    /// The deterministic [`StandIn`]: every claim is checked, those about exact answers too.
    StandIn,
    /// Another model, such as an OpenAI-compatible server: the claims about call counts,
    /// commits and deliveries are checked; those about exact answers and token counts are not.
    Other {
        /// The client.
        client: Arc<dyn Model>,
        /// The model's name, sent in every request.
        name: String,
        /// How the program names it (such as the endpoint).
        describe: String,
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

    fn client(&self) -> Arc<dyn Model> {
        match self {
            ModelChoice::StandIn => Arc::new(StandIn::new()),
            ModelChoice::Other { client, .. } => client.clone(),
        }
    }
}

impl fmt::Display for ModelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelChoice::StandIn => f.write_str("the stand-in model"),
            ModelChoice::Other { name, describe, .. } => write!(f, "`{name}` at {describe}"),
        }
    }
}

/// One case of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Five tickets triaged, ten model calls, five emails sent once each.
    FirstRun,
    /// The model fails one call: the turn fails, the rerun completes, 11 calls in all.
    Retry,
    /// Committed without a dispatcher, reopened: the emails go out, no model call.
    CrashResume,
    /// The replay calls neither the model nor the mail service; a changed prompt is a miss.
    Replay,
    /// A token budget stops the turn partway; the next turn finishes; nothing paid twice.
    TokenBudget,
}

impl Case {
    /// Every case, in the order the program runs them.
    pub const ALL: [Case; 5] = [
        Case::FirstRun,
        Case::Retry,
        Case::CrashResume,
        Case::Replay,
        Case::TokenBudget,
    ];

    /// The case's number, from 1.
    pub fn number(self) -> u32 {
        match self {
            Case::FirstRun => 1,
            Case::Retry => 2,
            Case::CrashResume => 3,
            Case::Replay => 4,
            Case::TokenBudget => 5,
        }
    }

    /// The case's title.
    pub fn title(self) -> &'static str {
        match self {
            Case::FirstRun => "first run",
            Case::Retry => "retry",
            Case::CrashResume => "crash-resume",
            Case::Replay => "replay",
            Case::TokenBudget => "token budget",
        }
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
// What the cases measure with: a counting model, a counting mail service
// ---------------------------------------------------------------------------------------------

/// The model as the runtime gets it: counts the calls that reach it and, if told to, fails
/// the `fail_at`-th (from 1) after the model answered it, as a server that did the work and
/// then lost the connection would.
struct Probe {
    inner: Arc<dyn Model>,
    calls: AtomicU64,
    fail_at: Option<u64>,
}

impl Probe {
    fn new(inner: Arc<dyn Model>, fail_at: Option<u64>) -> Arc<Self> {
        Arc::new(Probe {
            inner,
            calls: AtomicU64::new(0),
            fail_at,
        })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Model for Probe {
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let answer = self.inner.complete(request).await;
            if self.fail_at == Some(n) {
                return Err(ModelError::status(503, b"the model server is overloaded"));
            }
            answer
        })
    }
}

/// A stand-in mail service: records each email it is handed, by idempotency key.
#[derive(Clone, Default)]
struct Mailbox {
    received: Arc<Mutex<BTreeMap<String, Vec<Email>>>>,
}

impl Mailbox {
    fn dispatcher(&self) -> impl Dispatcher {
        let mailbox = self.clone();
        move |intent: Intent| {
            let result = mailbox.receive(&intent);
            async move { result }
        }
    }

    fn receive(&self, intent: &Intent) -> Result<(), DispatchError> {
        // A real mail service would send it, passing the key on as the idempotency key.
        let email: Email = intent.payload()?;
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received.entry(intent.key().to_string()).or_default().push(email);
        Ok(())
    }

    /// Emails received in all.
    fn total(&self) -> usize {
        self.received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }

    /// How many times each key was received.
    fn counts(&self) -> BTreeMap<String, usize> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received
            .iter()
            .map(|(key, emails)| (key.clone(), emails.len()))
            .collect()
    }

    /// The emails received for `key`.
    fn emails(&self, key: &str) -> Vec<Email> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received.get(key).cloned().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// The tickets
// ---------------------------------------------------------------------------------------------

/// The five tickets, by id.
fn tickets() -> Vec<(ArtifactId, Ticket)> {
    let ticket = |customer: &str, subject: &str, body: &str| Ticket {
        customer: customer.into(),
        subject: subject.into(),
        body: body.into(),
    };
    [
        ticket(
            "ada@example.com",
            "Charged twice this month",
            "My card was charged twice for the March subscription. Please refund one of them.",
        ),
        ticket(
            "bob@example.com",
            "The app closes at start",
            "Since yesterday's update the app crashes as soon as I open it.",
        ),
        ticket(
            "cy@example.com",
            "Cannot sign in",
            "I forgot my password and the reset link never arrives.",
        ),
        ticket(
            "dee@example.com",
            "Opening hours",
            "Is your phone line open on Saturdays?",
        ),
        ticket(
            "eve@example.com",
            "Parcel never arrived",
            "Order 1432 never came. I would like my money back, or a refund to my card.",
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, t)| (ArtifactId::from(format!("ticket:{}", i + 1)), t))
    .collect()
}

/// The email keys of the five tickets.
fn email_keys() -> Vec<String> {
    tickets().iter().map(|(id, _)| email_key(id)).collect()
}

/// "`n` emails, once each": every ticket's key received exactly once, and nothing else.
fn once_each(mailbox: &Mailbox) -> bool {
    let expected: BTreeMap<String, usize> = email_keys().into_iter().map(|k| (k, 1)).collect();
    mailbox.counts() == expected
}

/// The stand-in's usage for a ticket: its classify and draft calls.
fn stand_in_usage(ticket: &Ticket) -> Outcome<(Usage, Usage)> {
    let text = ticket.text();
    let classified = StandIn::answer(&triage_request(STAND_IN_NAME, &text))?;
    let category = Category::parse(&classified.text).unwrap_or(Category::General);
    let drafted = StandIn::answer(&draft_request(STAND_IN_NAME, category, &text))?;
    Ok((
        Usage::tokens(classified.tokens_in, classified.tokens_out),
        Usage::tokens(drafted.tokens_in, drafted.tokens_out),
    ))
}

/// One line of a turn's usage, per produce.
fn usage_lines(turn: &TurnReport) -> Vec<String> {
    // `reactifact_core` does not export the element type of `TurnReport::usage`
    // (`ProduceUsage`), so this takes the report.
    turn.usage
        .iter()
        .map(|u| {
            format!(
                "usage: {}/{} made {} calls ({} reused): {} tokens, {} in and {} out",
                u.agent,
                u.produce,
                u.calls,
                u.reused,
                u.usage.total_tokens(),
                u.usage.tokens_in,
                u.usage.tokens_out
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A variant of the produce, for the replay case
// ---------------------------------------------------------------------------------------------

mod signed {
    //! `triage` as someone edited it: the drafting prompt also asks for a signature.

    use super::*;

    /// [`triage`](fn@super::triage) with another drafting system prompt.
    #[produce(Triage, also_creates = [PendingAction], uses = [ModelClient, ModelSettings])]
    pub(super) async fn triage(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
        triage_with(&call, |model, category, ticket| {
            let mut request = draft_request(model, category, ticket);
            request
                .system
                .push_str(" Sign the reply as Ada, from the support team.");
            request
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

/// The program's cases, over one directory (each case writes a SQLite file of its own there,
/// `case-<n>.db`) and one model.
pub struct Cases {
    dir: PathBuf,
    model: ModelChoice,
}

/// One case's model and mail service.
struct Fixture {
    path: PathBuf,
    model: Arc<Probe>,
    mailbox: Mailbox,
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
            Case::CrashResume => self.crash_resume(&mut report).await,
            Case::Replay => self.replay(&mut report).await,
            Case::TokenBudget => self.token_budget(&mut report).await,
        };
        if let Err(e) = outcome {
            report.error = Some(e.to_string());
        }
        report
    }

    /// Runs every case, printing each report; whether every claim held.
    pub async fn run_all(&self) -> bool {
        println!(
            "The support agent, asking {}, on SQLite in {}:",
            self.model,
            self.dir.display()
        );
        let mut ok = true;
        for case in Case::ALL {
            let report = self.run(case).await;
            print!("{report}");
            ok &= report.passed();
        }
        ok
    }

    /// A new store for `case` with the five tickets in it, the model (failing the
    /// `fail_at`-th call) and a mail service.
    fn fixture(&self, case: Case, fail_at: Option<u64>) -> Outcome<(Fixture, Context)> {
        let path = self.dir.join(format!("case-{}.db", case.number()));
        if path.exists() {
            return Err(format!("{} exists; the cases need a new directory", path.display()).into());
        }
        let mut context = Context::open(&path, SESSION)?;
        for (id, ticket) in tickets() {
            context.create(id, ticket)?;
        }
        let fixture = Fixture {
            path,
            model: Probe::new(self.model.client(), fail_at),
            mailbox: Mailbox::default(),
        };
        Ok((fixture, context))
    }

    /// The resources `triage` uses: the model and its name.
    fn resources(&self, model: &Arc<Probe>, name: &str) -> Resources {
        Resources::new()
            .with(ModelClient(model.clone()))
            .with(ModelSettings { model: name.to_owned() })
    }

    /// A runtime over `context` running `triage` with the fixture's model, sending emails to
    /// its mailbox if `dispatch`, one run at a time if `one_at_a_time`.
    fn runtime(&self, context: Context, fixture: &Fixture, dispatch: bool, one_at_a_time: bool) -> Outcome<Runtime> {
        let mut builder = Runtime::builder(context)
            .resources(&self.resources(&fixture.model, self.model.name()))
            .agent(Agent::new(AGENT).produce(triage));
        if dispatch {
            builder = builder.dispatcher(fixture.mailbox.dispatcher());
        }
        if one_at_a_time {
            builder = builder.max_concurrency(1);
        }
        Ok(builder.build()?)
    }

    /// Checks that the five triages are committed and each delivered email carries its
    /// ticket's reply, to its customer; with the stand-in, that the categories are the
    /// expected ones and the replies are the stand-in's.
    fn check_triages(&self, report: &mut CaseReport, rt: &Runtime, mailbox: &Mailbox) -> Outcome {
        let mut categories = Vec::new();
        let mut emails_match = true;
        let mut replies_match = true;
        for (id, ticket) in tickets() {
            let Some(triage) = rt.context().get::<Triage>(&triage_id(&id))? else {
                report.check(false, format!("{} was triaged (no {})", id, triage_id(&id)));
                return Ok(());
            };
            categories.push(triage.data.category);
            let expected = Email {
                to: ticket.customer.clone(),
                subject: format!("Re: {}", ticket.subject),
                body: triage.data.reply.clone(),
            };
            emails_match &= mailbox.emails(&email_key(&id)) == [expected];
            if self.model.is_stand_in() {
                let request = draft_request(STAND_IN_NAME, triage.data.category, &ticket.text());
                replies_match &= StandIn::answer(&request)?.text == triage.data.reply;
            }
        }
        let names: Vec<&str> = categories.iter().map(|c| c.as_str()).collect();
        report.check(
            categories.len() as u64 == TICKETS,
            format!("{TICKETS} tickets → {TICKETS} triages: {}", names.join(", ")),
        );
        if self.model.is_stand_in() {
            let expected: Vec<Category> = tickets().iter().map(|(_, t)| Category::classify(&t.text())).collect();
            report.check_eq(
                categories,
                expected,
                "the categories are the model's answers to `classify`",
            );
            report.check(replies_match, "each reply is the model's answer to `draft`");
        }
        report.check(emails_match, "each email carries its ticket's reply, to its customer");
        Ok(())
    }

    /// Case 1: five tickets, two model calls each, five emails sent once each.
    async fn first_run(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::FirstRun, None)?;
        let mut rt = self.runtime(context, &fixture, true, false)?;
        let turn = rt.run().await?;

        report.check_eq(turn.outcome, TurnOutcome::Completed, "the turn completed");
        report.check_eq(
            fixture.model.calls(),
            CALLS_PER_TICKET * TICKETS,
            format!(
                "{} model calls: classify and draft per ticket",
                CALLS_PER_TICKET * TICKETS
            ),
        );
        report.check(
            once_each(&fixture.mailbox),
            format!("{TICKETS} emails delivered, once each: {:?}", fixture.mailbox.counts()),
        );
        self.check_triages(report, &rt, &fixture.mailbox)?;
        let used = turn.total_usage();
        let named = turn.usage.len() == 1
            && turn.usage[0].agent == AGENT
            && turn.usage[0].produce == "triage"
            && turn.usage[0].calls == CALLS_PER_TICKET * TICKETS;
        report.check(
            named,
            format!(
                "the turn's usage names the produce and its {} calls: {} tokens",
                CALLS_PER_TICKET * TICKETS,
                used.total_tokens()
            ),
        );
        if self.model.is_stand_in() {
            let mut expected = Usage::ZERO;
            for (_, ticket) in tickets() {
                let (classify, draft) = stand_in_usage(&ticket)?;
                expected = expected + classify + draft;
            }
            report.check_eq(used, expected, "the usage is what the model reported");
        }
        for line in usage_lines(&turn) {
            report.note(line);
        }
        Ok(())
    }

    /// Case 2: the model fails one call: the turn fails and nothing is committed; the rerun
    /// reuses every answer the failed turn got and asks again only what failed.
    async fn retry(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::Retry, Some(4))?;
        let mut rt = self.runtime(context, &fixture, true, false)?;
        let error = match rt.run().await {
            Ok(turn) => {
                report.check(false, format!("the turn failed (it ended {:?})", turn.outcome));
                return Ok(());
            }
            Err(e) => e.to_string(),
        };
        let first = fixture.model.calls();
        report.check(
            error.contains("503"),
            "the turn failed loudly, naming the model's error",
        );
        report.note(format!("error: {error}"));
        report.check(
            rt.context().list::<Triage>().count() == 0 && fixture.mailbox.total() == 0,
            "nothing was committed or sent",
        );
        report.check_eq(
            rt.context().queued_events(),
            TICKETS as usize,
            "the tickets' events stay queued",
        );

        let turn = rt.run().await?;
        let reused: u64 = turn.usage.iter().map(|u| u.reused).sum();
        let made: u64 = turn.usage.iter().map(|u| u.calls).sum();
        report.check_eq(turn.outcome, TurnOutcome::Completed, "the rerun completed");
        report.check_eq(
            reused,
            first - 1,
            format!("the rerun reused the {} answers the failed turn got", first - 1),
        );
        report.check_eq(
            fixture.model.calls(),
            CALLS_PER_TICKET * TICKETS + 1,
            format!(
                "model calls in all: {} ({first} in the failed turn, {made} in the rerun)",
                CALLS_PER_TICKET * TICKETS + 1
            ),
        );
        report.check(
            once_each(&fixture.mailbox),
            format!("{TICKETS} emails delivered, once each"),
        );
        self.check_triages(report, &rt, &fixture.mailbox)?;
        Ok(())
    }

    /// Case 3: committed by a runtime without a dispatcher, which then stops ("crashes"
    /// after the commit); a new runtime over the reopened store sends every email and asks
    /// the model nothing.
    async fn crash_resume(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::CrashResume, None)?;
        let mut rt = self.runtime(context, &fixture, false, false)?;
        let turn = rt.run().await?;
        let mut pending = 0;
        for key in email_keys() {
            let delivery = rt.context().ledger().get(&key).await?;
            pending += usize::from(delivery.is_some_and(|d| d.status() == DeliveryStatus::Pending));
        }
        report.check(
            rt.context().list::<Triage>().count() as u64 == TICKETS
                && fixture.model.calls() == CALLS_PER_TICKET * TICKETS,
            format!(
                "without a dispatcher: {TICKETS} triages committed, {} model calls",
                fixture.model.calls()
            ),
        );
        report.check(
            pending == TICKETS as usize && turn.deliveries.waiting == pending && fixture.mailbox.total() == 0,
            format!("{pending} emails pending in the ledger, 0 sent"),
        );
        let head = rt.context().head();
        drop(rt);

        let reopened = Context::open(&fixture.path, SESSION)?;
        reopened.verify()?;
        report.check_eq(reopened.head(), head, "the reopened store has every commit");
        let model = Probe::new(self.model.client(), None);
        let resumed = Fixture {
            path: fixture.path.clone(),
            model,
            mailbox: fixture.mailbox.clone(),
        };
        let mut rt = self.runtime(reopened, &resumed, true, false)?;
        let turn = rt.run().await?;
        report.check_eq(turn.runs, 0, "the new runtime re-ran no produce");
        report.check_eq(resumed.model.calls(), 0, "the new runtime asked the model nothing");
        report.check(
            once_each(&fixture.mailbox),
            format!("it delivered the {TICKETS} emails, once each"),
        );
        self.check_triages(report, &rt, &fixture.mailbox)?;
        Ok(())
    }

    /// Case 4: the replay oracle re-executes every run from the log without calling the model
    /// or the mail service; a changed prompt, or another model's name, is a miss naming the
    /// call.
    async fn replay(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::Replay, None)?;
        let mut rt = self.runtime(context, &fixture, true, false)?;
        rt.run().await?;
        let (calls, sent) = (fixture.model.calls(), fixture.mailbox.total());

        let replayed = rt.replay().await?;
        report.check_eq(
            replayed.runs as u64,
            TICKETS,
            format!("the replay re-executed the {TICKETS} runs: the same patches"),
        );
        report.check_eq(
            (fixture.model.calls() - calls, fixture.mailbox.total() - sent),
            (0, 0),
            "the replay made 0 model calls and sent 0 emails",
        );

        // An edited drafting prompt: `classify` is answered from the log, `draft` misses.
        let edited = [Agent::new(AGENT).produce(signed::triage)];
        let resources = self.resources(&fixture.model, self.model.name());
        let result = rt.context().replay_with(&edited, &resources).await;
        self.check_miss(report, result, "a changed drafting prompt", "draft")?;

        // Another model: its name is in the request, so the first call misses.
        let resources = self.resources(&fixture.model, "another-model");
        let agents = [Agent::new(AGENT).produce(triage)];
        let result = rt.context().replay_with(&agents, &resources).await;
        self.check_miss(report, result, "another model name", "classify")?;

        report.check_eq(
            (fixture.model.calls() - calls, fixture.mailbox.total() - sent),
            (0, 0),
            "the replays that missed made 0 model calls and sent 0 emails",
        );
        Ok(())
    }

    /// Checks that `result` diverged with a changed request at the first call named `call`.
    fn check_miss(
        &self,
        report: &mut CaseReport,
        result: Result<reactifact_core::audit::ReplayReport, ReplayError>,
        what: &str,
        call: &str,
    ) -> Outcome {
        let error = match result {
            Ok(_) => {
                report.check(false, format!("a replay with {what} diverges (it passed)"));
                return Ok(());
            }
            Err(e) => e,
        };
        let named = match &error {
            ReplayError::Diverged(divergence) => match &divergence.difference {
                Difference::Call(miss) => {
                    miss.call == call && miss.index == 0 && matches!(miss.kind, MissKind::RequestDiffers { .. })
                }
                _ => false,
            },
            _ => false,
        };
        report.check(
            named,
            format!("a replay with {what} reports the miss at `{call}`, the call whose request changed"),
        );
        report.note(format!("{error}"));
        Ok(())
    }

    /// Case 5: one run at a time, a token budget stops the turn partway; the tickets before
    /// the refused call commit; the next turn finishes and pays only for the calls not yet made.
    async fn token_budget(&self, report: &mut CaseReport) -> Outcome {
        let (fixture, context) = self.fixture(Case::TokenBudget, None)?;
        // Room for the first two tickets' calls, as the stand-in counts them: the third
        // ticket's `classify` finds one token left and is made, its `draft` finds none.
        let mut limit = 1;
        for (_, ticket) in tickets().iter().take(2) {
            let (classify, draft) = stand_in_usage(ticket)?;
            limit += classify.total_tokens() + draft.total_tokens();
        }
        let mut rt = self.runtime(context, &fixture, true, true)?;
        let budget = Budget::default().max_tokens(limit);
        let turn = rt.run_with(budget).await?;
        let first = fixture.model.calls();

        report.check_eq(
            turn.outcome,
            TurnOutcome::TokensExhausted,
            format!("with a budget of {limit} tokens, the turn ended TokensExhausted"),
        );
        report.check(
            first > 0 && first < CALLS_PER_TICKET * TICKETS,
            format!(
                "it stopped partway: {first} of {} model calls made",
                CALLS_PER_TICKET * TICKETS
            ),
        );
        if self.model.is_stand_in() {
            report.check_eq(
                first,
                2 * CALLS_PER_TICKET + 1,
                "the third ticket's `draft` was the call that found the budget spent",
            );
        }
        // The runs of the tickets before the refused call's commit; the rest stay queued.
        let committed = rt.context().list::<Triage>().count() as u64;
        report.check(
            turn.runs == committed
                && committed < TICKETS
                && rt.context().list::<PendingAction>().count() as u64 == committed
                && fixture.mailbox.total() as u64 == committed,
            format!(
                "the tickets before it committed and were emailed ({committed} of {TICKETS}); the rest stay queued"
            ),
        );
        if self.model.is_stand_in() {
            report.check_eq(committed, 2, "the first two tickets' triages committed");
        }
        for line in usage_lines(&turn) {
            report.note(line);
        }

        // What the stopped turn paid for and did not commit is reused: nothing is paid twice.
        let unreused = first - CALLS_PER_TICKET * committed;
        let next = rt.run().await?;
        let reused: u64 = next.usage.iter().map(|u| u.reused).sum();
        report.check_eq(next.outcome, TurnOutcome::Completed, "the next turn completed");
        report.check_eq(
            reused,
            unreused,
            format!("it reused the {unreused} answer(s) the stopped turn got for tickets it did not commit"),
        );
        for line in usage_lines(&next) {
            report.note(line);
        }
        report.check_eq(
            fixture.model.calls(),
            CALLS_PER_TICKET * TICKETS,
            format!("model calls in all: {}, none paid twice", CALLS_PER_TICKET * TICKETS),
        );
        report.check(
            once_each(&fixture.mailbox),
            format!("{TICKETS} emails delivered, once each"),
        );
        self.check_triages(report, &rt, &fixture.mailbox)?;
        Ok(())
    }
}
