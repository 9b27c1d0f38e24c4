//! The scripted model of the support agent: [`answer`], the function a
//! `reactifact_model::stand_in::StandIn` server answers with, and the [`Category`] a triage
//! answers. Its answers are a pure function of the request — but for the tool-call ids, which
//! are new on every request, as a real model's are — so a retry, a resume and a replay see the
//! same decisions without a network or a key.

use std::fmt;

use reactifact_model::stand_in::Reply;
use reactifact_model::{ChatAnswer, ChatRequest, FinishReason, Message, TokenUsage, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::json;

use reactifact_core::tools::Tool;

use super::agent::{IssueRefund, LookupOrder, Order, SendReply, CUSTOMER_LABEL, ORDER_LABEL, SUBJECT_LABEL};

/// The tokens the stand-in reports for a request that asks to look the order up.
pub const PLAN_TOKENS: (u64, u64) = (120, 12);

/// The tokens the stand-in reports for a request that carries the order and gets the replies.
pub const ACT_TOKENS: (u64, u64) = (260, 80);

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

/// The stand-in's answer to request number `index` (from 0):
///
/// - a conversation without a tool result yet: a call of `lookup_order` with the order the
///   user message names (its `Order:` line);
/// - a conversation with the order in a tool result: the text is the ticket's category
///   ([`Category::classify`] of the user message), with a call of `send_reply` (a reply to the
///   customer built from the category and the order), and — for a billing ticket whose order
///   is paid — a call of `issue_refund` of the order's amount.
///
/// Every tool call gets a new id, `call_{index}_{n}`: a model asked again answers the same
/// calls under other ids. Usage is [`PLAN_TOKENS`] and [`ACT_TOKENS`]. A request without a user
/// message is answered 400.
pub fn answer(index: u64, request: &ChatRequest) -> Reply {
    let mut user = None;
    let mut order = None;
    for message in &request.messages {
        match message {
            Message::User { content } => user = Some(content.as_str()),
            Message::Tool { content, .. } => order = serde_json::from_str::<Order>(content).ok().or(order),
            _ => {}
        }
    }
    let Some(user) = user else {
        return Reply::status(400, r#"{"error": {"message": "no user message"}}"#);
    };
    let line = |label: &str| {
        user.lines()
            .find_map(|line| line.strip_prefix(label))
            .map(str::trim)
            .unwrap_or("")
            .to_owned()
    };
    let id = |n: usize| format!("call_{index}_{n}");
    let Some(order) = order else {
        let args = json!({ "order": line(ORDER_LABEL) });
        let call = ToolCall::new(id(0), LookupOrder::NAME, args.to_string());
        return Reply::tool_calls(vec![call], PLAN_TOKENS.0, PLAN_TOKENS.1);
    };
    let category = Category::classify(user);
    let body = match category {
        Category::Billing if order.paid_cents > 0 => format!(
            "We are sorry about order {}. We have asked for a refund of {}.{:02}; you will hear from us once it is issued.",
            order.id,
            order.paid_cents / 100,
            order.paid_cents % 100
        ),
        Category::Billing => format!("Order {} shows no payment to refund; we are looking into the charge.", order.id),
        Category::Bug => "Thank you for the report: our engineers are on it, and a fix is coming.".to_owned(),
        Category::Account => "We have sent you a new sign-in link; it is valid for one hour.".to_owned(),
        Category::General => format!("Thank you for writing. Order {} is {}.", order.id, order.status),
    };
    let reply = json!({
        "to": line(CUSTOMER_LABEL),
        "subject": format!("Re: {}", line(SUBJECT_LABEL)),
        "body": body,
    });
    let mut calls = vec![ToolCall::new(id(0), SendReply::NAME, reply.to_string())];
    if category == Category::Billing && order.paid_cents > 0 {
        let refund = json!({ "order": order.id, "cents": order.paid_cents });
        calls.push(ToolCall::new(id(1), IssueRefund::NAME, refund.to_string()));
    }
    Reply::answer(ChatAnswer {
        content: Some(category.as_str().to_owned()),
        tool_calls: calls,
        finish_reason: Some(FinishReason::ToolCalls),
        usage: TokenUsage {
            prompt_tokens: ACT_TOKENS.0,
            completion_tokens: ACT_TOKENS.1,
        },
    })
}
