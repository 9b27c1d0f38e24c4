//! The outbox walkthrough: an order flow whose notification is sent once, whatever happens.
//!
//! Run it with `cargo run -p reactifact-examples --bin outbox`. Each case asserts what it
//! claims and prints one line; the program exits non-zero if any assertion fails.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use reactifact_core::{
    Agent, Artifact, Context, DeliveryStatus, DispatchError, Intent, PendingAction, Produce, ProduceCall, Runtime,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order {
    customer: String,
    total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Receipt {
    order: String,
    total_cents: u64,
}

impl Artifact for Receipt {
    const KIND: &'static str = "receipt";
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Notify {
    customer: String,
    order: String,
}

/// `Order` → a `Receipt` and a `notify` intent keyed by the order id. No I/O here.
fn process_order() -> Produce {
    Produce::new("process_order", |call: ProduceCall<Order>| async move {
        let order_id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{order_id}"),
            Receipt {
                order: order_id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects.act(
            "notify",
            format!("notify:{order_id}"),
            &Notify {
                customer: call.trigger.data.customer.clone(),
                order: order_id,
            },
        );
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

/// A mail service stand-in: counts sends per key and can be told to fail the next one.
#[derive(Clone, Default)]
struct Mailer {
    sent: Arc<Mutex<Vec<String>>>,
    fail_next: Arc<AtomicBool>,
}

impl Mailer {
    fn sends(&self, key: &str) -> usize {
        self.sent.lock().unwrap().iter().filter(|k| *k == key).count()
    }

    fn dispatcher(&self) -> impl reactifact_core::Dispatcher {
        let mailer = self.clone();
        move |intent: Intent| {
            let mailer = mailer.clone();
            async move {
                if mailer.fail_next.swap(false, Ordering::SeqCst) {
                    return Err(DispatchError::msg("smtp: connection refused"));
                }
                let notify: Notify = intent.payload()?;
                let _ = notify.customer;
                mailer.sent.lock().unwrap().push(intent.key().to_string());
                Ok(())
            }
        }
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what.to_owned())
    }
}

fn order(customer: &str, total_cents: u64) -> Order {
    Order {
        customer: customer.into(),
        total_cents,
    }
}

async fn walkthrough() -> Result<(), Box<dyn std::error::Error>> {
    let mailer = Mailer::default();
    let mut rt = Runtime::builder(Context::new("orders"))
        .agent(Agent::new("billing").produce(process_order()))
        .agent(Agent::new("audit").produce(process_order()))
        .dispatcher(mailer.dispatcher())
        .build();

    // 1. commit → dispatch
    rt.context_mut().create("order:1", order("ada", 1200))?;
    let report = rt.run().await?;
    let status = rt.context().ledger().get("notify:order:1").map(|d| d.status());
    check(mailer.sends("notify:order:1") == 1, "case 1: one send after the commit")?;
    check(
        status == Some(DeliveryStatus::Delivered),
        "case 1: the ledger says delivered",
    )?;
    println!(
        "1. commit -> dispatch: {} generation(s) committed, then 1 send; ledger: delivered",
        report.generations
    );

    // 2. re-derivation
    rt.context_mut().update("order:1", order("ada", 1500))?;
    let report = rt.run().await?;
    check(report.runs > 0, "case 2: the edit re-ran the produce")?;
    check(mailer.sends("notify:order:1") == 1, "case 2: the re-run sent nothing")?;
    println!(
        "2. re-derivation: the edit re-ran {} produce(s); sends for the key are still 1",
        report.runs
    );

    // 3. same generation: two agents (billing and audit) react to one event
    rt.context_mut().create("order:2", order("bob", 300))?;
    rt.run().await?;
    check(mailer.sends("notify:order:2") == 1, "case 3: one send for two agents")?;
    println!("3. same generation: two agents reacted to order:2; one intent, one send");

    // 6. failure → retry
    mailer.fail_next.store(true, Ordering::SeqCst);
    rt.context_mut().create("order:3", order("eve", 990))?;
    let report = rt.run().await?;
    let entry = rt.context().ledger().get("notify:order:3").ok_or("case 6: no intent")?;
    check(report.deliveries.failed.len() == 1, "case 6: the failure is reported")?;
    check(
        entry.status() == DeliveryStatus::Failed,
        "case 6: the failure is recorded",
    )?;
    let error = entry.last_error().unwrap_or_default().to_owned();
    rt.retry("notify:order:3")?;
    rt.flush().await?;
    check(
        mailer.sends("notify:order:3") == 1,
        "case 6: retry + flush delivers once",
    )?;
    println!("6. failure -> retry: attempt 1 failed ({error}); retry + flush delivered it once");

    println!(
        "state: {} artifacts, {} commits, head {}",
        rt.context().len(),
        rt.context().log().len(),
        rt.context().head().map(|h| h.short()).unwrap_or_default()
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match walkthrough().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("walkthrough failed: {e}");
            ExitCode::FAILURE
        }
    }
}
