//! The bearer token that guards the routes that change the cluster (membership, leadership):
//! read once from a file, compared in constant time, never logged.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::problem::{Problem, kind};

/// Fewer characters than this is a password, not a token.
const TOKEN_CHARS_MIN: usize = 16;

/// The admin token. Its `Debug` does not show it.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// The token in `path` (surrounding whitespace removed): at least 16 visible ASCII
    /// characters.
    pub fn from_file(path: &Path) -> Result<AdminToken, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        AdminToken::new(text.trim())
            .map_err(|problem| format!("{}: the admin token {problem}", path.display()))
    }

    /// `token` itself, checked as [`AdminToken::from_file`] checks it.
    pub fn new(token: &str) -> Result<AdminToken, String> {
        if token.len() < TOKEN_CHARS_MIN {
            return Err(format!("has fewer than {TOKEN_CHARS_MIN} characters"));
        }
        if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err("must be visible ASCII characters only".into());
        }
        Ok(AdminToken(token.into()))
    }

    /// The token, for a client to send.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is the token, in time that depends on its length only.
    fn matches(&self, offered: &[u8]) -> bool {
        let expected = self.0.as_bytes();
        offered.len() == expected.len()
            && offered
                .iter()
                .zip(expected)
                .fold(0u8, |difference, (a, b)| difference | (a ^ b))
                == 0
    }
}

/// Lets a request through to an admin route if the server has no token, or if it carries
/// `Authorization: Bearer <token>`; otherwise 401 (no credentials) or 403 (wrong ones).
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.admin_token else {
        return next.run(request).await;
    };
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
    match offered {
        Some(offered) if token.matches(offered) => next.run(request).await,
        Some(_) => Problem::new(
            StatusCode::FORBIDDEN,
            kind::FORBIDDEN,
            "the bearer token is not this server's admin token",
        )
        .into_response(),
        None => {
            let mut response = Problem::new(
                StatusCode::UNAUTHORIZED,
                kind::UNAUTHORIZED,
                "this route changes the cluster: send Authorization: Bearer <admin token>",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_compared_whole() {
        assert!(AdminToken::new("short").is_err());
        assert!(AdminToken::new("sixteen chars ok").is_err(), "a space");
        let token = AdminToken::new("0123456789abcdef").unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b"0123456789abcde"));
        assert!(!token.matches(b"0123456789abcdef0"));
        assert_eq!(format!("{token:?}"), "AdminToken(..)");
    }
}
