//! `--metrics-addr ADDR`: `/metrics` alone, on an address of its own, for a Prometheus that
//! holds no token. It answers `GET` and `HEAD /metrics` (the same text as the web view's
//! `/metrics`) and nothing else: every other path is 404 and every other method on
//! `/metrics` 405, so nothing there reads a run or changes one. The `Host` allowlist of the
//! web view applies (a page elsewhere cannot read it by rebinding its DNS name); the address
//! is loopback unless `--http-remote` is given.

use super::admission;
use super::api::metrics;
use super::http::{self, Response};
use super::Web;
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
        let web = web.clone();
        async move { serve(&web, stream, ticket).await }
    })
}

/// One connection: one request, then close.
async fn serve(web: &Web, mut stream: TcpStream, mut ticket: admission::Ticket) {
    let answer = match http::read_head(&mut stream).await {
        Err(http::HeadError::Incomplete) => return,
        Err(e) => Response::text(400, e.to_string()),
        Ok(request) => {
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
            } else if !ticket.admit() {
                Response::text(503, "busy: too many scrapes at once; try again")
            } else {
                let answer = metrics(web);
                let head_only = request.method == "HEAD";
                let _ = http::write(&mut stream, &answer.encode(head_only)).await;
                return;
            }
        }
    };
    let _ = http::write(&mut stream, &answer.encode(false)).await;
}
