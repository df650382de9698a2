//! `--metrics-addr ADDR`: `/metrics` alone, on an address of its own, for a Prometheus that
//! holds no token. It answers `GET` and `HEAD /metrics` (the same text as the web view's
//! `/metrics`) and nothing else: every other path is 404 and every other method on
//! `/metrics` 405, so nothing there reads a run or changes one. The `Host` allowlist of the
//! web view applies (a page elsewhere cannot read it by rebinding its DNS name); the address
//! is loopback unless `--http-remote` is given.

use super::api::metrics;
use super::http::{self, Response};
use super::Web;
use std::net::SocketAddr;
use std::rc::Rc;
use tokio::net::{TcpListener, TcpStream};

/// Binds `addr` (a free port when it is 0); the listener and the address bound.
pub fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    Ok((TcpListener::from_std(listener)?, bound))
}

/// Serves `listener` until dropped (at most [`super::MAX_CONNECTIONS`] connections at once,
/// counted with the web view's).
pub fn start(web: Rc<Web>, listener: TcpListener) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if web.open.get() >= super::MAX_CONNECTIONS {
                        continue;
                    }
                    let web = web.clone();
                    web.open.set(web.open.get() + 1);
                    tokio::task::spawn_local(async move {
                        serve(&web, stream).await;
                        web.open.set(web.open.get() - 1);
                    });
                }
                Err(e) => {
                    tracing::warn!("metrics address: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// One connection: one request, then close.
async fn serve(web: &Web, mut stream: TcpStream) {
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
