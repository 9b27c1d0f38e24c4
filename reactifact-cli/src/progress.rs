//! The progress bar of `verify` and `replay` on long logs: drawn on stderr, and only when
//! stderr is a terminal, so that scripts and pipes see none of it.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Logs shorter than this refold too fast for a bar to help.
const LONG_LOG: u64 = 500;

/// A bar over `commits` commits labelled `label`, hidden when stderr is not a terminal or the
/// log is short.
pub fn bar(commits: u64, label: &str) -> ProgressBar {
    if commits < LONG_LOG || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(commits);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} commits ({eta})")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message(label.to_owned());
    bar
}
