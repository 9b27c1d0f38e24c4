//! A request's query string, parsed by hand so that every bad parameter — an unknown name, a
//! repeated one, a number that does not parse, an unknown status — answers 400 with a JSON
//! error naming it.

use std::collections::BTreeMap;

use reactifact_core::ledger::DeliveryStatus;

use crate::error::ApiError;
use crate::json::status;

/// The most entries or commits one page holds.
pub(crate) const MAX_LIMIT: usize = 1000;

/// The parameters of one request.
pub(crate) struct Params {
    values: BTreeMap<String, String>,
}

impl Params {
    /// Parses `query`, admitting only the parameter names in `known`.
    pub(crate) fn parse(query: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        let mut values = BTreeMap::new();
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if !known.contains(&name.as_ref()) {
                let mut shown: String = name.chars().take(64).collect();
                if shown.len() < name.len() {
                    shown.push('…');
                }
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter `{shown}`; this endpoint takes: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            }
            if values.insert(name.to_string(), value.into_owned()).is_some() {
                return Err(ApiError::bad_request(format!(
                    "query parameter `{name}` is given twice"
                )));
            }
        }
        Ok(Params { values })
    }

    /// A text parameter (empty counts as absent).
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// A whole-number parameter.
    pub(crate) fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.text(name)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "query parameter `{name}` must be a whole number from 0 to {}",
                        u64::MAX
                    ))
                })
            })
            .transpose()
    }

    /// `limit`: from 1 to [`MAX_LIMIT`], `default` when absent.
    pub(crate) fn limit(&self, default: usize) -> Result<usize, ApiError> {
        match self.number("limit")? {
            None => Ok(default),
            Some(n) if (1..=MAX_LIMIT as u64).contains(&n) => Ok(n as usize),
            Some(_) => Err(ApiError::bad_request(format!(
                "query parameter `limit` must be from 1 to {MAX_LIMIT}"
            ))),
        }
    }

    /// `status`: a status as the CLI spells it (`awaiting-approval`, …).
    pub(crate) fn status(&self) -> Result<Option<DeliveryStatus>, ApiError> {
        let Some(given) = self.text("status") else {
            return Ok(None);
        };
        DeliveryStatus::ALL
            .into_iter()
            .find(|s| status(*s) == given)
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "query parameter `status` must be one of: {}",
                    DeliveryStatus::ALL.map(status).join(", ")
                ))
            })
    }
}
