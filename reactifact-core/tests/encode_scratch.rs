//! The buffer records are encoded into, which each thread keeps: a panicking or failing
//! `Serialize` leaves it usable and does not pin a large partial encoding, huge records
//! round-trip, and a write from a thread-local's destructor (the buffer already gone) works.
#![allow(dead_code)]

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use common::*;
use reactifact_core::{Artifact, Context};
use serde::ser::{Error as _, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};

/// Writes some fields, then panics (or fails) in the middle of the encoding.
#[derive(Deserialize, Debug, Clone)]
struct Bad {
    how: u8,
}

impl Serialize for Bad {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Bad", 3)?;
        st.serialize_field("a", &"x".repeat(100_000))?;
        match self.how {
            0 => panic!("user Serialize panics mid-encoding"),
            _ => Err(S::Error::custom("user Serialize fails mid-encoding")),
        }
    }
}

impl Artifact for Bad {
    const KIND: &'static str = "bad";
}

#[test]
fn a_panicking_or_failing_serialize_leaves_the_scratch_usable() {
    let mut reference = Context::new("ref");
    reference.create("order:1", order("ada", 1)).unwrap();

    let mut ctx = Context::new("t");
    let panicked = catch_unwind(AssertUnwindSafe(|| ctx.create("bad:1", Bad { how: 0 })));
    assert!(panicked.is_err());
    assert!(ctx.create("bad:2", Bad { how: 1 }).is_err());
    ctx.create("order:1", order("ada", 1)).unwrap();
    assert_eq!(ctx.state_hash(), reference.state_hash());
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().data, order("ada", 1));
    // A huge record, then a small one: both round-trip.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Big {
        blob: Vec<String>,
    }
    impl Artifact for Big {
        const KIND: &'static str = "big";
    }
    let big = Big {
        blob: (0..50_000).map(|i| format!("{i:08}")).collect(),
    };
    ctx.create("big:1", big).unwrap();
    assert_eq!(ctx.get::<Big>("big:1").unwrap().unwrap().data.blob.len(), 50_000);
    ctx.update("order:1", order("ada", 2)).unwrap();
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().data, order("ada", 2));
}

/// A writer kept in a thread-local that writes what it holds when the thread ends (a
/// batching writer flushing on thread exit).
struct FlushOnExit {
    ctx: Option<Context>,
}

impl Drop for FlushOnExit {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.as_mut() {
            ctx.create("order:flushed", order("ada", 7)).unwrap();
            eprintln!("flushed on thread exit: {} artifacts", ctx.len());
        }
    }
}

thread_local! {
    static WRITER: std::cell::RefCell<FlushOnExit> = const { std::cell::RefCell::new(FlushOnExit { ctx: None }) };
}

#[test]
fn a_write_during_thread_local_destruction_does_not_abort() {
    // Run in a child process: a panic in a thread-local destructor aborts the process.
    if std::env::var_os("REVIEW_TLS_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "a_write_during_thread_local_destruction_does_not_abort",
                "--exact",
                "--nocapture",
            ])
            .env("REVIEW_TLS_CHILD", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stderr.contains("flushed on thread exit"),
            "child failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        return;
    }
    std::thread::spawn(|| {
        // The writer's thread-local is registered first, so it is destroyed after the
        // encoder's scratch buffer (registered by the first write below).
        WRITER.with(|w| w.borrow_mut().ctx = Some(Context::new("tls")));
        WRITER.with(|w| {
            w.borrow_mut()
                .ctx
                .as_mut()
                .unwrap()
                .create("order:1", order("ada", 1))
                .unwrap();
        });
    })
    .join()
    .unwrap();
}

fn resident() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: i64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Encodes its blob (shared, so the unwind does not free it), then panics.
#[derive(Debug)]
struct PanicsAfterBlob {
    blob: Arc<String>,
}

impl Serialize for PanicsAfterBlob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("PanicsAfterBlob", 2)?;
        st.serialize_field("blob", self.blob.as_str())?;
        panic!("user Serialize panics after writing 96 MiB");
    }
}

impl<'de> Deserialize<'de> for PanicsAfterBlob {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        unreachable!("never read back")
    }
}

impl Artifact for PanicsAfterBlob {
    const KIND: &'static str = "panics_after_blob";
}

#[test]
fn a_panic_mid_encoding_does_not_pin_the_partial_encoding() {
    std::panic::set_hook(Box::new(|_| {}));
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap(); // the scratch exists on this thread
    let blob = Arc::new("x".repeat(96 << 20));
    let before = resident();
    let value = PanicsAfterBlob { blob: blob.clone() };
    let panicked = catch_unwind(AssertUnwindSafe(|| ctx.create("bad:1", value)));
    assert!(panicked.is_err());
    let after_panic = resident();
    ctx.create("order:2", order("ada", 2)).unwrap(); // the next encode on this thread
    let after_next = resident();
    let _ = std::panic::take_hook();
    eprintln!(
        "resident growth: after the panic {} MiB, after the next encode {} MiB",
        (after_panic - before) >> 20,
        (after_next - before) >> 20
    );
    assert!(
        after_panic - before < (16 << 20),
        "~{} MiB of the panicked encoding stay allocated on the thread",
        (after_panic - before) >> 20
    );
}
