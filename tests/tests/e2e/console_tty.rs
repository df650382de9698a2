//! The console on a terminal (issue 49): under a pseudo-terminal (`script`, Debian's bsdutils,
//! which scripts/setup-web-test-tools makes sure of) a running stage has a live bar with its
//! step of its total, loss, tokens/s and ETA, under a run line counting the stages finished of
//! all; the final table lines up whatever each stage's status, its headline metrics first.
//! Piped, the same run prints plain progress lines and no bar.
//!
//! Without `script` the test fails under CI (`CI` set) and is skipped elsewhere, saying so; it
//! installs nothing.

use e2e_tests::{have, Scratch};
use std::path::Path;
use std::process::{Command, Stdio};

/// A plan: `train` reports 8 steps of progress with loss and tokens/s over about 6 s, then
/// its metrics; `broken` fails; `after` (after `broken`) is skipped.
fn plan(s: &Scratch) -> std::path::PathBuf {
    let talk = s.write(
        "talk.py",
        "import json, os, socket, time\n\
         c = socket.socket(socket.AF_UNIX); c.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         send = lambda e: c.sendall((json.dumps(dict(v=1, **e)) + '\\n').encode())\n\
         for i in range(1, 9):\n\
         \x20   send({'event': 'progress', 'step': i, 'total_steps': 8, 'loss': 4.0 / i, 'tokens_per_s': 12345.0})\n\
         \x20   time.sleep(0.8)\n\
         send({'event': 'metrics', 'metrics': {'final_loss': 0.5, 'tokens_per_s': 12345.0, 'parameters': 462336, 't_first_step': 1.7e9}})\n",
    );
    s.write(
        "plan.toml",
        &format!(
            "[run]\nname = \"tty\"\n\
             [[stage]]\nname = \"train\"\ncommand = [\"python3\", \"{}\"]\n\
             [[stage]]\nname = \"broken\"\ncommand = [\"sh\", \"-c\", \"sleep 1; exit 3\"]\n\
             [[stage]]\nname = \"after\"\nafter = [\"broken\"]\ncommand = [\"true\"]\n",
            talk.display()
        ),
    )
}

/// `text` as lines, without its ANSI escape sequences: a cursor move or erase (between
/// redraws) and a carriage return end a line.
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // A colour (`m`) stays inside its line; a cursor move or erase ends it.
                    let end = chars.by_ref().find(|c| c.is_ascii_alphabetic());
                    if end != Some('m') {
                        out.push('\n');
                    }
                }
            }
            '\r' => out.push('\n'),
            c => out.push(c),
        }
    }
    // The bars fill each line to the terminal's width and let it wrap: cut them there.
    let mut lines = String::new();
    for line in out.lines() {
        let chars: Vec<char> = line.chars().collect();
        for piece in chars
            .chunks(COLUMNS)
            .chain(chars.is_empty().then_some(&[][..]))
        {
            lines.extend(piece);
            lines.push('\n');
        }
    }
    lines
}

/// The pseudo-terminal's width.
const COLUMNS: usize = 160;

/// The summary table's row of `stage`: the last line that starts with its name and a space.
fn row<'a>(text: &'a str, stage: &str) -> &'a str {
    text.lines()
        .rev()
        .find(|l| l.starts_with(&format!("{stage} ")))
        .unwrap_or_else(|| panic!("no row of {stage}:\n{text}"))
}

#[test]
fn a_terminal_shows_live_bars_and_an_aligned_final_table() {
    if !have("script", "bsdutils") {
        return;
    }
    let s = Scratch::new("console-tty");
    let plan = plan(&s);
    let typescript = s.path().join("typescript");
    let run_dir = s.path().join("run");
    // A wide terminal: the pseudo-terminal `script` makes has no size of its own here.
    let inner = format!(
        "stty cols {COLUMNS} rows 40; exec '{}' --plan '{}' --run-dir '{}'",
        e2e_tests::orchestrate().display(),
        plan.display(),
        run_dir.display()
    );
    let status = Command::new("script")
        .args(["-qfec", &inner])
        .arg(&typescript)
        .env("TERM", "xterm-256color")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("script runs");
    assert_eq!(status.code(), Some(1), "a stage failed: exit code 1");
    let raw = std::fs::read_to_string(&typescript).expect("the typescript");
    let text = plain(&raw);
    // The stage's bar: its name, a bar, step of total, loss, tokens/s and an ETA.
    let bar = text
        .lines()
        .find(|l| l.starts_with("train") && l.contains("/8") && l.contains("ETA"))
        .unwrap_or_else(|| panic!("no bar of train:\n{text}"));
    assert!(bar.contains('[') && bar.contains("="), "{bar}");
    assert!(
        bar.contains("loss ") && bar.contains("12.3k tok/s"),
        "{bar}"
    );
    // The run line: stages finished of all, those running, and the run's ETA.
    assert!(
        text.lines().any(|l| l.starts_with("run [")
            && l.contains("/3 stages finished")
            && l.contains("running, ETA")),
        "no run line:\n{text}"
    );
    // No plain progress line on a terminal (the bars say it).
    assert!(!text.contains("train: step "), "{text}");
    // The final table: every status's row lines up, the headline metrics first.
    let rows = ["train", "broken", "after"].map(|s| row(&text, s));
    assert!(rows[0].contains(" succeeded "), "{}", rows[0]);
    assert!(rows[1].contains(" failed "), "{}", rows[1]);
    assert!(rows[2].contains(" skipped "), "{}", rows[2]);
    let result_at = |r: &str, what: &str| r.find(what).unwrap_or_else(|| panic!("{what} in {r}"));
    let header = text
        .lines()
        .rev()
        .find(|l| l.starts_with("stage ") && l.contains("result"))
        .expect("the table's header");
    let column = result_at(header, "result");
    assert_eq!(result_at(rows[0], "final_loss="), column, "{text}");
    assert_eq!(result_at(rows[1], "exited with code 3"), column, "{text}");
    assert!(
        rows[0].contains("final_loss=0.5000 tokens_per_s=12345 parameters=462336"),
        "{}",
        rows[0]
    );
    assert!(!rows[0].contains("t_first_step"), "{}", rows[0]);
    // The status column is padded: each row's try count ends under the header's "try".
    let try_end = header.find("try").expect("a try column") + 2;
    for r in rows {
        let b = r.as_bytes();
        assert!(
            b[try_end].is_ascii_digit() && b[try_end + 1] == b' ',
            "the tries do not line up:\n{header}\n{}",
            rows.join("\n")
        );
    }
    piped_prints_plain_lines(&s, &plan);
}

/// The same plan with stderr a pipe: plain progress lines, no bar.
fn piped_prints_plain_lines(s: &Scratch, plan: &Path) {
    let out = Command::new(e2e_tests::orchestrate())
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(s.path().join("piped"))
        .output()
        .expect("orchestrate runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("train: step 1/8  loss 4.0000  12.3k tok/s"),
        "{stderr}"
    );
    assert!(!stderr.contains("stages finished"), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "no escape sequence in a pipe: {stderr}"
    );
}
