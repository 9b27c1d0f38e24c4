//! [`StandIn`], a deterministic model for the support agent and its tests: its answer is a
//! pure function of the request, so runs, retries and replays see the same answers without a
//! network or a key.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError};

/// The system prompt of the triage task: the answer is one word, the ticket's [`Category`].
pub const TRIAGE_SYSTEM: &str = "You triage customer support tickets. Answer with exactly one word, the \
ticket's category: billing, bug, account or general.";

/// The system prompt of the drafting task: the prompt is a line `Category: <category>`
/// followed by the ticket (as [`draft_request`] builds it); the answer is a reply to the
/// customer.
pub const DRAFT_SYSTEM: &str = "You draft a short, polite reply to a customer support ticket. The \
prompt starts with a line `Category: <category>`, followed by the ticket. Answer with the reply only.";

/// The `max_tokens` of a [`triage_request`]: room for one word.
pub const TRIAGE_MAX_TOKENS: u32 = 8;

/// The `max_tokens` of a [`draft_request`].
pub const DRAFT_MAX_TOKENS: u32 = 300;

/// The label of the line that starts a drafting prompt.
const CATEGORY_LABEL: &str = "category:";

/// How many characters of a ticket's first line a stand-in reply quotes.
const SUBJECT_CHARS: usize = 80;

/// What a ticket is about.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Charges, refunds, invoices.
    Billing,
    /// Crashes, errors, things that do not work.
    Bug,
    /// Passwords, signing in.
    Account,
    /// Everything else.
    General,
}

impl Category {
    /// Every category, in the order the stand-in's keyword rules try them.
    pub const ALL: [Category; 4] = [Category::Billing, Category::Bug, Category::Account, Category::General];

    /// The category a model answered: its name, ignoring case, surrounding whitespace and a
    /// trailing full stop (`"Billing."` is [`Category::Billing`]); `None` for anything else.
    pub fn parse(text: &str) -> Option<Category> {
        let word = text.trim();
        let word = word.strip_suffix('.').unwrap_or(word).trim_end();
        Category::ALL
            .into_iter()
            .find(|category| category.as_str().eq_ignore_ascii_case(word))
    }

    /// The category's name, as the triage task answers it and as serde writes it: `billing`,
    /// `bug`, `account` or `general`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Billing => "billing",
            Category::Bug => "bug",
            Category::Account => "account",
            Category::General => "general",
        }
    }

    /// The stand-in's classification of a ticket, by the words in it (ignoring case; a word
    /// counts if it starts with a keyword, so "refunded" and "crashes" count): "refund" or
    /// "charge" is [`Billing`](Category::Billing), else "crash", "error" or "bug" is
    /// [`Bug`](Category::Bug), else "password" or "login" is [`Account`](Category::Account),
    /// else [`General`](Category::General).
    pub fn classify(ticket: &str) -> Category {
        let words: Vec<String> = ticket
            .split(|c: char| !c.is_alphanumeric())
            .filter(|word| !word.is_empty())
            .map(str::to_lowercase)
            .collect();
        let mentions = |keywords: &[&str]| {
            words
                .iter()
                .any(|word| keywords.iter().any(|keyword| word.starts_with(keyword)))
        };
        if mentions(&["refund", "charge"]) {
            Category::Billing
        } else if mentions(&["crash", "error", "bug"]) {
            Category::Bug
        } else if mentions(&["password", "login"]) {
            Category::Account
        } else {
            Category::General
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The request that asks `model` for the category of `ticket` ([`TRIAGE_SYSTEM`]).
pub fn triage_request(model: impl Into<String>, ticket: &str) -> CompletionRequest {
    CompletionRequest {
        model: model.into(),
        system: TRIAGE_SYSTEM.to_owned(),
        prompt: ticket.to_owned(),
        max_tokens: TRIAGE_MAX_TOKENS,
    }
}

/// The request that asks `model` to draft a reply to `ticket` of `category`
/// ([`DRAFT_SYSTEM`]): the prompt is `Category: <category>`, a blank line, and the ticket.
pub fn draft_request(model: impl Into<String>, category: Category, ticket: &str) -> CompletionRequest {
    CompletionRequest {
        model: model.into(),
        system: DRAFT_SYSTEM.to_owned(),
        prompt: format!("Category: {category}\n\n{ticket}"),
        max_tokens: DRAFT_MAX_TOKENS,
    }
}

/// A deterministic [`Model`]. It knows the two tasks by their
/// system prompts:
///
/// - [`TRIAGE_SYSTEM`]: the text is exactly one category word, [`Category::classify`] of the
///   prompt.
/// - [`DRAFT_SYSTEM`]: the text is a reply built from the category and the ticket's first
///   line. The category is the one named by a first line `Category: <category>` of the
///   prompt (see [`draft_request`]), or else [`Category::classify`] of the prompt.
///
/// Any other system prompt is answered like a server refusing a bad request: a
/// [`ModelError::Status`] of 400, which is not retryable. The text is cut after
/// `max_tokens` words. Tokens are counted as whitespace-separated words: of the system prompt
/// and the prompt in, of the text out. The stand-in counts the calls it answers.
#[derive(Debug, Default)]
pub struct StandIn {
    calls: AtomicU64,
}

impl StandIn {
    /// A stand-in that has answered no call yet.
    pub fn new() -> Self {
        StandIn::default()
    }

    /// How many calls of [`Model::complete`] it has answered (successfully or not).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The stand-in's answer to `request`, without counting a call: the same request always
    /// gets the same answer.
    pub fn answer(request: &CompletionRequest) -> Result<Completion, ModelError> {
        let full = if request.system == TRIAGE_SYSTEM {
            Category::classify(&request.prompt).as_str().to_owned()
        } else if request.system == DRAFT_SYSTEM {
            draft(&request.prompt)
        } else {
            return Err(ModelError::status(
                400,
                b"the stand-in model answers only the triage and draft system prompts",
            ));
        };
        let (text, tokens_out) = first_words(&full, request.max_tokens);
        Ok(Completion {
            text: text.to_owned(),
            tokens_in: words(&request.system) + words(&request.prompt),
            tokens_out,
        })
    }
}

impl Model for StandIn {
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::Relaxed);
            StandIn::answer(request)
        })
    }
}

/// The stand-in's reply to a drafting prompt.
fn draft(prompt: &str) -> String {
    let mut lines = prompt.lines().peekable();
    let named = lines.peek().and_then(|first| {
        let first = first.trim();
        let label = first.get(..CATEGORY_LABEL.len())?;
        if !label.eq_ignore_ascii_case(CATEGORY_LABEL) {
            return None;
        }
        Category::parse(&first[CATEGORY_LABEL.len()..])
    });
    let category = match named {
        Some(category) => {
            lines.next();
            category
        }
        None => Category::classify(prompt),
    };
    let subject = match lines.map(str::trim).find(|line| !line.is_empty()) {
        Some(line) if line.chars().count() > SUBJECT_CHARS => {
            let cut: String = line.chars().take(SUBJECT_CHARS).collect();
            format!("\"{}…\"", cut.trim_end())
        }
        Some(line) => format!("\"{line}\""),
        None => "your ticket".to_owned(),
    };
    let body = match category {
        Category::Billing => {
            "We are looking into the charge and will correct it, with a refund if one is due, \
             within five business days."
        }
        Category::Bug => {
            "We have passed the details to our engineers and will let you know as soon as a fix \
             is available."
        }
        Category::Account => {
            "You can reset your password from the sign-in page; if that does not work, reply to \
             this message and we will unlock your account."
        }
        Category::General => "A member of our team will get back to you within one business day.",
    };
    format!("Hello,\n\nThank you for writing to us about {subject}. {body}\n\nThe support team")
}

/// The number of whitespace-separated words in `text`.
fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// `text` up to the end of its `max` first words (the words themselves unchanged), and how
/// many words that is.
fn first_words(text: &str, max: u32) -> (&str, u64) {
    let mut count = 0u64;
    let mut end = 0;
    let mut in_word = false;
    for (at, c) in text.char_indices() {
        if c.is_whitespace() {
            in_word = false;
        } else {
            if !in_word {
                if count == u64::from(max) {
                    break;
                }
                count += 1;
                in_word = true;
            }
            end = at + c.len_utf8();
        }
    }
    (&text[..end], count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_after_max_words() {
        assert_eq!(first_words("one two  three", 2), ("one two", 2));
        assert_eq!(first_words("  one\n\ntwo ", 5), ("  one\n\ntwo", 2));
        assert_eq!(first_words("one", 0), ("", 0));
        assert_eq!(first_words("", 3), ("", 0));
    }
}
