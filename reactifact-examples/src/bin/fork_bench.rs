//! What sharing a large state costs: fork, a fork's first write, a snapshot, and commits made
//! while a snapshot is kept.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin fork-bench -- 1000000 --commits 10 --samples 21
//! ```
//!
//! Builds an in-memory context of M orders (`order:{i}`) in C commits of M / C creates each
//! (untimed), then per sample times: `fork` of it; the fork's first write (one update, one
//! commit); `snapshot`; and one one-update commit on the context while that snapshot is kept,
//! and another after it is dropped. Prints one JSON line with the medians, minima and maxima in
//! microseconds. Exits non-zero unless the kept snapshot still reads the value it saw and the
//! fork's write left the context untouched.

use std::process::ExitCode;
use std::time::Instant;

use reactifact_core::Context;
use reactifact_examples::order_flow::Order;

struct Options {
    artifacts: u64,
    commits: u64,
    samples: usize,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        artifacts: 1_000_000,
        commits: 10,
        samples: 21,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--commits" => options.commits = value("--commits")?.parse().map_err(|e| format!("--commits: {e}"))?,
            "--samples" => options.samples = value("--samples")?.parse().map_err(|e| format!("--samples: {e}"))?,
            m => options.artifacts = m.parse().map_err(|e| format!("M: {e}"))?,
        }
    }
    if options.samples == 0 || options.commits == 0 || options.artifacts < options.commits {
        return Err("--samples and --commits must be at least 1, M at least --commits".into());
    }
    Ok(options)
}

fn order(total_cents: u64) -> Order {
    Order {
        customer: "ada".into(),
        total_cents,
    }
}

/// Median, minimum and maximum, in microseconds.
fn summary(mut samples: Vec<f64>) -> String {
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    format!(
        "{{\"median_us\":{median:.1},\"min_us\":{:.1},\"max_us\":{:.1}}}",
        samples[0],
        samples[samples.len() - 1]
    )
}

fn micros(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e6
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("fork-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let mut ctx = Context::new("main");
    let per_commit = options.artifacts / options.commits;
    for c in 0..options.commits {
        let mut tx = ctx.transaction();
        for i in c * per_commit..(c + 1) * per_commit {
            tx.create(format!("order:{i}"), order(i));
        }
        tx.commit().expect("seeding commits");
    }
    let (mut fork, mut first_write, mut snapshot, mut kept, mut after) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for sample in 0..options.samples as u64 {
        let start = Instant::now();
        let mut branch = ctx.fork(format!("branch-{sample}")).expect("fork");
        fork.push(micros(start));

        let start = Instant::now();
        branch
            .update("order:0", order(1_000_000 + sample))
            .expect("the fork's write");
        first_write.push(micros(start));
        drop(branch);

        let start = Instant::now();
        let view = ctx.snapshot();
        snapshot.push(micros(start));
        let seen = view.get::<Order>("order:1").expect("read").expect("present").data;

        let start = Instant::now();
        ctx.update("order:1", order(2_000_000 + sample))
            .expect("a write while a snapshot is kept");
        kept.push(micros(start));
        let still = view.get::<Order>("order:1").expect("read").expect("present").data;
        if still != seen {
            eprintln!("fork-bench: the kept snapshot changed");
            return ExitCode::FAILURE;
        }
        drop(view);

        let start = Instant::now();
        ctx.update("order:2", order(3_000_000 + sample))
            .expect("a write after the snapshot");
        after.push(micros(start));
    }
    let untouched = ctx.get::<Order>("order:0").expect("read").expect("present").data;
    if untouched != order(0) {
        eprintln!("fork-bench: a fork's write reached the context");
        return ExitCode::FAILURE;
    }
    println!(
        "{{\"bench\":\"fork\",\"artifacts\":{},\"commits\":{},\"samples\":{},\"fork\":{},\"first_write\":{},\"snapshot\":{},\"write_while_kept\":{},\"write_after\":{}}}",
        ctx.len(),
        options.commits,
        options.samples,
        summary(fork),
        summary(first_write),
        summary(snapshot),
        summary(kept),
        summary(after)
    );
    ExitCode::SUCCESS
}
