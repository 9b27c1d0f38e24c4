//! The transactional outbox's cost on PostgreSQL: an application inserts N rows of its own in
//! transactions of `--batch` rows (default 100), once with a plain `INSERT` alone and once with
//! an intent per row enqueued in the same transaction (`Enqueue` +
//! `PostgresOutbox::register`), runs interleaved, `--runs` times each (default 3).
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin enqueue-bench -- 10000 --batch 100 \
//!     --url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Prints one JSON line per run (`mode` `plain` or `enqueue`, rows, batch, seconds,
//! rows_per_sec), then a summary: the median rows per second of each mode and the enqueue's
//! overhead over the plain insert (`1 - enqueue / plain`). Everything runs in schemas of the
//! run's own, dropped at the end.

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use reactifact_core::store::Enqueue;
use reactifact_postgres::{PostgresOptions, PostgresOutbox};

struct Options {
    rows: i64,
    batch: i64,
    runs: usize,
    url: String,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        rows: 10_000,
        batch: 100,
        runs: 3,
        url: std::env::var("REACTIFACT_TEST_POSTGRES_URL").unwrap_or_default(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--batch" => options.batch = value("--batch")?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--runs" => options.runs = value("--runs")?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--url" => options.url = value("--url")?,
            n => options.rows = n.parse().map_err(|e| format!("N: {e}"))?,
        }
    }
    if options.url.is_empty() {
        return Err("give --url or set REACTIFACT_TEST_POSTGRES_URL".to_owned());
    }
    if options.batch < 1 || options.rows < 1 {
        return Err("N and --batch must be positive".to_owned());
    }
    Ok(options)
}

/// Inserts `options.rows` accounts into `table`, `options.batch` to a transaction, each batch
/// with its welcome emails enqueued if `enqueue`; returns the seconds it took.
async fn run(outbox: &PostgresOutbox, table: &str, options: &Options, enqueue: bool) -> Result<f64, String> {
    let mut client = outbox.pool().get().await.map_err(|e| e.to_string())?;
    let insert = format!("INSERT INTO {table} (id, email) SELECT * FROM unnest($1::bigint[], $2::text[])");
    let started = Instant::now();
    let mut first = 0;
    while first < options.rows {
        let ids: Vec<i64> = (first..(first + options.batch).min(options.rows)).collect();
        let emails: Vec<String> = ids.iter().map(|id| format!("user{id}@example.com")).collect();
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        tx.execute(&insert, &[&ids, &emails]).await.map_err(|e| e.to_string())?;
        if enqueue {
            let intents = ids
                .iter()
                .zip(&emails)
                .map(|(id, email)| Enqueue::new("email", format!("welcome:{table}:{id}"), email).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            outbox
                .register(&*tx, &intents, SystemTime::now())
                .await
                .map_err(|e| e.to_string())?;
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        first += options.batch;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn bench(options: &Options) -> Result<(), String> {
    let schema = format!("enqueue_bench_{}", std::process::id());
    let outbox = PostgresOutbox::open(PostgresOptions::new(&options.url).schema(&schema))
        .await
        .map_err(|e| e.to_string())?;
    let app = format!("{schema}_app");
    let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!("CREATE SCHEMA \"{app}\""))
        .await
        .map_err(|e| e.to_string())?;
    let (mut plain, mut enqueued) = (Vec::new(), Vec::new());
    let mut outcome = Ok(());
    for r in 0..options.runs {
        for enqueue in [false, true] {
            let table = format!("\"{app}\".accounts_{r}_{}", if enqueue { "e" } else { "p" });
            let created = client
                .batch_execute(&format!(
                    "CREATE TABLE {table} (id bigint PRIMARY KEY, email text NOT NULL)"
                ))
                .await;
            if let Err(e) = created {
                outcome = Err(e.to_string());
                break;
            }
            match run(&outbox, &table, options, enqueue).await {
                Ok(seconds) => {
                    let per_sec = options.rows as f64 / seconds;
                    println!(
                        "{{\"mode\":\"{}\",\"rows\":{},\"batch\":{},\"seconds\":{seconds:.3},\"rows_per_sec\":{per_sec:.0}}}",
                        if enqueue { "enqueue" } else { "plain" },
                        options.rows,
                        options.batch
                    );
                    if enqueue { &mut enqueued } else { &mut plain }.push(per_sec);
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
    }
    let dropped = client
        .batch_execute(&format!(
            "DROP SCHEMA \"{app}\" CASCADE; DROP SCHEMA \"{schema}\" CASCADE"
        ))
        .await;
    outcome?;
    dropped.map_err(|e| e.to_string())?;
    let (plain, enqueued) = (median(plain), median(enqueued));
    println!(
        "{{\"summary\":true,\"runs\":{},\"plain_rows_per_sec\":{plain:.0},\"enqueue_rows_per_sec\":{enqueued:.0},\"overhead\":{:.3}}}",
        options.runs,
        1.0 - enqueued / plain
    );
    Ok(())
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("enqueue-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(bench(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("enqueue-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
