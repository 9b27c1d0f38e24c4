//! `LISTEN`/`NOTIFY`: a registration notifies the store's channel when its transaction commits,
//! and a drainer waiting on [`Notifications`] wakes at once instead of at its next poll.
//!
//! One listening connection per [`PostgresOutbox`](crate::PostgresOutbox) (outside its pool),
//! opened by the first [`listen`](crate::PostgresOutbox::listen) and kept while the outbox or
//! any [`Notifications`] lives. When it drops it is reopened after a second, and every waiter
//! is woken once it listens again (a notification sent meanwhile was missed, so a drainer
//! should look). Notifications are a hint: a drainer still polls at its interval, which
//! covers what no notification announces (a retry falling due, a lease expiring).

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

/// A waiter for the notifications of one store ([`PostgresOutbox::listen`]).
///
/// [`PostgresOutbox::listen`]: crate::PostgresOutbox::listen
#[derive(Debug)]
pub struct Notifications {
    receiver: watch::Receiver<u64>,
}

impl Notifications {
    pub(crate) fn new(receiver: watch::Receiver<u64>) -> Self {
        Notifications { receiver }
    }

    /// Waits for the next wake-up: an intent registered (or re-armed by an operator) in the
    /// store since the last call, or the listening connection (re)established. Returns at
    /// once if one came since the last call (or, for the first call, since the outbox began
    /// listening). Returns `false` when the listener has ended for good (the outbox was
    /// dropped); poll instead.
    pub async fn next(&mut self) -> bool {
        self.receiver.changed().await.is_ok()
    }
}

/// Runs the listening connection until every receiver is gone.
pub(crate) async fn run(config: tokio_postgres::Config, channel: String, store: String, sender: watch::Sender<u64>) {
    let wake = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n = n.wrapping_add(1));
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                let listen_sql = format!("LISTEN \"{channel}\"");
                let listen = client.batch_execute(&listen_sql);
                tokio::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        done = &mut listen, if !listening => match done {
                            Ok(()) => {
                                listening = true;
                                wake(&sender);
                            }
                            Err(e) => {
                                tracing::warn!(store = %store, error = %e, "the outbox's LISTEN failed; drainers fall back to polling");
                                break;
                            }
                        },
                        message = messages.next() => match message {
                            Some(Ok(AsyncMessage::Notification(_))) => wake(&sender),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(store = %store, error = %e, "the outbox's listening connection failed; reconnecting");
                                break;
                            }
                            None => break,
                        },
                        () = sender.closed() => return,
                    }
                }
            }
            Err(e) => {
                tracing::warn!(store = %store, error = %e, "the outbox's listening connection could not be opened; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = sender.closed() => return,
        }
    }
}
