//! The deterministic failures of a session command.

/// Error codes of the session state machine (stable: clients match on them).
pub mod code {
    /// The command's bytes could not be decoded.
    pub const MALFORMED: u32 = 1;
    /// No session has that client id.
    pub const NOT_FOUND: u32 = 2;
    /// A session with that client id exists already.
    pub const ALREADY_EXISTS: u32 = 3;
    /// The session's version is not the one the command expected.
    pub const VERSION_MISMATCH: u32 = 4;
    /// A field is out of its bounds; the message names it.
    pub const INVALID_FIELD: u32 = 5;
    /// The state store refused a key or value.
    pub const STORE_REJECTED: u32 = 6;
}

/// Why a session command failed. The same on every replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionError {
    /// One of [`code`].
    pub code: u32,
    /// A human-readable explanation (names the field for [`code::INVALID_FIELD`]).
    pub message: String,
}

impl SessionError {
    /// An error with `code` and `message`.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        SessionError {
            code,
            message: message.into(),
        }
    }

    /// A command or record that could not be decoded.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(code::MALFORMED, message)
    }

    /// A field out of bounds.
    pub fn invalid(field: &str, problem: &str) -> Self {
        Self::new(code::INVALID_FIELD, format!("{field}: {problem}"))
    }

    /// For an [`code::INVALID_FIELD`] error, the field it names (made by
    /// [`SessionError::invalid`]: the message's part before the first `": "`).
    pub fn invalid_field(&self) -> Option<&str> {
        if self.code != code::INVALID_FIELD {
            return None;
        }
        self.message.split_once(": ").map(|(field, _)| field)
    }
}

impl core::fmt::Display for SessionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for SessionError {}
