//! W3C trace context across the outbox: the `traceparent` of a produce run, kept beside the
//! intents it commits, continued by the delivery that sends them (in whatever process), and
//! handed to the dispatcher to send downstream.
//!
//! The core depends on no tracing backend. By default it mints the ids itself — a trace id per
//! turn, a span id per produce run and per delivery attempt — and records them as the fields
//! `trace_id`, `span_id` (and, on a delivery, `parent_span_id`) of its `produce` and
//! `delivery` spans, so that logs correlate a delivery with the decision that caused it. A
//! program that exports traces (tracing-opentelemetry, say) installs a [`TracePropagation`]
//! once with [`set_trace_propagation`]: the core then asks it for the context of each run's span
//! and lets it make each delivery span a continuation of the stored context.

use std::fmt;
use std::sync::OnceLock;

/// A W3C trace context (`traceparent`, version `00`): a trace id, the id of the span that is
/// the parent of whatever receives it, and the trace flags.
///
/// Both ids are never all zero (the W3C invalid value). It formats as the header value
/// (`00-<32 hex>-<16 hex>-<2 hex>`) and parses from one, strictly: a value that is not valid is
/// refused, never half-read, so nothing but a well-formed header is ever sent.
///
/// ```
/// use reactifact_core::runtime::TraceParent;
/// let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let trace: TraceParent = header.parse()?;
/// assert_eq!(trace.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(trace.is_sampled());
/// assert_eq!(trace.to_string(), header);
/// assert!("00-00000000000000000000000000000000-00f067aa0ba902b7-01".parse::<TraceParent>().is_err());
/// # Ok::<(), reactifact_core::error::TraceParentError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

/// The `sampled` bit of the trace flags.
const SAMPLED: u8 = 0x01;

impl TraceParent {
    /// How many bytes [`to_bytes`](Self::to_bytes) writes: the trace id, the parent id and the
    /// flags.
    pub const ENCODED_LEN: usize = 25;

    /// A trace context from its parts; `None` if either id is all zero.
    pub fn new(trace_id: [u8; 16], parent_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && parent_id != [0; 8]).then_some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The trace id as 32 lowercase hex digits, as logs and the header show it.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent span's id: the span whose child is whatever receives this context.
    pub fn parent_id(&self) -> [u8; 8] {
        self.parent_id
    }

    /// The parent span's id as 16 lowercase hex digits.
    pub fn parent_id_hex(&self) -> String {
        hex(&self.parent_id)
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the `sampled` flag is set: the caller may have recorded its span.
    pub fn is_sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The same trace, with `parent_id` as the parent span (for a span that continues this
    /// context); `None` if `parent_id` is all zero.
    pub fn with_parent(&self, parent_id: [u8; 8]) -> Option<Self> {
        TraceParent::new(self.trace_id, parent_id, self.flags)
    }

    /// The fixed-size encoding stores keep: the trace id, the parent id, the flags.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0; Self::ENCODED_LEN];
        out[..16].copy_from_slice(&self.trace_id);
        out[16..24].copy_from_slice(&self.parent_id);
        out[24] = self.flags;
        out
    }

    /// A trace context from [`to_bytes`](Self::to_bytes)'s encoding; `None` for anything else
    /// (a wrong length, an all-zero id), so that a damaged stored value is dropped, never
    /// sent.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; Self::ENCODED_LEN] = bytes.try_into().ok()?;
        let mut trace_id = [0; 16];
        let mut parent_id = [0; 8];
        trace_id.copy_from_slice(&bytes[..16]);
        parent_id.copy_from_slice(&bytes[16..24]);
        TraceParent::new(trace_id, parent_id, bytes[24])
    }

    /// A new trace: random ids, sampled.
    pub(crate) fn mint() -> Self {
        TraceParent::new(nonzero_id(), nonzero_id(), SAMPLED).expect("minted ids are never zero")
    }

    /// A new span of this trace: the same trace id and flags, a random span id.
    pub(crate) fn mint_child(&self) -> Self {
        self.with_parent(nonzero_id()).expect("minted ids are never zero")
    }
}

/// Random bytes, never all zero.
fn nonzero_id<const N: usize>() -> [u8; N] {
    loop {
        let mut id = [0; N];
        fastrand::fill(&mut id);
        if id != [0; N] {
            return id;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    Hex(bytes).to_string()
}

/// Bytes shown as lowercase hex, formatted where they are written.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 32];
        for chunk in self.0.chunks(16) {
            for (pair, b) in buf.chunks_exact_mut(2).zip(chunk) {
                pair[0] = DIGITS[usize::from(b >> 4)];
                pair[1] = DIGITS[usize::from(b & 0xf)];
            }
            f.write_str(std::str::from_utf8(&buf[..chunk.len() * 2]).expect("hex digits are ASCII"))?;
        }
        Ok(())
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (trace, parent, flags) = (Hex(&self.trace_id), Hex(&self.parent_id), Hex(&[self.flags]));
        write!(f, "00-{trace}-{parent}-{flags}")
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

/// Why a `traceparent` value was refused ([`TraceParent`]'s `FromStr`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceParentError {
    /// Not `version-traceid-parentid-flags` with the W3C lengths, or a digit that is not
    /// lowercase hex.
    #[error("not a W3C traceparent (expected 00-<32 hex>-<16 hex>-<2 hex>)")]
    Malformed,
    /// Version `ff`, which the W3C forbids.
    #[error("traceparent version ff is invalid")]
    InvalidVersion,
    /// An all-zero trace id or parent id.
    #[error("a traceparent's trace id and parent id must not be all zero")]
    ZeroId,
}

impl std::str::FromStr for TraceParent {
    type Err = TraceParentError;

    /// Parses a `traceparent` header value as the W3C recommendation says: version `00` is
    /// exactly 55 characters; a later version may append fields after a `-`, which are
    /// ignored; surrounding spaces or tabs (as an HTTP header may carry) are ignored.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim_matches([' ', '\t']).as_bytes();
        if value.len() < 55 {
            return Err(TraceParentError::Malformed);
        }
        let version = hex_bytes::<1>(&value[0..2])?[0];
        if version == 0xff {
            return Err(TraceParentError::InvalidVersion);
        }
        let longer_ok = version != 0 && value.get(55) == Some(&b'-');
        if value.len() != 55 && !longer_ok {
            return Err(TraceParentError::Malformed);
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return Err(TraceParentError::Malformed);
        }
        let trace_id = hex_bytes::<16>(&value[3..35])?;
        let parent_id = hex_bytes::<8>(&value[36..52])?;
        let flags = hex_bytes::<1>(&value[53..55])?[0];
        TraceParent::new(trace_id, parent_id, flags).ok_or(TraceParentError::ZeroId)
    }
}

/// `2 * N` lowercase hex digits as `N` bytes.
fn hex_bytes<const N: usize>(digits: &[u8]) -> Result<[u8; N], TraceParentError> {
    fn nibble(d: u8) -> Result<u8, TraceParentError> {
        match d {
            b'0'..=b'9' => Ok(d - b'0'),
            b'a'..=b'f' => Ok(d - b'a' + 10),
            _ => Err(TraceParentError::Malformed),
        }
    }
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Ok(out)
}

/// How the core's spans join the traces of a tracing backend: installed once per process with
/// [`set_trace_propagation`]. Without one the core mints its own ids (see the module docs).
///
/// With tracing-opentelemetry, `context_of` reads the span's OpenTelemetry context
/// (`OpenTelemetrySpanExt::context`) and `continue_from` sets it as the span's parent
/// (`set_parent`) or adds it as a link (`add_link`); `docs/observability.md` shows the whole
/// adapter.
pub trait TracePropagation: Send + Sync + 'static {
    /// The W3C context of `span` — a produce run's span, or a delivery's after
    /// [`continue_from`](Self::continue_from) — if the backend gave it one. `None` (the
    /// default) lets the core mint ids.
    fn context_of(&self, span: &tracing::Span) -> Option<TraceParent> {
        let _ = span;
        None
    }

    /// Makes `span`, a delivery attempt's span (not entered yet), a continuation of `parent`,
    /// the context of the produce run that committed the intent: its child, or a span linked
    /// to it. The default does nothing.
    fn continue_from(&self, span: &tracing::Span, parent: &TraceParent) {
        let _ = (span, parent);
    }
}

static PROPAGATION: OnceLock<Box<dyn TracePropagation>> = OnceLock::new();

/// Installs the process's [`TracePropagation`], before the first turn or drain that should use
/// it.
///
/// # Errors
/// Gives `propagation` back if one was installed already (it cannot be replaced).
pub fn set_trace_propagation<P: TracePropagation>(propagation: P) -> Result<(), P> {
    let mut given = Some(propagation);
    PROPAGATION.get_or_init(|| Box::new(given.take().expect("taken once")));
    match given {
        None => Ok(()),
        Some(refused) => Err(refused),
    }
}

/// Whether a [`TracePropagation`] is installed.
pub(crate) fn propagating() -> bool {
    PROPAGATION.get().is_some()
}

/// The installed propagation's context of `span`; `None` if there is none, or if the adapter
/// panicked (a tracing adapter never takes a turn down with it).
fn context_of(p: &dyn TracePropagation, span: &tracing::Span) -> Option<TraceParent> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.context_of(span))).unwrap_or(None)
}

/// The context of a produce run's `span` in the trace `turn`: the installed propagation's, or
/// a new span id of `turn`. Records it on the span's `trace_id` and `span_id` fields.
///
/// With a propagation installed but the run's span filtered out (the `produce` span is a
/// debug span), the run still joins the backend's trace: a new span id in the trace of the
/// innermost span the filter kept (the `turn`, usually), so that the stored context names a
/// trace the backend has.
pub(crate) fn run_context(span: &tracing::Span, turn: &TraceParent) -> TraceParent {
    let context = PROPAGATION
        .get()
        .and_then(|p| {
            context_of(&**p, span).or_else(|| context_of(&**p, &tracing::Span::current()).map(|c| c.mint_child()))
        })
        .unwrap_or_else(|| turn.mint_child());
    record(span, &context);
    context
}

/// The context of a delivery attempt's `span` continuing `stored` (the producing run's, if
/// the ledger kept one): what the dispatcher is handed to send downstream. Records it on the
/// span's `trace_id`, `span_id` and `parent_span_id` fields.
pub(crate) fn delivery_context(span: &tracing::Span, stored: Option<&TraceParent>) -> TraceParent {
    let propagation = PROPAGATION.get();
    if let (Some(p), Some(stored)) = (propagation, stored) {
        // A panicking adapter leaves the span as it was; the ids are minted below.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.continue_from(span, stored)));
    }
    let context = propagation
        .and_then(|p| context_of(&**p, span))
        .unwrap_or_else(|| stored.map_or_else(TraceParent::mint, TraceParent::mint_child));
    record(span, &context);
    if let Some(stored) = stored.filter(|_| !span.is_disabled()) {
        span.record("parent_span_id", tracing::field::display(Hex(&stored.parent_id)));
    }
    context
}

/// Records `context` on the span's `trace_id` and `span_id` fields, if the span is enabled
/// (formatted only then: a disabled span costs no formatting).
fn record(span: &tracing::Span, context: &TraceParent) {
    if !span.is_disabled() {
        span.record("trace_id", tracing::field::display(Hex(&context.trace_id)));
        span.record("span_id", tracing::field::display(Hex(&context.parent_id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_formats_and_refuses_the_rest() {
        let t = TraceParent::new([0xab; 16], [0x01; 8], 1).unwrap();
        assert_eq!(t.to_string().parse::<TraceParent>(), Ok(t));
        assert_eq!(TraceParent::from_bytes(&t.to_bytes()), Some(t));
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            format!(" {ok}\t").parse::<TraceParent>().map(|t| t.to_string()),
            Ok(ok.to_owned())
        );
        // A later version may carry more fields; version 00 may not.
        assert!("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
            .parse::<TraceParent>()
            .is_ok());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert!(bad.parse::<TraceParent>().is_err(), "{bad:?} was accepted");
        }
        assert_eq!(TraceParent::from_bytes(&[1; 24]), None);
        assert_eq!(TraceParent::from_bytes(&[0; 25]), None);
    }

    #[test]
    fn minted_contexts_are_valid_and_continue_their_trace() {
        let root = TraceParent::mint();
        let child = root.mint_child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.parent_id(), root.parent_id());
        assert!(child.is_sampled());
        assert_eq!(child.to_string().parse::<TraceParent>(), Ok(child));
    }
}
