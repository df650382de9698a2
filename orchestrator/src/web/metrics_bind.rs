//! `--metrics-addr ADDR`: `/metrics` alone, on an address of its own, for a Prometheus that
//! holds no token. It answers `GET` and `HEAD /metrics` (the same text as the web view's
//! `/metrics`) and nothing else: every other path is 404 and every other method on
//! `/metrics` 405, so nothing there reads a run or changes one. The `Host` allowlist of the
//! web view applies (a page elsewhere cannot read it by rebinding its DNS name); the address
//! is loopback unless `--http-remote` is given.

use super::admission;
use super::api::metrics;
use super::conn::{self, Seat};
use super::http::{Request, Response};
use super::state::Web;
use std::net::SocketAddr;
use std::rc::Rc;
use tokio::net::{TcpListener, TcpStream};

/// Binds `addr` (a free port when it is 0); the listener and the address bound.
pub fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(addr)?;
    admission::deepen_backlog(&listener)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    Ok((TcpListener::from_std(listener)?, bound))
}

/// Serves `listener` until dropped, with budgets of its own ([`admission::METRICS`]): a
/// connection is admitted once it has sent a complete request for `/metrics` that passes the
/// `Host` check, so idle or partial connections cannot keep a scrape out.
pub fn start(web: Rc<Web>, listener: TcpListener) -> tokio::task::JoinHandle<()> {
    let admission = admission::Admission::new("metrics address", admission::METRICS);
    admission::accept_loop(listener, admission, move |stream, ticket| {
        serve(web.clone(), stream, ticket)
    })
}

/// One connection, request after request (see [`super::conn`]).
async fn serve(web: Rc<Web>, stream: TcpStream, ticket: admission::Ticket) {
    conn::serve(stream, ticket, move |request, seat| {
        let web = web.clone();
        async move { answer(&web, &request, &seat) }
    })
    .await
}

/// The answer to `request`: `/metrics` for an allowed `Host`, a refusal for anything else.
fn answer(web: &Web, request: &Request, seat: &Seat) -> Response {
    let host = request.header("host").unwrap_or("");
    if !web.auth.host_allowed(host) {
        Response::text(
            403,
            format!("Host {host:?} is not one this server answers to"),
        )
    } else if request.path != "/metrics" {
        Response::text(404, "only /metrics is served here")
    } else if request.method != "GET" && request.method != "HEAD" {
        Response::text(405, "/metrics answers GET and HEAD")
    } else if !seat.admit() {
        Response::text(503, "busy: too many scrapes at once; try again").closing()
    } else {
        metrics(web)
    }
}
