//! What the web view's routes see of HTTP: a [`Request`] (hyper parsed it; this is the view
//! the checks and routes read, its query percent-decoded) and a [`Response`] (a whole body, or
//! an event stream fed through an [`EventSink`]), with the headers every answer carries. The
//! limits of the protocol itself (head size, timeouts, keep-alive) are set where connections
//! are served, in the `conn` module.

use bytes::Buf;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// The largest request head (request line and headers) read; a larger one is answered 431.
pub const MAX_HEAD_BYTES: usize = 16 << 10;
/// The largest request body read (no route takes one; a larger one is answered 413).
pub const MAX_BODY_BYTES: usize = 16 << 10;
/// A request head that does not arrive in this time closes the connection: a new
/// connection's first head (until it has come, a connection holds a place in its listener's
/// small pending budget), and the next head on a kept-alive connection (so an idle one goes).
/// A request body has as long again.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer (or one server-sent event) whose writing makes no progress for this long closes
/// the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A request as the checks and routes read it.
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

/// Why a request is refused before any route sees it (answered 400, the connection closed).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a request a route can take.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
}

/// The view of hyper's request head: only origin-form targets (a path), upper-case methods,
/// UTF-8 header values and a query that decodes.
pub fn view(head: &hyper::http::request::Parts) -> Result<Request, RequestError> {
    let method = head.method.as_str();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(RequestError::Malformed("bad method"));
    }
    let uri = &head.uri;
    if uri.scheme().is_some() || uri.authority().is_some() || !uri.path().starts_with('/') {
        return Err(RequestError::Malformed("the target is not a path"));
    }
    let query = decode_query(uri.query().unwrap_or(""))?;
    let headers = head
        .headers
        .iter()
        .map(|(name, value)| {
            let value = std::str::from_utf8(value.as_bytes())
                .map_err(|_| RequestError::Malformed("a header value is not UTF-8"))?;
            Ok((name.as_str().to_string(), value.trim().to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Request {
        method: method.to_string(),
        path: uri.path().to_string(),
        query,
        headers,
    })
}

/// A query's pairs, `+` as a space and percent escapes decoded.
pub fn decode_query(query: &str) -> Result<Vec<(String, String)>, RequestError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| protocol::web::percent_decode(&s.replace('+', " "));
            match (decode(k), decode(v)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(RequestError::Malformed("bad query escape")),
            }
        })
        .collect()
}

/// An answer.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Headers beyond the fixed ones.
    pub headers: Vec<(&'static str, String)>,
    /// Body (empty for an event stream).
    pub body: Vec<u8>,
    /// An event stream's frames, as its producer sends them.
    pub stream: Option<mpsc::Receiver<Chunk>>,
    /// The connection closes after this answer.
    pub close: bool,
}

impl PartialEq for Response {
    fn eq(&self, other: &Response) -> bool {
        (
            self.status,
            self.content_type,
            &self.headers,
            &self.body,
            self.close,
        ) == (
            other.status,
            other.content_type,
            &other.headers,
            &other.body,
            other.close,
        ) && self.stream.is_none() == other.stream.is_none()
    }
}

impl Response {
    /// An answer with a body.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
            stream: None,
            close: false,
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

    /// The same answer, and the connection closed after it.
    pub fn closing(mut self) -> Response {
        self.close = true;
        self
    }

    /// The answer as hyper writes it, with the headers every answer has.
    pub fn into_hyper(self) -> hyper::Response<Payload> {
        let mut builder = hyper::Response::builder()
            .status(self.status)
            .header("Content-Type", self.content_type);
        for (name, value) in FIXED_HEADERS {
            builder = builder.header(name, value);
        }
        for (name, value) in &self.headers {
            builder = builder.header(*name, value);
        }
        if self.close {
            builder = builder.header("Connection", "close");
        }
        let payload = match self.stream {
            Some(frames) => Payload::Stream(frames),
            None => Payload::Whole(Some(Chunk::from(self.body))),
        };
        builder.body(payload).unwrap_or_else(|e| {
            let mut fallback = hyper::Response::new(Payload::Whole(Some(Chunk::from(
                format!("cannot write the answer: {e}\n").into_bytes(),
            ))));
            *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            fallback
        })
    }
}

/// Headers every answer has: nothing cached, sniffed, framed or referred.
const FIXED_HEADERS: [(&str, &str); 5] = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    ),
];

/// Frames an event stream holds before its producer waits for the connection to take them.
const STREAM_QUEUE: usize = 1;

/// Where an event stream's producer sends its frames.
pub struct EventSink(mpsc::Sender<Chunk>);

impl EventSink {
    /// Sends `bytes` once the connection has taken what came before; `false` when the
    /// connection is gone (its peer left, or stopped reading for [`WRITE_TIMEOUT`]).
    pub async fn send(&self, bytes: impl Into<Chunk>) -> bool {
        self.0.send(bytes.into()).await.is_ok()
    }
}

/// A `200 text/event-stream` answer and the sink its frames go into; the answer ends when
/// the sink is dropped.
pub fn event_stream() -> (EventSink, Response) {
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let mut response = Response::new(200, "text/event-stream", Vec::new());
    response.stream = Some(rx);
    (EventSink(tx), response)
}

/// Bytes written as they are: shared (an event batch written to every page is encoded once)
/// or owned.
#[derive(Debug, Clone)]
pub struct Chunk {
    bytes: Rc<[u8]>,
    at: usize,
}

impl From<Rc<[u8]>> for Chunk {
    fn from(bytes: Rc<[u8]>) -> Chunk {
        Chunk { bytes, at: 0 }
    }
}

impl From<Vec<u8>> for Chunk {
    fn from(bytes: Vec<u8>) -> Chunk {
        Chunk::from(Rc::<[u8]>::from(bytes))
    }
}

impl From<&'static [u8]> for Chunk {
    fn from(bytes: &'static [u8]) -> Chunk {
        Chunk::from(Rc::<[u8]>::from(bytes))
    }
}

impl Buf for Chunk {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes[self.at..]
    }

    fn advance(&mut self, n: usize) {
        self.at = (self.at + n).min(self.bytes.len());
    }
}

/// An answer's body: whole (its length known, so it is sent with `Content-Length`), or an
/// event stream's frames as they come.
pub enum Payload {
    /// A whole body, until taken.
    Whole(Option<Chunk>),
    /// An event stream.
    Stream(mpsc::Receiver<Chunk>),
}

impl Body for Payload {
    type Data = Chunk;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Chunk>, Infallible>>> {
        match self.get_mut() {
            Payload::Whole(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Payload::Stream(frames) => frames.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Payload::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Payload::Whole(body) => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.remaining() as u64))
            }
            Payload::Stream(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(target: &str, method: &str, headers: &[(&str, &[u8])]) -> hyper::http::request::Parts {
        let mut builder = hyper::Request::builder().method(method).uri(target);
        for (n, v) in headers {
            builder = builder.header(*n, *v);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_head_is_read_into_path_query_and_headers() {
        let r = view(&parts(
            "/api/runs?state=running&q=a%20b",
            "GET",
            &[("Host", b"localhost:8"), ("X-A", b"v")],
        ))
        .unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/api/runs");
        assert_eq!(r.param("q"), Some("a b"));
        assert_eq!(r.param("state"), Some("running"));
        assert_eq!(r.header("host"), Some("localhost:8"));
        assert_eq!(r.header("x-a"), Some("v"));
    }

    #[test]
    fn requests_no_route_can_take_are_refused() {
        assert!(view(&parts("http://evil/", "GET", &[])).is_err());
        assert!(view(&parts("/", "get", &[])).is_err());
        assert!(view(&parts("/?a=%zz", "GET", &[])).is_err());
        assert!(view(&parts("/", "GET", &[("x", b"\xff")])).is_err());
    }

    #[test]
    fn every_answer_forbids_framing_and_a_refusal_can_close() {
        let answer = Response::text(404, "no").closing().into_hyper();
        assert_eq!(answer.status(), 404);
        let h = answer.headers();
        assert!(h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'"));
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["connection"], "close");
        assert_eq!(answer.body().size_hint().exact(), Some(3));
    }
}
