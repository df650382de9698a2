//! Just enough HTTP/1.1 for the web view: one request per connection (every answer closes it),
//! a request head of at most [`MAX_HEAD_BYTES`] read within [`HEAD_TIMEOUT`], no request body
//! (none of the routes takes one; a body is never read), answers written within
//! [`WRITE_TIMEOUT`]. Anything else is refused with a 400 and the connection closed.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 16 << 10;
/// A request head that does not arrive in this time closes the connection (until its head
/// has come, a connection holds a place in its listener's small pending budget).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer (or one server-sent event) that cannot be written in this time closes the
/// connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed request head.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query's pairs, percent-decoded.
    pub query: Vec<(String, String)>,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first query parameter named `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// The peer closed, or timed out, before a whole head.
    #[error("no complete request")]
    Incomplete,
    /// Over [`MAX_HEAD_BYTES`].
    #[error("request head over {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    /// Not an HTTP/1.x request.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
}

/// Reads and parses one request head.
pub async fn read_head(stream: &mut TcpStream) -> Result<Request, HeadError> {
    let mut buf = Vec::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        if let Some(end) = find_end(&buf) {
            return parse_head(&buf[..end]);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        let mut chunk = [0u8; 4096];
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(HeadError::Incomplete),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Parses a request head (without its blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed("not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed("bad request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HeadError::Malformed("not HTTP/1.x"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HeadError::Malformed("bad method"));
    }
    if !target.starts_with('/') {
        return Err(HeadError::Malformed("the target is not a path"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| protocol::web::percent_decode(&s.replace('+', " "));
            match (decode(k), decode(v)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(HeadError::Malformed("bad query escape")),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(HeadError::Malformed("bad header line"));
        };
        if name.is_empty() || name.contains(' ') {
            return Err(HeadError::Malformed("bad header name"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query,
        headers,
    })
}

/// An answer.
#[derive(Debug, PartialEq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Headers beyond the fixed ones.
    pub headers: Vec<(&'static str, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Response {
    /// An answer with a body.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A plain-text answer (errors).
    pub fn text(status: u16, text: impl Into<String>) -> Response {
        let mut body = text.into();
        body.push('\n');
        Response::new(status, "text/plain; charset=utf-8", body)
    }

    /// A JSON answer.
    pub fn json(value: &impl serde::Serialize) -> Response {
        match serde_json::to_vec(value) {
            Ok(body) => Response::new(200, "application/json", body),
            Err(e) => Response::text(500, format!("cannot encode the answer: {e}")),
        }
    }

    /// Adds a header.
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The head and body as written, with the headers every answer has.
    pub fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut out = head(self.status, self.content_type, &self.headers);
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes());
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// A status line and the headers every answer has (no blank line yet).
pub fn head(status: u16, content_type: &str, extra: &[(&'static str, String)]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nConnection: close\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\nContent-Security-Policy: default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'\r\n",
        reason(status)
    );
    for (name, value) in extra {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.into_bytes()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Writes `bytes` within [`WRITE_TIMEOUT`]; `false` when the peer is gone or too slow.
pub async fn write(stream: &mut TcpStream, bytes: &[u8]) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_parses_into_path_query_and_headers() {
        let r = parse_head(
            b"GET /api/runs?state=running&q=a%20b HTTP/1.1\r\nHost: localhost:8\r\nX-A:  v ",
        )
        .unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/api/runs");
        assert_eq!(r.param("q"), Some("a b"));
        assert_eq!(r.param("state"), Some("running"));
        assert_eq!(r.header("host"), Some("localhost:8"));
        assert_eq!(r.header("x-a"), Some("v"));
    }

    #[test]
    fn malformed_heads_are_refused() {
        for bad in [
            &b"GET /x"[..],
            b"GET http://evil/ HTTP/1.1",
            b"get / HTTP/1.1",
            b"GET / HTTP/2",
            b"GET / HTTP/1.1\r\nno colon",
            b"GET /?a=%zz HTTP/1.1",
        ] {
            assert!(parse_head(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn every_answer_closes_and_forbids_framing() {
        let bytes = Response::text(404, "no").encode(false);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(text.contains("Connection: close\r\n"));
        assert!(text.contains("frame-ancestors 'none'"));
        assert!(text.ends_with("\r\n\r\nno\n"));
    }
}
