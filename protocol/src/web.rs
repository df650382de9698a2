//! The routes of the daemon's web view (`orchestrate daemon --http`), as data: the server
//! dispatches by this table and the security tests are generated from it, so a route added
//! here cannot be served without the checks, nor skip their tests.

/// What a route does to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only; served to `GET` (and `HEAD`).
    Read,
    /// Changes state (cancels a run): served only to its non-`GET` method, and only when the
    /// request's `Origin` is the server's own.
    Change,
}

/// One route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// A name for it (the server's handler is chosen by it).
    pub name: &'static str,
    /// The method it answers.
    pub method: &'static str,
    /// The path; `{id}` is a run's id, `{stage}` a stage's name, each one path segment.
    pub path: &'static str,
    /// Whether it changes state.
    pub effect: Effect,
}

const fn read(name: &'static str, path: &'static str) -> Route {
    Route {
        name,
        method: "GET",
        path,
        effect: Effect::Read,
    }
}

/// Every route of the web view. Every one needs the token (as the cookie the token URL sets,
/// or `Authorization: Bearer`), and an allowed `Host`; none runs a plan.
pub const ROUTES: &[Route] = &[
    read("page", "/"),
    read("script", "/app.js"),
    read("style", "/app.css"),
    read("runs", "/api/runs"),
    read("runs_events", "/api/events"),
    read("run", "/api/runs/{id}"),
    read("events", "/api/runs/{id}/events"),
    read("memory", "/api/runs/{id}/memory"),
    read("log", "/api/runs/{id}/stages/{stage}/log"),
    Route {
        name: "cancel",
        method: "POST",
        path: "/api/runs/{id}/cancel",
        effect: Effect::Change,
    },
    read("metrics", "/metrics"),
];

/// How the name of the cookie the token URL sets begins. The rest names the daemon (its
/// port and a digest of its address and runs directory), since browsers keep cookies per host
/// name, not per port: two daemons on one machine each keep their own login.
pub const COOKIE_PREFIX: &str = "orchestrate_token_";

/// What the file beside the daemon's socket that holds the web view's token (mode 0600) adds
/// to the socket's path: `daemon.sock` → `daemon.sock.web-token`.
pub const TOKEN_FILE_SUFFIX: &str = ".web-token";

/// Matches `path` against a route's pattern: the `{…}` segments' values (percent-decoded), or
/// `None` when it does not match.
pub fn match_path(pattern: &str, path: &str) -> Option<Vec<String>> {
    let want: Vec<&str> = pattern.split('/').collect();
    let have: Vec<&str> = path.split('/').collect();
    if want.len() != have.len() {
        return None;
    }
    let mut params = Vec::new();
    for (w, h) in want.iter().zip(&have) {
        if w.starts_with('{') && w.ends_with('}') {
            let value = percent_decode(h)?;
            if value.is_empty() || value.contains('/') {
                return None;
            }
            params.push(value);
        } else if w != h {
            return None;
        }
    }
    Some(params)
}

/// Decodes `%XX` escapes (and `+` as itself); `None` when an escape is broken or the result is
/// not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_their_patterns_only() {
        assert_eq!(
            match_path(
                "/api/runs/{id}/stages/{stage}/log",
                "/api/runs/r-1/stages/a%20b/log"
            ),
            Some(vec!["r-1".to_string(), "a b".to_string()])
        );
        assert_eq!(match_path("/api/runs/{id}", "/api/runs/a/b"), None);
        assert_eq!(match_path("/api/runs/{id}", "/api/runs/a%2Fb"), None);
        assert_eq!(match_path("/api/runs/{id}", "/api/runs/"), None);
        assert_eq!(match_path("/", "/"), Some(vec![]));
    }

    #[test]
    fn every_route_is_named_once_and_changes_are_not_gets() {
        let mut names: Vec<_> = ROUTES.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ROUTES.len());
        for r in ROUTES {
            assert_eq!(r.effect == Effect::Change, r.method != "GET", "{r:?}");
        }
    }
}
