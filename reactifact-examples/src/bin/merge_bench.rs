//! Merge cost against shared history: two branches with a few changes each, forked from a
//! context with S shared commits, merged; and `diff_commits` over the branch's last changes.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin merge-bench -- 1000 100000 --samples 101
//! cargo run --release -p reactifact-examples --bin merge-bench -- 1000 100000 --ids all
//! ```
//!
//! Shared commit `i` writes `order:{i % K}` with new content (a create, then updates), so the
//! base state holds K orders: `--ids K` (default 1,000) keeps the state the same size whatever
//! S, to measure the cost of history alone; `--ids all` makes K = S, so state and history grow
//! together. Per sample, `ours` and `theirs` are forked from the base and make
//! `--changes` commits each (updates of their own orders, a create and a delete) — untimed —
//! then `ours.merge(&theirs)` is timed, and then `theirs.diff_commits(S, head)`. Prints one JSON
//! line per S (medians, minimum and maximum in microseconds) and, with two or more S, a last
//! line with the ratio of the largest S's median merge to the smallest's. Exits non-zero if a
//! merge does not take exactly their changes.

use std::process::ExitCode;
use std::time::Instant;

use reactifact_core::runtime::Generation;
use reactifact_core::Context;
use reactifact_examples::order_flow::Order;

struct Options {
    shared: Vec<u64>,
    /// Distinct ids the shared history writes; `None`: as many as commits.
    ids: Option<u64>,
    samples: usize,
    changes: u64,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        shared: Vec::new(),
        ids: Some(1_000),
        samples: 51,
        changes: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--samples" => options.samples = value("--samples")?.parse().map_err(|e| format!("--samples: {e}"))?,
            "--ids" => {
                options.ids = match value("--ids")?.as_str() {
                    "all" => None,
                    k => Some(k.parse().map_err(|e| format!("--ids: {e}"))?),
                }
            }
            "--changes" => options.changes = value("--changes")?.parse().map_err(|e| format!("--changes: {e}"))?,
            s => options.shared.push(s.parse().map_err(|e| format!("S: {e}"))?),
        }
    }
    if options.shared.is_empty() {
        options.shared = vec![1_000, 100_000];
    }
    if options.samples == 0 || options.changes < 3 {
        return Err("--samples must be at least 1 and --changes at least 3".into());
    }
    let fewest = options
        .ids
        .unwrap_or(u64::MAX)
        .min(*options.shared.iter().min().expect("not empty"));
    if fewest < 2 * (options.changes + 1) {
        return Err(format!("the base must hold at least {} ids", 2 * (options.changes + 1)));
    }
    Ok(options)
}

fn order(customer: &str, total_cents: u64) -> Order {
    Order {
        customer: customer.to_owned(),
        total_cents,
    }
}

/// `shared` commits, commit `i` writing `order:{i % ids}`.
fn base(shared: u64, ids: u64) -> Result<Context, String> {
    let mut ctx = Context::new("base");
    for i in 0..shared {
        ctx.create(format!("order:{}", i % ids), order("base", i))
            .map_err(|e| e.to_string())?;
    }
    Ok(ctx)
}

/// `changes` commits on a side: updates of orders only this side touches, one create, one
/// delete.
fn change(ctx: &mut Context, side: &str, changes: u64, ids: u64) -> Result<(), String> {
    let offset = if side == "ours" { 0 } else { ids / 2 };
    let err = |e: reactifact_core::error::WriteError| e.to_string();
    for c in 0..changes - 2 {
        ctx.update(format!("order:{}", offset + c), order(side, c))
            .map_err(err)?;
    }
    ctx.create(format!("{side}:new"), order(side, 1)).map_err(err)?;
    ctx.delete(format!("order:{}", offset + changes)).map_err(err)?;
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure(shared: u64, options: &Options) -> Result<(f64, String), String> {
    let ids = options.ids.unwrap_or(shared).min(shared);
    let base = base(shared, ids)?;
    let (mut merges, mut diffs) = (Vec::new(), Vec::new());
    for sample in 0..options.samples {
        let mut ours = base.fork(format!("ours{sample}")).map_err(|e| e.to_string())?;
        let mut theirs = base.fork(format!("theirs{sample}")).map_err(|e| e.to_string())?;
        change(&mut ours, "ours", options.changes, ids)?;
        change(&mut theirs, "theirs", options.changes, ids)?;

        let started = Instant::now();
        let report = ours.merge(&theirs).map_err(|e| e.to_string())?;
        merges.push(started.elapsed().as_secs_f64() * 1e6);
        if report.taken.len() as u64 != options.changes {
            return Err(format!(
                "the merge took {} ids, not {}",
                report.taken.len(),
                options.changes
            ));
        }

        let started = Instant::now();
        let diff = theirs
            .diff_commits(Generation(shared), theirs.generation())
            .map_err(|e| e.to_string())?;
        diffs.push(started.elapsed().as_secs_f64() * 1e6);
        if (diff.updated.len() + diff.created.len() + diff.deleted.len()) as u64 != options.changes {
            return Err("diff_commits does not list the branch's changes".into());
        }
    }
    let (min, max) = (
        merges.iter().copied().fold(f64::INFINITY, f64::min),
        merges.iter().copied().fold(0.0, f64::max),
    );
    let merge = median(&mut merges);
    let diff = median(&mut diffs);
    Ok((
        merge,
        format!(
            "{{\"shared_commits\":{shared},\"ids\":{ids},\"changes\":{},\"samples\":{},\"merge_median_us\":{merge:.1},\"merge_min_us\":{min:.1},\"merge_max_us\":{max:.1},\"diff_commits_median_us\":{diff:.1}}}",
            options.changes, options.samples
        ),
    ))
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("merge-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let mut medians = Vec::new();
    for &shared in &options.shared {
        match measure(shared, &options) {
            Ok((merge, line)) => {
                println!("{line}");
                medians.push((shared, merge));
            }
            Err(e) => {
                eprintln!("merge-bench: S = {shared}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let (Some(&(low, low_median)), Some(&(high, high_median))) = (
        medians.iter().min_by_key(|(s, _)| *s),
        medians.iter().max_by_key(|(s, _)| *s),
    ) {
        if low != high {
            println!(
                "{{\"ratio\":{:.2},\"of\":\"merge median at {high} over {low} shared commits\"}}",
                high_median / low_median
            );
        }
    }
    ExitCode::SUCCESS
}
