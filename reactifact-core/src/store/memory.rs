//! TEMPORARY STUB on the lead's branch: helper M's MemoryOutbox replaces this file.
#![allow(missing_docs, unused)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::action::ActionKey;
use crate::model::delivery::{Delivery, FenceToken, NewIntent};
use crate::store::outbox::*;
use crate::store::StoreError;

#[derive(Default)]
pub struct MemoryOutbox;

impl MemoryOutbox {
    pub fn new() -> Arc<MemoryOutbox> {
        Arc::new(MemoryOutbox)
    }
    pub(crate) fn register(&self, intents: &[NewIntent], now: SystemTime) {
        todo!()
    }
}

impl OutboxStore for MemoryOutbox {
    fn describe(&self) -> String {
        "memory".into()
    }
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        todo!()
    }
    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        todo!()
    }
    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime) {
        todo!()
    }
    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        todo!()
    }
    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>> {
        todo!()
    }
    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>> {
        todo!()
    }
    fn purge(&self, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        todo!()
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>> {
        todo!()
    }
    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        todo!()
    }
    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>> {
        todo!()
    }
    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>> {
        todo!()
    }
}
