//! The daemon's web view (`orchestrate daemon --http`, issue 33): every route of
//! [`protocol::web::ROUTES`] behind the token, the Host allowlist and the Origin check; the
//! token URL exchanged for a cookie; `/metrics` checked by `promtool` and scraped by a real
//! Prometheus; the page driven in a real headless Chromium through chromedriver.
//!
//! promtool, prometheus, chromium and chromedriver come from Debian's `prometheus`, `chromium`
//! and `chromium-driver` (scripts/test installs them); without them the tests that need them
//! fail under CI (`CI` set) and are skipped elsewhere, saying so.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::http::{self, free_port};
use e2e_tests::{have, wait_for, Scratch};
use protocol::web::{Effect, ROUTES};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A daemon with the web view on a free loopback port, and 2 stand-in GPUs.
struct WebDaemon {
    d: TestDaemon,
    addr: String,
    token: String,
}

fn start(s: &Scratch) -> WebDaemon {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let fake = s.path().join("fake-gpus");
    std::fs::create_dir_all(&fake).unwrap();
    // A test holds its socket connection across a browser's waits, which on a loaded machine
    // outlasted a 5 s idle timeout (CI of 954dd38).
    let d = TestDaemon::start_in_with(
        s.path(),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &["--http", &addr],
        &[
            ("ORCHESTRATE_FAKE_GPUS", "2"),
            ("ORCHESTRATE_FAKE_GPU_DIR", fake.to_str().unwrap()),
        ],
    );
    let token_file = s.path().join("sock/d.sock.web-token");
    let token = std::fs::read_to_string(&token_file)
        .expect("the token file is beside the socket")
        .trim()
        .to_string();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is the owner's only");
    assert!(
        d.log().contains(&format!("http://{addr}/?token={token}")),
        "the token URL is printed: {}",
        d.log()
    );
    WebDaemon { d, addr, token }
}

impl WebDaemon {
    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// Logs in with the token URL, as a browser does: the cookie it sets (`name=value`; the
    /// name is this daemon's own).
    fn login(&self) -> String {
        let answer = http::get(&self.addr, &format!("/?token={}", self.token), &[]);
        assert_eq!(answer.status, 303, "{}", answer.text());
        let set = answer.header("set-cookie").expect("a cookie");
        set.split(';').next().unwrap().trim().to_string()
    }

    fn get(&self, path: &str) -> http::Answer {
        let bearer = self.bearer();
        http::get(&self.addr, path, &[("Authorization", &bearer)])
    }
}

/// A stage that takes `GiB` GiB on its stand-in GPU, step by step, reports progress and loss,
/// writes a line to its stderr per step, then gives the memory back.
fn talker(s: &Scratch) -> PathBuf {
    s.write(
        "talk.py",
        "import json, os, socket, sys, time\n\
         steps, pause, fake = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n\
         gpu = os.environ.get('ORCHESTRATE_GPU_UUIDS', '').split(',')[0]\n\
         hold = os.path.join(fake, gpu) if gpu else None\n\
         c = socket.socket(socket.AF_UNIX); c.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         for i in range(1, steps + 1):\n\
         \x20   if hold: open(hold, 'w').write(f'{os.getpid()} python {i << 30}\\n')\n\
         \x20   c.sendall((json.dumps({'v': 1, 'event': 'progress', 'step': i, 'total_steps': steps, 'loss': 3.0 / i}) + '\\n').encode())\n\
         \x20   print(f'step {i} of {steps}', file=sys.stderr, flush=True)\n\
         \x20   time.sleep(pause)\n\
         if hold: os.remove(hold)\n\
         c.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': {'final_loss': 3.0 / steps}}) + '\\n').encode())\n",
    )
}

fn gpu_plan(s: &Scratch, name: &str, steps: u32, pause: f64) -> String {
    let talk = talker(s);
    let fake = s.path().join("fake-gpus");
    format!(
        "[run]\nname = \"{name}\"\n[[stage]]\nname = \"train\"\ngpus = 1\ncommand = [\"python3\", \"{}\", \"{steps}\", \"{pause}\", \"{}\"]\n",
        talk.display(),
        fake.display()
    )
}

/// The path of `route` with its parameters filled in.
fn path_of(route: &protocol::web::Route, id: &str, stage: &str) -> String {
    route.path.replace("{id}", id).replace("{stage}", stage)
}

#[test]
fn every_route_needs_the_token_an_allowed_host_and_for_a_change_its_own_origin() {
    let s = Scratch::new("web-routes");
    let w = start(&s);
    let mut c = w.d.connect();
    let id = c.submit_toml(
        "[run]\nname = \"r\"\n[[stage]]\nname = \"a\"\ncommand = [\"sh\", \"-c\", \"echo out; echo err >&2\"]\n",
        s.path(),
    );
    assert_eq!(c.wait(&id)["state"], "succeeded");
    let cookie = w.login();
    let own_origin = format!("http://{}", w.addr);
    for route in ROUTES {
        let path = path_of(route, &id, "a");
        let m = route.method;
        // The runs list's stream does not end: its head is enough.
        let limit = Duration::from_secs(if route.name == "runs_events" { 2 } else { 30 });
        let send = |headers: &[(&str, &str)]| {
            http::request(&w.addr, m, &path, headers, b"", limit)
                .unwrap_or_else(|e| panic!("{m} {path}: {e}"))
        };
        let what = format!("{m} {path}");
        // No token.
        assert_eq!(send(&[("Origin", &own_origin)]).status, 401, "{what}");
        let wrong = format!("{cookie}x");
        assert_eq!(
            send(&[("Cookie", &wrong), ("Origin", &own_origin)]).status,
            401,
            "{what}"
        );
        // A foreign Host, as a DNS-rebinding page would send, with the token.
        let foreign = send(&[("Host", "attacker.example:80"), ("Cookie", &cookie)]);
        assert_eq!(foreign.status, 403, "{what}");
        if route.effect == Effect::Change {
            let cross = send(&[("Cookie", &cookie), ("Origin", "http://attacker.example")]);
            assert_eq!(cross.status, 403, "{what}: a cross-origin change");
            assert_eq!(
                send(&[("Cookie", &cookie)]).status,
                403,
                "{what}: no Origin"
            );
            let get = http::request(
                &w.addr,
                "GET",
                &path,
                &[("Cookie", &cookie)],
                b"",
                Duration::from_secs(30),
            )
            .unwrap();
            assert_eq!(get.status, 405, "{what}: as a GET");
            // With everything right the change is made (the run has finished: 409).
            assert_eq!(
                send(&[("Cookie", &cookie), ("Origin", &own_origin)]).status,
                409,
                "{what}"
            );
        } else {
            let ok = send(&[("Cookie", &cookie)]);
            assert_eq!(ok.status, 200, "{what}: {}", ok.text());
            for other in ["POST", "DELETE"] {
                let a = http::request(
                    &w.addr,
                    other,
                    &path,
                    &[("Cookie", &cookie), ("Origin", &own_origin)],
                    b"",
                    limit,
                )
                .unwrap();
                assert_eq!(a.status, 405, "{other} {path}");
            }
        }
    }
    // A path no route has is behind the token too.
    assert_eq!(http::get(&w.addr, "/nothing", &[]).status, 401);
    assert_eq!(
        http::get(&w.addr, "/nothing", &[("Cookie", &cookie)]).status,
        404
    );
    // The token URL sets the cookie and drops the token from the address.
    let exchanged = http::get(&w.addr, &format!("/?token={}", w.token), &[]);
    assert_eq!(exchanged.status, 303);
    assert_eq!(exchanged.header("location"), Some("/"));
    let set = exchanged.header("set-cookie").unwrap();
    assert!(
        set.starts_with(&cookie) && set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    // A log name cannot leave the stage's directory.
    let escape = w.get(&format!(
        "/api/runs/{id}/stages/..%2F..%2Fsubmission.json/log"
    ));
    assert_eq!(escape.status, 404, "{}", escape.text());
    let dots = w.get(&format!("/api/runs/{id}/stages/../log"));
    assert_eq!(dots.status, 400, "{}", dots.text());
    assert_eq!(
        w.get(&format!("/api/runs/{id}/stages/a/log?stream=stdout"))
            .text()
            .trim(),
        "out"
    );
}

#[test]
fn cancel_from_the_page_stops_a_running_run() {
    let s = Scratch::new("web-cancel");
    let w = start(&s);
    let mut c = w.d.connect();
    let id = c.submit_toml(
        "[[stage]]\nname = \"long\"\ncommand = [\"sleep\", \"60\"]\n",
        s.path(),
    );
    assert!(wait_for(Duration::from_secs(20), || w
        .get("/api/runs")
        .json()["runs"][0]["info"]["running"]
        == 1));
    let cookie = w.login();
    let origin = format!("http://{}", w.addr);
    let a = http::request(
        &w.addr,
        "POST",
        &format!("/api/runs/{id}/cancel"),
        &[("Cookie", &cookie), ("Origin", &origin)],
        b"",
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let run = c.wait(&id);
    assert_eq!(run["state"], "interrupted", "{run}");
}

#[test]
fn a_non_loopback_address_needs_http_remote() {
    let s = Scratch::new("web-remote");
    let out = TestDaemon::command(&s.path().join("sock/d.sock"), &s.path().join("runs"))
        .args(["--http", "0.0.0.0:0"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("not a loopback address") && err.contains("--http-remote"),
        "{err}"
    );
}

/// A child killed when dropped.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn metrics_pass_promtool_and_a_real_prometheus_scrapes_the_gpu_and_stage_series() {
    if !have("promtool", "prometheus") || !have("prometheus", "prometheus") {
        return;
    }
    let s = Scratch::new("web-metrics");
    let w = start(&s);
    let mut c = w.d.connect();
    let id = c.submit_toml(&gpu_plan(&s, "m", 3, 0.2), s.path());
    assert_eq!(c.wait(&id)["state"], "succeeded");
    let metrics = w.get("/metrics");
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        text.contains("orchestrate_stage_attempts_finished_total{status=\"succeeded\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("orchestrate_gpu_reclaim_seconds_count 1"),
        "{text}"
    );
    // A real Prometheus scrapes the daemon with the token and answers PromQL.
    let port = free_port();
    let config = s.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: orchestrate\n    authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: ['{}']\n",
            s.path().join("sock/d.sock.web-token").display(),
            w.addr
        ),
    );
    let log = std::fs::File::create(s.path().join("prometheus.log")).unwrap();
    let _prom = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                s.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let prom = format!("127.0.0.1:{port}");
    let query = |q: &str| -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", encode(q));
        match http::request(&prom, "GET", &path, &[], b"", Duration::from_secs(10)) {
            Ok(a) if a.status == 200 => a.json()["data"]["result"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    let scraped = wait_for(Duration::from_secs(60), || {
        query("orchestrate_gpu_used_bytes").len() == 2
    });
    assert!(
        scraped,
        "Prometheus did not scrape the GPU series; its log:\n{}",
        std::fs::read_to_string(s.path().join("prometheus.log")).unwrap_or_default()
    );
    let gpus: Vec<String> = query("orchestrate_gpu_baseline_bytes")
        .iter()
        .map(|r| r["metric"]["gpu"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    assert!(
        gpus.contains(&"GPU-fake-0".to_string()) && gpus.contains(&"GPU-fake-1".to_string()),
        "{gpus:?}"
    );
    let done = query("sum(orchestrate_stage_attempts_finished_total{status=\"succeeded\"})");
    assert_eq!(done[0]["value"][1], "1", "{done:?}");
    let up = query("up{job=\"orchestrate\"}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let runs = query("orchestrate_runs{state=\"succeeded\"}");
    assert_eq!(runs[0]["value"][1], "1", "{runs:?}");
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A WebDriver session of a headless Chromium.
struct Browser {
    driver: String,
    session: String,
    _process: Killed,
}

impl Browser {
    fn start(dir: &Path) -> Browser {
        let port = free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let process = Killed(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let driver = format!("127.0.0.1:{port}");
        assert!(
            wait_for(Duration::from_secs(20), || http::request(
                &driver,
                "GET",
                "/status",
                &[],
                b"",
                Duration::from_secs(5)
            )
            .is_ok_and(|a| a.status == 200)),
            "chromedriver does not answer"
        );
        let profile = dir.join("chromium-profile");
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,1600", format!("--user-data-dir={}", profile.display())]}}}});
        let answer = http::json(&driver, "POST", "/session", &caps);
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_string();
        Browser {
            driver,
            session,
            _process: process,
        }
    }

    fn call(&self, method: &str, what: &str, body: Value) -> Value {
        let path = format!("/session/{}{what}", self.session);
        http::json(&self.driver, method, &path, &body)["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
    }

    /// Runs `script` in the page; its value.
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
    }

    /// Waits up to `secs` for `script` to return true; panics with `what` otherwise.
    fn wait(&self, secs: u64, what: &str, script: &str) {
        let ok = wait_for(Duration::from_secs(secs), || {
            self.eval(script) == Value::Bool(true)
        });
        if !ok {
            let body = self.eval("return document.body.innerText");
            panic!(
                "the page did not show {what}; it shows:\n{}",
                body.as_str().unwrap_or("")
            );
        }
    }

    fn screenshot(&self, path: &Path) {
        use base64_free::decode;
        let png = self.call("GET", "/screenshot", Value::Null);
        std::fs::write(path, decode(png.as_str().expect("a screenshot"))).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http::request(
            &self.driver,
            "DELETE",
            &format!("/session/{}", self.session),
            &[],
            b"",
            Duration::from_secs(20),
        );
    }
}

fn chromium() -> String {
    for candidate in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    "chromium".into()
}

/// Standard base64, decoded (the screenshot WebDriver sends).
mod base64_free {
    pub fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        };
        let mut out = Vec::with_capacity(text.len() * 3 / 4);
        let (mut acc, mut bits) = (0u32, 0);
        for v in text.bytes().filter_map(value) {
            acc = (acc << 6) | u32::from(v);
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }
}

#[test]
fn the_page_in_headless_chromium_shows_a_run_live_its_log_and_its_memory() {
    if !have("chromedriver", "chromium-driver") || !have(&chromium(), "chromium") {
        return;
    }
    let s = Scratch::new("web-chromium");
    let w = start(&s);
    let browser = Browser::start(s.path());
    browser.open(&format!("http://{}/?token={}", w.addr, w.token));
    browser.wait(
        20,
        "the runs list",
        "return !!document.querySelector('#runs')",
    );
    // The token is gone from the address (exchanged for the cookie).
    let url = browser.call("GET", "/url", Value::Null);
    assert_eq!(url, json!(format!("http://{}/", w.addr)));
    // Runs submitted now appear without a reload, each well within the 2 s the list once
    // polled at: 4 runs 300 ms apart, each seen within 700 ms of its submission, which no
    // poll every 2 s can do (one poll covers at most 700 ms of them, and they span 900 ms).
    browser.eval("window.__same_page = true; window.__seen = {}; new MutationObserver(() => { for (const tr of document.querySelectorAll('#runs tr[data-run]')) if (!(tr.dataset.run in window.__seen)) window.__seen[tr.dataset.run] = Date.now(); }).observe(document.querySelector('#main'), { childList: true, subtree: true }); return true");
    let mut c = w.d.connect();
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let mut submitted = Vec::new();
    for k in 0..4 {
        let at = unix_ms();
        let quick = c.submit_toml(
            &format!(
                "[run]\nname = \"quick-{k}\"\n[[stage]]\nname = \"q\"\ncommand = [\"true\"]\n"
            ),
            s.path(),
        );
        submitted.push((quick, at));
        std::thread::sleep(Duration::from_millis(300));
    }
    for (quick, at) in &submitted {
        browser.wait(
            10,
            "a quick run",
            &format!("return '{quick}' in window.__seen"),
        );
        let seen = browser.eval(&format!("return window.__seen['{quick}']"));
        let after = seen.as_i64().expect("a time") - at;
        assert!(
            after < 700,
            "run {quick} appeared {after} ms after its submission (the list is pushed, not polled every 2 s)"
        );
    }
    let id = c.submit_toml(&gpu_plan(&s, "live", 8, 0.5), s.path());
    browser.wait(
        20,
        "the submitted run",
        &format!("return !!document.querySelector('#runs tr[data-run=\"{id}\"]')"),
    );
    browser.eval(&format!("location.hash = '#/run/{id}'; return true"));
    let status =
        "(document.querySelector('#stages tr[data-stage=\"train\"] td.status') || {}).textContent";
    browser.wait(
        30,
        "the stage running",
        &format!("return {status} === 'running'"),
    );
    browser.eval(
        "document.querySelector('#stages tr[data-stage=\"train\"] a.stage').click(); return true",
    );
    browser.wait(
        30,
        "the stage succeeded",
        &format!("return {status} === 'succeeded'"),
    );
    assert_eq!(
        browser.eval("return window.__same_page === true"),
        Value::Bool(true),
        "the page was reloaded"
    );
    // The stage's log, its verdict and the memory picture with its span.
    browser.wait(
        20,
        "the stage's log",
        "return (document.querySelector('#log') || {}).textContent?.includes('step 8 of 8')",
    );
    browser.wait(20, "the clean verdict", "return [...document.querySelectorAll('#verdicts td.status')].some(t => t.textContent === 'clean')");
    browser.wait(20, "the memory curve of GPU-fake-0 with the stage's span",
        "const g = document.querySelector('svg[data-gpu=\"GPU-fake-0\"]'); return !!g && !!g.querySelector('rect.span') && (g.querySelector('polyline.used')?.getAttribute('points') || '').split(' ').length > 4");
    browser.wait(
        20,
        "the loss curve",
        "return !!document.querySelector('svg[data-chart=\"loss\"] polyline')",
    );
    let out = e2e_tests::repo_root().join("target/web-screenshot.png");
    browser.screenshot(&out);
    let png = std::fs::read(&out).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a screenshot at {}",
        out.display()
    );
}

#[test]
fn a_run_that_leaked_gpu_memory_is_amber_in_the_list_and_its_header_never_green() {
    if !have("chromedriver", "chromium-driver") || !have(&chromium(), "chromium") {
        return;
    }
    let s = Scratch::new("web-leak");
    let w = start(&s);
    let fake = s.path().join("fake-gpus");
    // The stage names orchestrate (its parent) as holding 1 GiB of its GPU: a leak.
    let plan = format!(
        "[run]\nname = \"leaky\"\non_leak = \"warn\"\nreclaim_timeout = \"1s\"\n[[stage]]\nname = \"a\"\ngpus = 1\ncommand = [\"sh\", \"-c\", \"echo \\\"$PPID orchestrate 1073741824\\\" > {}/$ORCHESTRATE_GPU_UUIDS\"]\n",
        fake.display()
    );
    let mut c = w.d.connect();
    let id = c.submit_toml(&plan, s.path());
    assert_eq!(c.wait(&id)["state"], "succeeded_leaked");
    let browser = Browser::start(s.path());
    browser.open(&format!("http://{}/?token={}", w.addr, w.token));
    let cell = format!("document.querySelector('#runs tr[data-run=\"{id}\"] td.status')");
    browser.wait(
        20,
        "the leaked run's state in the list",
        &format!(
            "const t = {cell}; return !!t && t.textContent === 'succeeded with leaked GPU memory'"
        ),
    );
    // Amber (#bf8700), not the green of a clean success.
    let colour = |script: &str| browser.eval(&format!("return getComputedStyle({script}).color"));
    assert_eq!(colour(&cell), json!("rgb(191, 135, 0)"));
    browser.eval(&format!("location.hash = '#/run/{id}'; return true"));
    browser.wait(
        20,
        "the run's header",
        "const t = document.querySelector('#run-state'); return !!t && t.textContent === 'succeeded with leaked GPU memory'",
    );
    assert_eq!(
        colour("document.querySelector('#run-state')"),
        json!("rgb(191, 135, 0)")
    );
    // The leaked memory still holds GPU 0: a 2-GPU run waits, and the runs list says why.
    let waiting = c.submit_toml(
        "[run]\nname = \"big\"\n[[stage]]\nname = \"b\"\ngpus = 2\ncommand = [\"true\"]\n",
        s.path(),
    );
    browser.eval("location.hash = '#/'; return true");
    browser.wait(
        20,
        "the waiting run's reason in the list",
        &format!(
            "const t = document.querySelector('#runs tr[data-run=\"{waiting}\"] td.status .waiting'); return !!t && t.textContent.includes('GPU 0 held by pid {}')",
            w.d.pid()
        ),
    );
    let cancelled = c.call(json!({"v": 1, "type": "cancel", "id": waiting}));
    assert_eq!(cancelled["type"], "cancelling", "{cancelled}");
}

/// The server-sent events of `path`, read to the stream's end: each message's `id:` (if any)
/// and data, and the `end` event's data.
fn read_stream(w: &WebDaemon, path: &str) -> (Vec<(Option<u64>, Value)>, Value) {
    let bearer = w.bearer();
    let answer = http::request(
        &w.addr,
        "GET",
        path,
        &[("Authorization", &bearer)],
        b"",
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let text = answer.text();
    let mut messages = Vec::new();
    let mut end = Value::Null;
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::to_string)
        };
        let data: Value = match field("data: ") {
            Some(d) => serde_json::from_str(&d).unwrap(),
            None => continue,
        };
        match field("event: ").as_deref() {
            Some("end") => end = data,
            None => messages.push((field("id: ").map(|i| i.parse().unwrap()), data)),
            Some(other) => panic!("unexpected event {other}: {block}"),
        }
    }
    (messages, end)
}

/// Checks a stream's messages: numbered in order, the last with its `id:`, the run's
/// `run_finished` among them; each stage's latest status, by stage.
fn latest_states(messages: &[(Option<u64>, Value)], events: u64) -> HashMap<String, String> {
    let seqs: Vec<u64> = messages
        .iter()
        .map(|(_, m)| m["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order, once each");
    let (last_id, last) = messages.last().expect("messages");
    assert_eq!(
        last["seq"].as_u64(),
        Some(events - 1),
        "the stream reaches the run's last event"
    );
    assert_eq!(*last_id, Some(events - 1), "the last message has its id");
    assert!(
        messages
            .iter()
            .any(|(_, m)| m["event"]["event"] == "run_finished"),
        "the run's end is sent"
    );
    let mut states = HashMap::new();
    for (_, m) in messages {
        let e = &m["event"];
        let status = match e["event"].as_str().unwrap() {
            "stage_started" => "running".to_string(),
            "stage_finished" => e["status"].as_str().unwrap().to_string(),
            "stage_skipped" => "skipped".to_string(),
            "stage_retrying" => "retrying".to_string(),
            _ => continue,
        };
        states.insert(e["stage"].as_str().unwrap().to_string(), status);
    }
    states
}

#[test]
fn a_large_runs_stream_keeps_every_stages_final_state_and_the_runs_end() {
    let s = Scratch::new("web-coalesce");
    let w = start(&s);
    let mut c = w.d.connect();
    // A small run's stream has every event.
    let small = c.submit_toml(
        "[run]\nname = \"small\"\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[[stage]]\nname = \"b\"\ncommand = [\"true\"]\nafter = [\"a\"]\n",
        s.path(),
    );
    let (messages, end) = read_stream(&w, &format!("/api/runs/{small}/events"));
    assert_eq!(end["state"], "succeeded");
    let events = end["events"].as_u64().unwrap();
    let seqs: Vec<u64> = messages
        .iter()
        .map(|(_, m)| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (0..events).collect::<Vec<_>>(),
        "every event of a small run"
    );
    // A large run (over web::feed::LARGE_RUN stages) read live from its submission, and again
    // once it has ended (from its event file).
    const STAGES: usize = 800;
    s.write(
        "ids.txt",
        &(0..STAGES).map(|i| format!("{i}\n")).collect::<String>(),
    );
    let large = c.submit_toml(
        "[run]\nname = \"sweep\"\n[[stage]]\nname = \"t\"\ncommand = [\"true\"]\nmatrix = { i = { lines = \"ids.txt\" } }\n",
        s.path(),
    );
    let path = format!("/api/runs/{large}/events");
    let live = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| read_stream(&w, &path)))
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    let after = read_stream(&w, &path);
    for (messages, end) in live.iter().chain([&after]) {
        assert_eq!(end["state"], "succeeded", "{end}");
        assert_eq!(end["succeeded"], STAGES);
        let events = end["events"].as_u64().unwrap();
        let states = latest_states(messages, events);
        assert_eq!(states.len(), STAGES, "every stage's state arrives");
        assert!(
            states.values().all(|s| s == "succeeded"),
            "every stage's latest state is its end"
        );
        assert!(
            (messages.len() as u64) < events,
            "a large run's batches are coalesced ({} messages of {events} events)",
            messages.len()
        );
    }
}

/// A browser's connection is kept alive: the token URL's redirect, the page and the API are
/// answered one after another on one connection (the server once closed it after every
/// answer), and so are two scrapes of `--metrics-addr`.
#[test]
fn requests_follow_each_other_on_one_kept_alive_connection() {
    let s = Scratch::new("web-keep-alive");
    let metrics = format!("127.0.0.1:{}", free_port());
    let addr = format!("127.0.0.1:{}", free_port());
    let d = TestDaemon::start_with_args(
        &s.path().join("sock/d.sock"),
        &s.path().join("runs"),
        &s.path().join("daemon.log"),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &["--http", &addr, "--metrics-addr", &metrics],
        &[],
    );
    let token = std::fs::read_to_string(s.path().join("sock/d.sock.web-token")).unwrap();
    let mut browser = http::KeptAlive::connect(&addr, Duration::from_secs(30)).unwrap();
    let login = browser
        .get(&format!("/?token={}", token.trim()), &[])
        .unwrap();
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = browser.get("/", &[("Cookie", &cookie)]).unwrap();
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains("<html"), "{}", page.text());
    let runs = browser.get("/api/runs", &[("Cookie", &cookie)]).unwrap();
    assert_eq!(runs.status, 200, "{}", runs.text());
    assert!(runs.json()["runs"].is_array(), "{}", runs.text());
    let mut scraper = http::KeptAlive::connect(&metrics, Duration::from_secs(30)).unwrap();
    for _ in 0..2 {
        let scraped = scraper.get("/metrics", &[]).unwrap();
        assert_eq!(scraped.status, 200, "{}", scraped.text());
        assert!(scraped
            .text()
            .contains("orchestrate_runs{state=\"succeeded\"} 0"));
    }
    drop(d);
}

#[test]
fn metrics_addr_serves_metrics_alone_without_the_token() {
    let s = Scratch::new("web-metrics-addr");
    let (port, metrics_port) = (free_port(), free_port());
    let addr = format!("127.0.0.1:{port}");
    let metrics = format!("127.0.0.1:{metrics_port}");
    let d = TestDaemon::start_in_with(
        s.path(),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &["--http", &addr, "--metrics-addr", &metrics],
        &[],
    );
    assert!(
        d.log()
            .contains(&format!("metrics at http://{metrics}/metrics")),
        "{}",
        d.log()
    );
    let mut c = d.connect();
    let id = c.submit_toml(
        "[run]\nname = \"m\"\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
        s.path(),
    );
    assert_eq!(c.wait(&id)["state"], "succeeded");
    // No token needed there, and the same series as the web view's /metrics.
    let scraped = http::get(&metrics, "/metrics", &[]);
    assert_eq!(scraped.status, 200, "{}", scraped.text());
    let text = scraped.text();
    assert!(
        text.contains("orchestrate_runs{state=\"succeeded\"} 1"),
        "{text}"
    );
    assert!(text.contains("orchestrate_stage_attempts_finished_total"));
    // Nothing else is served there: no run, no page, no change.
    for path in [
        "/".to_string(),
        "/api/runs".to_string(),
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}/events"),
        "/app.js".to_string(),
    ] {
        assert_eq!(http::get(&metrics, &path, &[]).status, 404, "{path}");
    }
    let post = http::request(
        &metrics,
        "POST",
        &format!("/api/runs/{id}/cancel"),
        &[("Origin", &format!("http://{metrics}"))],
        b"",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(post.status, 404);
    let post = http::request(
        &metrics,
        "POST",
        "/metrics",
        &[],
        b"",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(post.status, 405);
    // A page elsewhere cannot read it through a rebound DNS name.
    assert_eq!(
        http::get(&metrics, "/metrics", &[("Host", "attacker.example")]).status,
        403
    );
    // The web view's own /metrics still needs the token.
    assert_eq!(http::get(&addr, "/metrics", &[]).status, 401);
    // A non-loopback metrics address needs --http-remote.
    let refused = TestDaemon::command(&s.path().join("sock2/d.sock"), &s.path().join("runs2"))
        .args(["--http", "127.0.0.1:0", "--metrics-addr", "0.0.0.0:0"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--http-remote"), "{err}");
}

/// A metrics reporter for the sweep: `report.py KIND N` sends what a fine-tune (`train`) or an
/// evaluation (`eval`) of sample N reports, with a milestone time and a large whole number.
fn reporter(s: &Scratch) -> PathBuf {
    s.write(
        "report.py",
        "import json, os, socket, sys\n\
         kind, n = sys.argv[1], int(sys.argv[2])\n\
         c = socket.socket(socket.AF_UNIX); c.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         m = {'final_loss': 1.0 + n / 100, 'tokens_per_s': 40000.0 + n, 'parameters': 462336, 't_first_step': 1796000000.5} if kind == 'train' else {'accuracy': 0.5 + n / 100, 'loss': 2.0 - n / 100}\n\
         c.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': m}) + '\\n').encode())\n",
    )
}

/// Where the page's screenshots go: `target/web-img`, and `docs/img` too when
/// `ORCHESTRATE_UPDATE_SCREENSHOTS=1` (how the committed ones were made).
fn keep_screenshot(browser: &Browser, name: &str) {
    let dir = e2e_tests::repo_root().join("target/web-img");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    browser.screenshot(&out);
    let png = std::fs::read(&out).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a screenshot at {}",
        out.display()
    );
    if std::env::var("ORCHESTRATE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::copy(&out, e2e_tests::repo_root().join("docs/img").join(name)).unwrap();
    }
}

/// The page's text in `selector` (empty when it is not there).
fn text_of(browser: &Browser, selector: &str) -> String {
    let script = format!(
        "return (document.querySelector({}) || {{}}).textContent || ''",
        json!(selector)
    );
    browser.eval(&script).as_str().unwrap_or("").to_string()
}

#[test]
fn the_page_shows_progress_a_sweeps_samples_the_machine_and_a_leak() {
    if !have("chromedriver", "chromium-driver") || !have(&chromium(), "chromium") {
        return;
    }
    let s = Scratch::new("web-page");
    let w = start(&s);
    std::fs::write(s.path().join("fake-gpus/GPU-fake-0.util"), "37\n").unwrap();
    let browser = Browser::start(s.path());
    browser.open(&format!("http://{}/?token={}", w.addr, w.token));
    // The machine panel: each GPU's memory of its total and its utilisation.
    browser.wait(
        20,
        "the machine panel",
        "return !!document.querySelector('#machine tr[data-gpu=\"GPU-fake-1\"]')",
    );
    let util = text_of(&browser, "#machine tr[data-gpu=\"GPU-fake-0\"] td.util");
    assert_eq!(util, "37 %");
    let mem = text_of(&browser, "#machine tr[data-gpu=\"GPU-fake-1\"] td.mem");
    assert_eq!(mem, "0 MiB of 81920 MiB");

    // A running stage: its progress, ETA, its GPU alone in the memory panel, its log's tail.
    let live =
        w.d.connect()
            .submit_toml(&gpu_plan(&s, "live", 40, 0.3), s.path());
    let id = &live;
    browser.eval(&format!("location.hash = '#/run/{id}'; return true"));
    let row = "#stages tr[data-stage=\"train\"]";
    browser.wait(30, "the stage's progress", &format!("return /\\d+\\/40/.test(document.querySelector('{row} td.progress')?.textContent || '')"));
    browser.wait(
        10,
        "the stage's ETA",
        &format!(
            "return (document.querySelector('{row} td.eta')?.textContent || '').endsWith(' s')"
        ),
    );
    browser.eval(&format!(
        "document.querySelector('{row} a.stage').click(); return true"
    ));
    browser.wait(30, "the log scrolled to its tail", "const l = document.querySelector('#log'); return !!l && l.textContent.includes('step 30 of 40') && l.scrollHeight > l.clientHeight && l.scrollTop + l.clientHeight >= l.scrollHeight - 8");
    browser.wait(
        20,
        "the run's GPU's memory",
        "return !!document.querySelector('svg[data-gpu=\"GPU-fake-0\"] polyline.used')",
    );
    assert!(
        text_of(&browser, "#stages tr[data-stage=\"train\"] td.status") == "running",
        "the screenshot shows the stage running"
    );
    let other =
        browser.eval("return !!document.querySelector('#memory [data-gpu=\"GPU-fake-1\"]')");
    assert_eq!(other, json!(false), "the other GPU is not this run's");
    keep_screenshot(&browser, "web-running.png");
    browser.wait(
        30,
        "the stage succeeded",
        &format!("return document.querySelector('{row} td.status')?.textContent === 'succeeded'"),
    );

    // A 20-instance sweep (and its 20 evaluations) on the CPU.
    let report = reporter(&s);
    let values: Vec<String> = (1..=10).map(|i| format!("\"s{i:02}\"")).collect();
    let sweep = format!(
        "[run]\nname = \"sweep\"\n\
         [[stage]]\nname = \"finetune\"\nmatrix = {{ sample = [{v}], lr = [\"0.1\", \"0.01\"] }}\n\
         command = [\"sh\", \"-c\", \"python3 {r} train $(echo {{matrix.sample}} | tr -dc 0-9)\"]\n\
         [[stage]]\nname = \"eval\"\nafter = [\"finetune\"]\nmatrix = {{ sample = [{v}], lr = [\"0.1\", \"0.01\"] }}\n\
         command = [\"sh\", \"-c\", \"python3 {r} eval $(echo {{matrix.sample}} | tr -dc 0-9)\"]\n",
        v = values.join(", "),
        r = report.display()
    );
    let id = w.d.connect().submit_toml(&sweep, s.path());
    browser.eval(&format!("location.hash = '#/run/{id}'; return true"));
    browser.wait(60, "every sample's evaluation", "const r = [...document.querySelectorAll('#samples tbody tr')]; return r.length === 20 && r.every(tr => [...tr.querySelectorAll('td.sstatus')].map(t => t.textContent).join() === 'succeeded,succeeded') && r.every(tr => tr.textContent.includes('0.'))");
    browser.wait(
        30,
        "the run's end",
        "return document.querySelector('#run-state')?.textContent === 'succeeded'",
    );
    let heads = browser
        .eval("return [...document.querySelectorAll('#samples th')].map(t => t.textContent)");
    assert_eq!(
        heads,
        json!([
            "lr",
            "sample",
            "finetune status",
            "finetune final_loss",
            "finetune tokens_per_s",
            "finetune parameters",
            "eval status",
            "eval loss",
            "eval accuracy"
        ]),
        "one column per matrix key, then each stage's status and headline metrics"
    );
    // Sorting by eval accuracy, both ways.
    let column = |name: &str| {
        browser.eval(&format!("const i = [...document.querySelectorAll('#samples th')].findIndex(t => t.textContent.startsWith({})); return [...document.querySelectorAll('#samples tbody tr')].map(tr => tr.children[i].textContent)", json!(name)))
    };
    browser.eval("[...document.querySelectorAll('#samples th')].find(t => t.textContent === 'eval accuracy').click(); return true");
    let up: Vec<f64> = serde_json::from_value::<Vec<String>>(column("eval accuracy"))
        .unwrap()
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(
        up.windows(2).all(|w| w[0] <= w[1]) && up[0] == 0.51,
        "{up:?}"
    );
    browser.eval("[...document.querySelectorAll('#samples th')].find(t => t.textContent.startsWith('eval accuracy')).click(); return true");
    let down: Vec<String> = serde_json::from_value(column("eval accuracy")).unwrap();
    assert_eq!(down[0], "0.6", "{down:?}");
    // Whole numbers in full, milestone times nowhere, every result on hover.
    let cell = "#stages tr[data-stage=\"finetune[lr=0.1,sample=s07]\"] td.metrics";
    let shown = text_of(&browser, cell);
    assert!(
        shown.contains("parameters=462336") && shown.contains("tokens_per_s=40007"),
        "{shown}"
    );
    let hover = browser.eval(&format!(
        "return document.querySelector({}).title",
        json!(cell)
    ));
    let hover = hover.as_str().unwrap_or("");
    assert!(
        hover.contains("final_loss = 1.07") && !hover.contains("t_first_step"),
        "{hover}"
    );
    assert!(!browser
        .eval("return document.body.innerText")
        .as_str()
        .unwrap()
        .contains("t_first_step"));
    // Instances labelled by their values in the timeline, in full.
    let labels = browser.eval("return [...document.querySelectorAll('svg[data-chart=\"timeline\"] text.label')].map(t => t.firstChild.textContent)");
    assert!(
        labels
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "finetune lr=0.1 sample=s07"),
        "{labels}"
    );
    assert_eq!(text_of(&browser, "#no-gpu"), "this run used no GPU");
    browser.eval("window.scrollTo(0, 0); return true");
    keep_screenshot(&browser, "web-sweep.png");

    // A stage that leaves 1 GiB on its GPU, held by a process of orchestrate: leaked.
    let holders = s.path().join("fake-gpus");
    let leaky = format!(
        "[run]\nname = \"leaky\"\non_leak = \"warn\"\nreclaim_timeout = \"1s\"\n\
         [[stage]]\nname = \"leaky\"\ngpus = 1\n\
         command = [\"sh\", \"-c\", \"sleep 1; echo \\\"$PPID orchestrate 1073741824\\\" > {}/$ORCHESTRATE_GPU_UUIDS\"]\n",
        holders.display()
    );
    let id = w.d.connect().submit_toml(&leaky, s.path());
    browser.eval(&format!("location.hash = '#/run/{id}'; return true"));
    browser.wait(40, "the leaked verdict", "return [...document.querySelectorAll('#verdicts td.status')].some(t => t.textContent === 'leaked')");
    browser.wait(
        20,
        "the leaked GPU's memory",
        "return !!document.querySelector('#memory svg[data-gpu] rect.span')",
    );
    keep_screenshot(&browser, "web-leaked.png");
    // The runs list: the machine panel shows the memory the leak left.
    browser.eval("location.hash = '#/'; return true");
    browser.wait(20, "the leak in the machine panel", "return document.querySelector('#machine tr[data-gpu=\"GPU-fake-0\"] td.mem')?.textContent === '1024 MiB of 81920 MiB'");

    // After a restart the daemon has no memory samples of the earlier runs: the GPU run says
    // so instead of drawing a flat 0 MiB.
    let mut w = w;
    w.d.stop_with(nix::sys::signal::Signal::SIGTERM);
    let w = start(&s);
    browser.open(&format!("http://{}/?token={}#/run/{live}", w.addr, w.token));
    browser.wait(30, "the run's GPU without samples", "return /no memory samples of this run/.test(document.querySelector('#memory [data-gpu=\"GPU-fake-0\"]')?.textContent || '')");
    assert_eq!(
        browser.eval("return document.querySelectorAll('#memory svg').length"),
        json!(0),
        "no chart without samples"
    );
}
