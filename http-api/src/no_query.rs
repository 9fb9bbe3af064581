//! [`NoQuery`]: refuses a query string on a route that reads none.
//!
//! Why: a write route that ignored its query would run what the client did not ask for —
//! `DELETE /v1/sessions/a?expected_version=3` deleting the session whatever its version,
//! because the version belongs in `If-Match`. A parameter the route does not read is a
//! mistake of the client's, answered 400 before anything runs.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::problem::Problem;

/// The request has no query string (an empty one, `?` alone, passes).
pub struct NoQuery;

impl<S: Send + Sync> FromRequestParts<S> for NoQuery {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        match parts.uri.query() {
            None | Some("") => Ok(NoQuery),
            Some(query) => Err(Problem::invalid_field(
                "query",
                format!(
                    "this route takes no query parameters, not {}",
                    parameter_names(query)
                ),
            )),
        }
    }
}

/// The names of `query`'s parameters, for the error (at most a few, each cut short).
fn parameter_names(query: &str) -> String {
    const SHOWN_MAX: usize = 4;
    const NAME_CHARS_MAX: usize = 40;
    let mut pairs = query.split('&').filter(|pair| !pair.is_empty());
    let shown: Vec<String> = pairs
        .by_ref()
        .take(SHOWN_MAX)
        .map(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            format!(
                "`{}`",
                name.chars().take(NAME_CHARS_MAX).collect::<String>()
            )
        })
        .collect();
    let mut text = shown.join(", ");
    let more = pairs.count();
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_cut_short_and_counted() {
        assert_eq!(parameter_names("expected_version=3"), "`expected_version`");
        assert_eq!(parameter_names("a=1&&b"), "`a`, `b`");
        let long = format!("{}=1", "x".repeat(100));
        assert_eq!(parameter_names(&long), format!("`{}`", "x".repeat(40)));
        assert_eq!(
            parameter_names("a&b&c&d&e&f"),
            "`a`, `b`, `c`, `d` and 2 more"
        );
    }
}
