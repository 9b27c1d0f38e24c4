//! What the router is built with: the store, the tokens that may call it (each with a
//! principal and a role), and whether payloads are shown.

use std::sync::Arc;

use crate::store::Store;

/// The shortest secret a token may have, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// Every `GET` endpoint; no state-changing request.
    ReadOnly,
    /// Everything: also approve, reject, retry and cancel.
    Operator,
}

impl Role {
    /// The role as a token file spells it: `read-only` or `operator`.
    pub fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::Operator => "operator",
        }
    }
}

/// A bearer token: the secret a client sends (`Authorization: Bearer SECRET`), the principal
/// it stands for (recorded as who made each decision) and its role.
#[derive(Clone)]
pub struct Token {
    pub(crate) principal: String,
    pub(crate) secret: String,
    pub(crate) role: Role,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("principal", &self.principal)
            .field("secret", &"***")
            .field("role", &self.role)
            .finish()
    }
}

/// Why a token or a token file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// The principal is empty or holds whitespace.
    #[error("token principal `{0}` must be non-empty and without whitespace")]
    BadPrincipal(String),
    /// The secret is too short.
    #[error("the secret of token `{principal}` has {len} bytes; a secret needs at least {MIN_SECRET_LEN}")]
    ShortSecret {
        /// The token's principal.
        principal: String,
        /// The secret's length.
        len: usize,
    },
    /// A line of a token file does not read as `ROLE PRINCIPAL SECRET`.
    #[error("token file line {line}: expected `ROLE PRINCIPAL SECRET` with ROLE `read-only` or `operator`")]
    BadLine {
        /// The line's number, from 1.
        line: usize,
    },
    /// A token file names no token.
    #[error("the token file holds no token")]
    Empty,
}

impl Token {
    /// A token for `principal` with `secret` (at least [`MIN_SECRET_LEN`] bytes).
    ///
    /// # Errors
    /// [`TokenError::BadPrincipal`] or [`TokenError::ShortSecret`].
    pub fn new(principal: impl Into<String>, secret: impl Into<String>, role: Role) -> Result<Token, TokenError> {
        let (principal, secret) = (principal.into(), secret.into());
        if principal.is_empty() || principal.chars().any(char::is_whitespace) {
            return Err(TokenError::BadPrincipal(principal));
        }
        if secret.len() < MIN_SECRET_LEN {
            return Err(TokenError::ShortSecret {
                len: secret.len(),
                principal,
            });
        }
        Ok(Token {
            principal,
            secret,
            role,
        })
    }

    /// The principal the token stands for.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The token's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Reads a token file: one token a line, `ROLE PRINCIPAL SECRET` separated by whitespace,
    /// ROLE `read-only` or `operator`; blank lines and lines starting with `#` are skipped.
    ///
    /// # Errors
    /// [`TokenError::BadLine`] naming the first bad line, an error of [`Token::new`], or
    /// [`TokenError::Empty`].
    pub fn parse_file(text: &str) -> Result<Vec<Token>, TokenError> {
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let role = match words.first() {
                Some(&"read-only") => Role::ReadOnly,
                Some(&"operator") => Role::Operator,
                _ => return Err(TokenError::BadLine { line: i + 1 }),
            };
            let [_, principal, secret] = words.as_slice() else {
                return Err(TokenError::BadLine { line: i + 1 });
            };
            tokens.push(Token::new(*principal, *secret, role)?);
        }
        if tokens.is_empty() {
            return Err(TokenError::Empty);
        }
        Ok(tokens)
    }
}

/// The router's configuration (see [`router`](crate::router)).
pub struct Config {
    pub(crate) store: Arc<Store>,
    pub(crate) tokens: Vec<Token>,
    pub(crate) show_payloads: bool,
}

impl Config {
    /// A configuration over `store` with no token yet (every request is refused until one is
    /// added) and payloads hidden.
    pub fn new(store: Arc<Store>) -> Self {
        Config {
            store,
            tokens: Vec::new(),
            show_payloads: false,
        }
    }

    /// Adds tokens that may call the API.
    pub fn tokens(mut self, tokens: impl IntoIterator<Item = Token>) -> Self {
        self.tokens.extend(tokens);
        self
    }

    /// Shows intents' payloads (decoded) instead of their SHA-256 and size. Off by default.
    pub fn show_payloads(mut self, show: bool) -> Self {
        self.show_payloads = show;
        self
    }
}
