//! A small blocking HTTP/1.1 client for the tests of the daemon's web view and of the programs
//! they drive (Prometheus' API, chromedriver): one request per connection (`Connection: close`),
//! the answer read to the end (or `Content-Length`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// A free TCP port on loopback (bound and let go: another program may take it first, rarely).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Sends `method path` to `addr` with `headers` (a `Host` one is added when missing) and
/// `body`; the answer, or the I/O error. Reads for at most `limit`.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    limit: Duration,
) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(limit))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "DELETE" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16384];
    let mut expected: Option<usize> = None;
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if raw.is_empty() => return Err(e),
            Err(_) => break,
        };
        raw.extend_from_slice(&chunk[..n]);
        if expected.is_none() {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                expected = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .map(|len| end + 4 + len);
            }
        }
        if expected.is_some_and(|e| raw.len() >= e) {
            break;
        }
    }
    parse(&raw)
}

fn parse(raw: &[u8]) -> std::io::Result<Answer> {
    let bad = |what: &str| std::io::Error::other(format!("bad HTTP answer: {what}"));
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    if chunked {
        body = unchunk(&body);
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn unchunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = body.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&body[..nl]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = nl + 2;
        out.extend_from_slice(&body[start..(start + size).min(body.len())]);
        body = &body[(start + size + 2).min(body.len())..];
    }
    out
}

/// `GET path` with `headers`, within 30 s; panics when nothing answers.
pub fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    request(addr, "GET", path, headers, b"", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// A JSON request (chromedriver's, Prometheus'); the answer's JSON.
pub fn json(addr: &str, method: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let headers = [("Content-Type", "application/json")];
    request(
        addr,
        method,
        path,
        &headers,
        &bytes,
        Duration::from_secs(120),
    )
    .unwrap_or_else(|e| panic!("{method} http://{addr}{path}: {e}"))
    .json()
}

/// One kept-alive connection: requests sent one after another on it, each answer read by its
/// `Content-Length` (so the connection stays open for the next).
pub struct KeptAlive {
    stream: TcpStream,
    addr: String,
}

impl KeptAlive {
    /// Connects to `addr`; each read waits at most `limit`.
    pub fn connect(addr: &str, limit: Duration) -> std::io::Result<KeptAlive> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(limit))?;
        Ok(KeptAlive {
            stream,
            addr: addr.to_string(),
        })
    }

    /// Sends `GET path` with `headers` (and `Host`), reads its answer; an error when the
    /// connection was closed instead.
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Answer> {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes())?;
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            if self.stream.read(&mut byte)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection instead of answering",
                ));
            }
            raw.push(byte[0]);
        }
        let length = String::from_utf8_lossy(&raw)
            .to_ascii_lowercase()
            .lines()
            .find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| std::io::Error::other("an answer without Content-Length"))?;
        let start = raw.len();
        raw.resize(start + length, 0);
        self.stream.read_exact(&mut raw[start..])?;
        parse(&raw)
    }
}
