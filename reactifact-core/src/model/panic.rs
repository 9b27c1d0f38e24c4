//! What a caught panic said.

use std::any::Any;

/// The message a caught panic carried: its `&str` or `String` payload, or a placeholder.
pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
