//! Starting the web view: its addresses checked, its listeners bound, its token written and
//! shown, its tasks spawned.

use super::state::Web;
use super::{admission, api, auth, memory, metrics_bind};
use crate::daemon::Daemon;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Where and to whom the web view listens.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// The address to bind.
    pub addr: SocketAddr,
    /// Host names (the `Host` header) allowed beyond the loopback ones.
    pub allow_hosts: Vec<String>,
    /// A non-loopback address is allowed.
    pub remote: bool,
    /// Where `/metrics` is also served alone, without the token ([`metrics_bind`]).
    pub metrics_addr: Option<SocketAddr>,
}

/// The default address: loopback, port 8765.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8765";

/// Why the web view could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// A non-loopback address without `--http-remote`.
    #[error("--http {0}: not a loopback address; the web view listens only on loopback unless --http-remote is given too (then anyone who can reach {0} and has the token can see and cancel runs)")]
    NotLoopback(SocketAddr),
    /// Binding failed.
    #[error("--http {addr}: cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The token could not be made or written.
    #[error("cannot write the web view's token to {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A started web view; dropping it stops it.
pub struct Running {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    token_file: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.token_file);
    }
}

/// The token file beside `socket` (its path and [`protocol::web::TOKEN_FILE_SUFFIX`]).
pub fn token_file(socket: &Path) -> PathBuf {
    let mut path = socket.as_os_str().to_owned();
    path.push(protocol::web::TOKEN_FILE_SUFFIX);
    PathBuf::from(path)
}

/// Binds, writes the token file (0600) beside the daemon's socket, prints the URL, and serves.
pub fn start(daemon: Rc<Daemon>, config: &WebConfig) -> Result<Running, WebError> {
    let ip = config.addr.ip();
    for addr in std::iter::once(config.addr).chain(config.metrics_addr) {
        if !addr.ip().is_loopback() && !config.remote {
            return Err(WebError::NotLoopback(addr));
        }
    }
    let metrics_listener = config
        .metrics_addr
        .map(|addr| metrics_bind::bind(addr).map_err(|source| WebError::Bind { addr, source }))
        .transpose()?;
    let std_listener =
        std::net::TcpListener::bind(config.addr).map_err(|source| WebError::Bind {
            addr: config.addr,
            source,
        })?;
    let bind = |source| WebError::Bind {
        addr: config.addr,
        source,
    };
    admission::deepen_backlog(&std_listener).map_err(bind)?;
    std_listener.set_nonblocking(true).map_err(bind)?;
    let addr = std_listener.local_addr().map_err(bind)?;
    let listener = tokio::net::TcpListener::from_std(std_listener).map_err(bind)?;
    let path = token_file(&daemon.config.socket);
    let token = auth::new_token().map_err(|source| WebError::Token {
        path: path.clone(),
        source,
    })?;
    write_private(&path, format!("{token}\n").as_bytes()).map_err(|source| WebError::Token {
        path: path.clone(),
        source,
    })?;
    let mut hosts = config.allow_hosts.clone();
    for ip in std::iter::once(ip).chain(config.metrics_addr.map(|a| a.ip())) {
        if !ip.is_loopback() && !ip.is_unspecified() {
            hosts.push(match ip {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            });
        }
    }
    let shown = match ip {
        std::net::IpAddr::V6(v6) if v6.is_loopback() => format!("[::1]:{}", addr.port()),
        _ if ip.is_unspecified() => format!(
            "{}:{}",
            hosts.first().map(String::as_str).unwrap_or("localhost"),
            addr.port()
        ),
        _ => addr.to_string(),
    };
    if !ip.is_loopback() {
        tracing::warn!(addr = %addr, "the web view listens beyond loopback");
        eprintln!(
            "orchestrate daemon: warning: the web view listens on {addr}, beyond this machine; anyone who reaches it with the token can see and cancel runs (allowed Host names: localhost, 127.0.0.1, [::1]{})",
            hosts.iter().map(|h| format!(", {h}")).collect::<String>()
        );
    }
    eprintln!(
        "orchestrate daemon: web view at http://{shown}/?token={token} (token in {})",
        path.display()
    );
    tracing::info!(addr = %addr, token_file = %path.display(), "web view listening");
    let cookie = auth::cookie_name(addr, &daemon.config.runs_dir);
    let (memory, sampler) = memory::start(daemon.host.clone());
    let web = Rc::new(Web {
        daemon,
        auth: auth::Auth::new(token, &hosts, cookie),
        memory,
        feeds: Rc::default(),
        stage_meta: Default::default(),
    });
    let metrics_web = web.clone();
    let admission = admission::Admission::new("web view", admission::WEB);
    let accept = admission::accept_loop(listener, admission, move |stream, ticket| {
        api::serve(web.clone(), stream, ticket)
    });
    let mut tasks = vec![accept];
    if let Some((listener, addr)) = metrics_listener {
        if !addr.ip().is_loopback() {
            eprintln!("orchestrate daemon: warning: /metrics is served without the token on {addr}, beyond this machine");
        }
        eprintln!("orchestrate daemon: metrics at http://{addr}/metrics (no token; read-only)");
        tasks.push(metrics_bind::start(metrics_web, listener));
    }
    tasks.extend(sampler);
    Ok(Running {
        tasks,
        token_file: path,
    })
}

/// Writes `bytes` to a new file at `path` readable by its owner only (an old file replaced).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}
