//! What a client can take from the web view's listeners (issue 43, items 5, 6 and 11): idle
//! connections without the token cannot lock the owner out of the view, a scrape out of
//! `--metrics-addr`, nor the socket's clients out of the daemon; each daemon's login cookie
//! has a name of its own; the `Authorization` scheme is read in any case.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::http::{self, free_port};
use e2e_tests::idle_flood::{self, IdleFlood, NOBODY};
use e2e_tests::{wait_for, Scratch};
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

/// Idle connections opened to each listener: more than the old shared cap of 1,024.
const IDLE_PER_LISTENER: usize = 1100;
/// How long the owner keeps asking under the flood: longer than a request head may take.
const HOLD: Duration = Duration::from_secs(7);

/// A daemon with the web view (and `/metrics` alone on a second address when `metrics`).
struct WebDaemon {
    d: TestDaemon,
    addr: String,
    metrics: Option<String>,
    token: String,
}

fn start(dir: &Path, metrics: bool) -> WebDaemon {
    std::fs::create_dir_all(dir).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let metrics = metrics.then(|| format!("127.0.0.1:{}", free_port()));
    let mut args = vec!["--http", &addr];
    if let Some(m) = &metrics {
        args.extend(["--metrics-addr", m]);
    }
    let d = TestDaemon::start_in_with(dir, "5s", &args, &[]);
    let token = std::fs::read_to_string(dir.join("sock/d.sock.web-token"))
        .expect("the token file")
        .trim()
        .to_string();
    WebDaemon {
        d,
        addr,
        metrics,
        token,
    }
}

impl WebDaemon {
    /// Logs in as a browser does (the token URL); the cookie it sets, `name=value`, and the
    /// whole `Set-Cookie` header.
    fn login(&self) -> (String, String) {
        let answer = http::get(&self.addr, &format!("/?token={}", self.token), &[]);
        assert_eq!(answer.status, 303, "{}", answer.text());
        let set = answer.header("set-cookie").expect("a cookie").to_string();
        let pair = set.split(';').next().unwrap().trim().to_string();
        (pair, set)
    }
}

/// The soft and hard "Max open files" of process `pid`.
fn nofile_of(pid: i32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line")
        .to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Sets this process's soft limit on open files (the daemon started next inherits it).
fn set_soft_nofile(soft: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a pointer to a live rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// A request that must be answered within a few seconds, however the listener is loaded.
fn answered_soon(addr: &str, path: &str, headers: &[(&str, &str)]) -> http::Answer {
    let started = Instant::now();
    let answer = http::request(addr, "GET", path, headers, b"", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("GET http://{addr}{path} under the flood: {e}"));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "GET http://{addr}{path} took {:?}",
        started.elapsed()
    );
    answer
}

#[test]
fn idle_connections_without_the_token_lock_out_neither_the_owner_nor_a_scrape_nor_the_socket() {
    let s = Scratch::new("web-idle-flood");
    idle_flood::raise_nofile();
    let w = start(s.path(), true);
    let pid = w.d.pid();
    let metrics = w.metrics.clone().unwrap();
    let targets: Vec<SocketAddrV4> = [&w.addr, &metrics]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let flood = IdleFlood::start(&targets, IDLE_PER_LISTENER);
    if nix::unistd::geteuid().is_root() {
        assert_eq!(
            flood.uid, NOBODY,
            "the idle connections come from another user"
        );
    }
    assert!(
        flood.connected as usize >= 2 * IDLE_PER_LISTENER - 10,
        "the flood connected {} times",
        flood.connected
    );
    // The owner, a scrape, and a socket client are all answered while the flood holds on,
    // for longer than a request head may take (the flood opens again what the daemon closes).
    let bearer = format!("Bearer {}", w.token);
    let (cookie, _) = w.login();
    let until = Instant::now() + HOLD;
    let mut rounds = 0;
    while Instant::now() < until {
        let runs = answered_soon(&w.addr, "/api/runs", &[("Authorization", &bearer)]);
        assert_eq!(runs.status, 200, "round {rounds}: {}", runs.text());
        let page = answered_soon(&w.addr, "/", &[("Cookie", &cookie)]);
        assert_eq!(page.status, 200, "round {rounds}: {}", page.text());
        let scrape = answered_soon(&metrics, "/metrics", &[]);
        assert_eq!(scrape.status, 200, "round {rounds}: {}", scrape.text());
        assert!(scrape.text().contains("orchestrate_runs"));
        let asked = Instant::now();
        let listed = w.d.connect().call_within(
            serde_json::json!({"v": 1, "type": "list"}),
            Duration::from_secs(5),
        );
        assert_eq!(listed["type"], "runs", "round {rounds}: {listed}");
        assert!(
            asked.elapsed() < Duration::from_secs(8),
            "round {rounds}: the socket answered in {:?}",
            asked.elapsed()
        );
        rounds += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut c = w.d.connect();
    let id = c.submit_toml(
        "[run]\nname = \"f\"\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
        s.path(),
    );
    assert_eq!(c.wait(&id)["state"], "succeeded");
    // What the flood holds in the daemon is the small pending budgets, not 2,200 descriptors.
    assert!(
        wait_for(Duration::from_secs(5), || open_descriptors(pid) < 400),
        "the daemon holds {} descriptors under the flood",
        open_descriptors(pid)
    );
    let log = w.d.log();
    for listener in ["web view", "metrics address"] {
        assert!(
            log.contains(&format!(
                "{listener}: 64 connections without a complete request"
            )),
            "{listener} dropped its oldest pending connections: {log}"
        );
    }
    drop(flood);
}

#[test]
fn the_daemon_raises_its_soft_open_files_limit() {
    let s = Scratch::new("web-nofile");
    // The daemon starts with the soft limit many systems give (1,024) and raises it itself.
    set_soft_nofile(1024);
    let w = start(s.path(), false);
    let (soft, hard) = nofile_of(w.d.pid());
    assert_eq!(soft, hard, "the daemon raised its soft open files limit");
    if hard != "1024" {
        assert!(
            w.d.log().contains(&format!("raised from 1024 to {hard}")),
            "the daemon logs the limit it raised: {}",
            w.d.log()
        );
    }
}

#[test]
fn two_daemons_keep_their_own_logins() {
    let s = Scratch::new("web-two-cookies");
    let one = start(&s.path().join("one"), false);
    let two = start(&s.path().join("two"), false);
    let (first, set_first) = one.login();
    let (second, set_second) = two.login();
    for set in [&set_first, &set_second] {
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"),
            "{set}"
        );
        assert!(!set.contains("Domain"), "a host-only cookie: {set}");
    }
    let name = |pair: &str| pair.split('=').next().unwrap().to_string();
    assert_ne!(
        name(&first),
        name(&second),
        "each daemon's cookie has its own name"
    );
    // A browser keeps cookies per host name, not per port: both logins sit in one jar and
    // every request to 127.0.0.1 carries both; each daemon finds its own.
    let jar = format!("{first}; {second}");
    for w in [&one, &two] {
        let answer = http::get(&w.addr, "/api/runs", &[("Cookie", &jar)]);
        assert_eq!(answer.status, 200, "{}: {}", w.addr, answer.text());
    }
    // And one daemon's cookie does not open the other.
    assert_eq!(
        http::get(&two.addr, "/api/runs", &[("Cookie", &first)]).status,
        401
    );
}

#[test]
fn the_authorization_scheme_is_read_in_any_case() {
    let s = Scratch::new("web-bearer-case");
    let w = start(s.path(), false);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let value = format!("{scheme} {}", w.token);
        let answer = http::get(&w.addr, "/api/runs", &[("Authorization", &value)]);
        assert_eq!(answer.status, 200, "{scheme}: {}", answer.text());
    }
    let wrong = format!("bearer {}x", w.token);
    assert_eq!(
        http::get(&w.addr, "/api/runs", &[("Authorization", &wrong)]).status,
        401
    );
}
