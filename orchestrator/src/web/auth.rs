//! Who may use the web view, checked before any route runs (as Jupyter's server does):
//!
//! 1. the `Host` header names an allowed host (loopback names, and the names the operator
//!    adds), else 403: a page on another site that rebinds its DNS name to this address
//!    cannot read the view;
//! 2. the request carries the token: the cookie the token URL sets (named for this daemon,
//!    [`cookie_name`]), or `Authorization: Bearer <token>` (a scraper; the scheme in any case),
//!    else 401; `?token=` on a `GET` is exchanged for the HttpOnly, SameSite=Strict cookie and
//!    redirected to the URL without it;
//! 3. a route that changes state answers only its own non-`GET` method (else 405), and only
//!    when `Origin` is this server's own origin (else 403), so another site cannot cancel a run
//!    through the user's browser.

use super::http::{Request, Response};
use protocol::web::{Effect, Route, COOKIE_PREFIX};

/// The token and the allowed host names.
#[derive(Debug, Clone)]
pub struct Auth {
    token: String,
    hosts: Vec<String>,
    cookie: String,
}

/// What the gate lets through.
#[derive(Debug, PartialEq, Eq)]
pub enum Pass {
    /// Serve the request.
    Serve,
    /// The token was in the URL and is right: set the cookie, send the browser to `location`.
    SetCookie {
        /// The URL without the token.
        location: String,
    },
}

/// Host names that always reach the view: the loopback ones.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl Auth {
    /// `token`, the host names allowed beyond the loopback ones, and the cookie's name
    /// ([`cookie_name`]).
    pub fn new(token: String, extra_hosts: &[String], cookie: String) -> Auth {
        let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
        hosts.extend(extra_hosts.iter().map(|h| h.to_ascii_lowercase()));
        Auth {
            token,
            hosts,
            cookie,
        }
    }

    /// The cookie's name.
    pub fn cookie_name(&self) -> &str {
        &self.cookie
    }

    /// The token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `host` (a `Host` header's value, with or without a port) is allowed.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        self.hosts.contains(&name)
    }

    /// Whether `given` is the token (in time independent of where they differ).
    fn is_token(&self, given: &str) -> bool {
        let (a, b) = (self.token.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// The checks, in order, for `request` to `route` (None: a path no route has, which is
    /// checked all the same and then answered 404 by the caller).
    pub fn gate(&self, request: &Request, route: Option<&Route>) -> Result<Pass, Response> {
        let host = request.header("host").unwrap_or("");
        if !self.host_allowed(host) {
            return Err(Response::text(
                403,
                format!("forbidden: Host {host:?} is not an allowed name for this server"),
            ));
        }
        let authorized = cookie(request, &self.cookie).is_some_and(|t| self.is_token(t))
            || bearer(request).is_some_and(|t| self.is_token(t));
        if !authorized {
            let from_url = request.param("token").is_some_and(|t| self.is_token(t));
            if from_url && request.method == "GET" {
                return Ok(Pass::SetCookie {
                    location: without_token(request),
                });
            }
            return Err(Response::text(
                401,
                "unauthorized: open the URL with the token that `orchestrate daemon --http` printed (the token is also in the file <socket>.web-token beside the daemon's socket)",
            ));
        }
        let Some(route) = route else {
            return Ok(Pass::Serve);
        };
        if route.effect == Effect::Change {
            if request.method != route.method {
                return Err(Response::text(
                    405,
                    format!("method not allowed: {} takes {}", route.path, route.method),
                )
                .with("Allow", route.method));
            }
            let origin = request.header("origin").unwrap_or("");
            if origin != format!("http://{host}") {
                return Err(Response::text(
                    403,
                    format!("forbidden: a change needs this server's own Origin (http://{host}), not {origin:?}"),
                ));
            }
        } else if request.method != "GET" && request.method != "HEAD" {
            return Err(Response::text(
                405,
                format!("method not allowed: {} takes GET", route.path),
            )
            .with("Allow", "GET"));
        }
        Ok(Pass::Serve)
    }

    /// The header that sets the cookie: for this host name only (no `Domain`), never to
    /// scripts (`HttpOnly`), never on another site's requests (`SameSite=Strict`).
    pub fn set_cookie(&self) -> String {
        format!(
            "{}={}; HttpOnly; SameSite=Strict; Path=/",
            self.cookie, self.token
        )
    }
}

/// The cookie's name for a daemon listening on `addr` with its runs in `runs_dir`:
/// [`COOKIE_PREFIX`], the port, and 8 hex digits of a digest of both (FNV-1a), so that two
/// daemons on one machine (another port, or another runs directory on the same port later)
/// never share a name and a login to one leaves the other's alone. Stable across restarts of
/// the same daemon; a restarted daemon has a new token, so its page asks for the token URL.
pub fn cookie_name(addr: std::net::SocketAddr, runs_dir: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let addr = addr.to_string();
    for &b in addr
        .as_bytes()
        .iter()
        .chain(b"\0")
        .chain(runs_dir.as_os_str().as_bytes())
    {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{COOKIE_PREFIX}{}_{:08x}", addr_port(&addr), hash as u32)
}

fn addr_port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap_or("0")
}

/// The name part of a `Host` value (`[::1]:80` → `[::1]`, `a:80` → `a`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    host.split(':').next().unwrap_or(host)
}

/// The value of cookie `name`.
fn cookie<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request
        .headers
        .iter()
        .filter(|(n, _)| n == "cookie")
        .flat_map(|(_, v)| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// The token of `Authorization: Bearer <token>`; the scheme's name is compared without regard
/// to case (RFC 9110, section 11.1), and spaces may be more than one.
fn bearer(request: &Request) -> Option<&str> {
    let (scheme, token) = request.header("authorization")?.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// The request's path and query without `token`.
fn without_token(request: &Request) -> String {
    let rest: Vec<String> = request
        .query
        .iter()
        .filter(|(k, _)| k != "token")
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    if rest.is_empty() {
        request.path.clone()
    } else {
        format!("{}?{}", request.path, rest.join("&"))
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A new random token: 32 bytes from the kernel's random source, in hex.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length are those of the unfilled part of `bytes`.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::web::ROUTES;

    fn auth() -> Auth {
        Auth::new(
            "t0k".into(),
            &["box.lan".into()],
            "orchestrate_token_9_x".into(),
        )
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            query: Vec::new(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    const COOKIE_OK: (&str, &str) = ("cookie", "a=b; orchestrate_token_9_x=t0k");

    #[test]
    fn every_route_refuses_a_foreign_host_a_missing_token_and_a_foreign_origin() {
        let a = auth();
        for route in ROUTES {
            let m = route.method;
            let own = [
                ("host", "127.0.0.1:9"),
                ("origin", "http://127.0.0.1:9"),
                COOKIE_OK,
            ];
            assert_eq!(
                a.gate(&request(m, route.path, &own), Some(route)),
                Ok(Pass::Serve),
                "{route:?}"
            );
            let foreign = [
                ("host", "evil.example:9"),
                ("origin", "http://evil.example:9"),
                COOKIE_OK,
            ];
            assert_eq!(
                a.gate(&request(m, route.path, &foreign), Some(route))
                    .unwrap_err()
                    .status,
                403,
                "{route:?}"
            );
            let no_token = [("host", "localhost:9"), ("origin", "http://localhost:9")];
            assert_eq!(
                a.gate(&request(m, route.path, &no_token), Some(route))
                    .unwrap_err()
                    .status,
                401,
                "{route:?}"
            );
            let wrong = [
                ("host", "localhost:9"),
                ("cookie", "orchestrate_token_9_x=t0x"),
            ];
            assert_eq!(
                a.gate(&request(m, route.path, &wrong), Some(route))
                    .unwrap_err()
                    .status,
                401,
                "{route:?}"
            );
            if route.effect == Effect::Change {
                let cross = [
                    ("host", "localhost:9"),
                    ("origin", "http://evil.example"),
                    COOKIE_OK,
                ];
                assert_eq!(
                    a.gate(&request(m, route.path, &cross), Some(route))
                        .unwrap_err()
                        .status,
                    403,
                    "{route:?}"
                );
                let none = [("host", "localhost:9"), COOKIE_OK];
                assert_eq!(
                    a.gate(&request(m, route.path, &none), Some(route))
                        .unwrap_err()
                        .status,
                    403,
                    "{route:?}"
                );
                for other in ["GET", "PUT", "DELETE"] {
                    let r = request(other, route.path, &own);
                    assert_eq!(
                        a.gate(&r, Some(route)).unwrap_err().status,
                        405,
                        "{other} {route:?}"
                    );
                }
            } else {
                for other in ["POST", "PUT", "DELETE"] {
                    let r = request(other, route.path, &own);
                    assert_eq!(
                        a.gate(&r, Some(route)).unwrap_err().status,
                        405,
                        "{other} {route:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_token_in_the_url_becomes_a_cookie_and_leaves_the_url() {
        let a = auth();
        let mut r = request("GET", "/", &[("host", "box.lan:80")]);
        r.query = vec![("token".into(), "t0k".into()), ("x".into(), "a b".into())];
        assert_eq!(
            a.gate(&r, Some(&ROUTES[0])),
            Ok(Pass::SetCookie {
                location: "/?x=a%20b".into()
            })
        );
        r.query[0].1 = "bad".into();
        assert_eq!(a.gate(&r, Some(&ROUTES[0])).unwrap_err().status, 401);
        assert!(a.set_cookie().contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn a_bearer_token_is_accepted_and_hosts_compare_by_name() {
        let a = auth();
        let r = request(
            "GET",
            "/metrics",
            &[("host", "[::1]:8"), ("authorization", "Bearer t0k")],
        );
        assert_eq!(a.gate(&r, None), Ok(Pass::Serve));
        // The scheme's name is case-insensitive (RFC 9110), the token is not.
        for scheme in ["bearer t0k", "BEARER t0k", "bEaReR  t0k"] {
            let r = request(
                "GET",
                "/metrics",
                &[("host", "[::1]:8"), ("authorization", scheme)],
            );
            assert_eq!(a.gate(&r, None), Ok(Pass::Serve), "{scheme}");
        }
        for wrong in ["bearer T0K", "Basic t0k", "Bearert0k", "bearer", "t0k"] {
            let r = request(
                "GET",
                "/metrics",
                &[("host", "[::1]:8"), ("authorization", wrong)],
            );
            assert_eq!(a.gate(&r, None).unwrap_err().status, 401, "{wrong}");
        }
        assert!(a.host_allowed("LOCALHOST"));
        assert!(!a.host_allowed("localhost.evil.example"));
        assert!(!a.host_allowed(""));
    }

    #[test]
    fn each_daemon_has_a_cookie_of_its_own_name() {
        use std::path::Path;
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        let one = cookie_name(at("127.0.0.1:8765"), Path::new("/r"));
        assert!(one.starts_with("orchestrate_token_8765_"), "{one}");
        assert_eq!(one, cookie_name(at("127.0.0.1:8765"), Path::new("/r")));
        assert_ne!(one, cookie_name(at("127.0.0.1:8766"), Path::new("/r")));
        assert_ne!(one, cookie_name(at("127.0.0.1:8765"), Path::new("/s")));
        assert_ne!(one, cookie_name(at("[::1]:8765"), Path::new("/r")));
        // A cookie token-named for another daemon does not open this one.
        let a = auth();
        let other = request(
            "GET",
            "/",
            &[
                ("host", "localhost:9"),
                ("cookie", "orchestrate_token_8_y=t0k"),
            ],
        );
        assert_eq!(a.gate(&other, None).unwrap_err().status, 401);
        assert!(a.set_cookie().starts_with("orchestrate_token_9_x=t0k;"));
    }

    #[test]
    fn tokens_are_random_and_long() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
