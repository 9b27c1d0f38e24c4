//! `export-audit`: a session's audit trail as JSON lines on stdout.

use std::io::Write;

use super::Env;
use crate::failure::{Failure, Outcome};

/// Writes one JSON object per commit of the session.
pub fn export_audit(env: &Env, session: Option<&str>) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, false)?;
    let mut out = std::io::BufWriter::new(std::io::stdout());
    match env.wait(ctx.export_audit(&mut out)).and_then(|_| out.flush()) {
        // The reader went away (`… | head`): nothing more to write.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::input(format!("the audit trail could not be written: {e}"))),
        Ok(()) => Ok(()),
    }
}
