//! One connection of a web listener, served by hyper's HTTP/1.1 with keep-alive and these
//! limits: a request head of at most [`MAX_HEAD_BYTES`] (else 431) that arrives within
//! [`HEAD_TIMEOUT`] (a new connection's first, and the next on a kept-alive one; else the
//! connection closes), a body of at most [`MAX_BODY_BYTES`] (else 413), writes that make
//! progress at least every [`WRITE_TIMEOUT`] (else the connection closes). Each request is
//! turned into the routes' [`Request`] (400 and close when it is not one they can take) and
//! handed with the connection's [`Seat`] to the listener's handler.

use super::admission::Ticket;
use super::http::{
    self, Request, Response, HEAD_TIMEOUT, MAX_BODY_BYTES, MAX_HEAD_BYTES, WRITE_TIMEOUT,
};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// A connection's place in its listener's budgets, shared by its requests.
#[derive(Clone)]
pub struct Seat(Rc<RefCell<Ticket>>);

impl Seat {
    /// Moves the connection to the admitted budget (once; it stays there for its life);
    /// `false` when that budget is full.
    pub fn admit(&self) -> bool {
        self.0.borrow_mut().admit()
    }
}

/// Serves `stream` until the peer closes it, a limit closes it, or its task is aborted (the
/// listener dropping it for a newer one): each request is answered by `handle`.
pub async fn serve<H, Fut>(stream: TcpStream, ticket: Ticket, handle: H)
where
    H: Fn(Request, Seat) -> Fut + 'static,
    Fut: Future<Output = Response> + 'static,
{
    let seat = Seat(Rc::new(RefCell::new(ticket)));
    let handle = Rc::new(handle);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let (handle, seat) = (handle.clone(), seat.clone());
        async move {
            let answer = match read(request).await {
                Ok(request) => handle(request, seat).await,
                Err(refused) => refused,
            };
            Ok::<_, std::convert::Infallible>(answer.into_hyper())
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let io = TokioIo::new(WriteDeadline::new(stream));
    if let Err(e) = builder.serve_connection(io, service).await {
        tracing::debug!("web connection ended: {e}");
    }
}

/// The routes' view of `request`, its body read (and dropped: no route takes one); the
/// refusal to send instead when it is not one they can take.
async fn read(request: hyper::Request<Incoming>) -> Result<Request, Response> {
    let (head, body) = request.into_parts();
    let view = http::view(&head).map_err(|e| Response::text(400, e.to_string()).closing())?;
    if hyper::body::Body::is_end_stream(&body) {
        return Ok(view);
    }
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match tokio::time::timeout(HEAD_TIMEOUT, limited.collect()).await {
        Ok(Ok(_)) => Ok(view),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Response::text(
            413,
            format!("request body over {MAX_BODY_BYTES} bytes: no route takes a body"),
        )
        .closing()),
        Ok(Err(_)) | Err(_) => Err(Response::text(400, "incomplete request body").closing()),
    }
}

/// A stream whose writes fail (so hyper closes the connection) once one has made no
/// progress for [`WRITE_TIMEOUT`]: a peer that stops reading holds its connection that long.
struct WriteDeadline {
    stream: TcpStream,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteDeadline {
    fn new(stream: TcpStream) -> WriteDeadline {
        WriteDeadline {
            stream,
            stalled: None,
        }
    }

    /// `poll`'s outcome, or the timeout's error once a run of `Pending`s has lasted
    /// [`WRITE_TIMEOUT`].
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took nothing written for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::super::admission::{Admission, Budgets};
    use super::*;
    use std::io::{Read, Write};

    /// Reads one answer with a `Content-Length` from `stream`: its head and body.
    fn answer(stream: &mut std::net::TcpStream) -> (String, String) {
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "the connection closed");
            raw.push(byte[0]);
        }
        let head = String::from_utf8(raw).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).unwrap();
        (head, String::from_utf8(body).unwrap())
    }

    #[test]
    fn two_requests_are_answered_on_one_connection_and_a_bad_one_closes_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            let mut bodies = Vec::new();
            for path in ["/one", "/two?x=a+b"] {
                write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
                let (head, body) = answer(&mut s);
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                bodies.push(body);
            }
            s.write_all(b"GET http://evil/ HTTP/1.1\r\nHost: evil\r\n\r\n")
                .unwrap();
            let (head, _) = answer(&mut s);
            assert!(head.starts_with("HTTP/1.1 400"), "{head}");
            assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "closed after a refusal");
            bodies
        });
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            let admission = Admission::new(
                "test",
                Budgets {
                    pending: 2,
                    admitted: 2,
                },
            );
            let (stream, _) = listener.accept().await.unwrap();
            serve(
                stream,
                admission.arrive(),
                |request: Request, seat: Seat| async move {
                    assert!(seat.admit());
                    let q = request.param("x").unwrap_or("").to_string();
                    Response::text(200, format!("{}{q}", request.path))
                },
            )
            .await;
            assert_eq!(admission.counts(), (0, 0), "the connection's seat is freed");
        });
        assert_eq!(client.join().unwrap(), ["/one\n", "/twoa b\n"]);
    }
}
