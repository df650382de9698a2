//! The job's state as Slurm reports it, and why the job is stopping.
//!
//! The cause of a stop is read from the controller's own record of the job (`scontrol show
//! job`: `JobState`, `Reason`, `PreemptTime`, `Restarts`, `EndTime`), falling back to
//! `squeue` when `scontrol` cannot answer. It is never guessed from how long the job ran.

use super::helper;
use crate::process::reaper::Reaper;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Why a Slurm job is stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// A higher-priority job preempts it (`PreemptTime` is set, or the state is PREEMPTED).
    Preemption,
    /// Its time limit is reached (state TIMEOUT, reason TimeLimit) or near (`EndTime` within
    /// [`TIME_LIMIT_WINDOW`] while running: the `--signal` warning).
    TimeLimit,
    /// Someone cancelled it (`scancel`): state CANCELLED, or completing with no other cause.
    Cancel,
    /// It was already requeued from outside (`Restarts` grew, or the state is REQUEUED or
    /// PENDING).
    Requeue,
    /// It runs normally and its end is not near: a signal sent by hand (`scancel --signal`)
    /// or by a site's tooling.
    Signal,
    /// Slurm could not be asked.
    Unknown,
}

impl StopCause {
    /// The name used in the journal and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            StopCause::Preemption => "preemption",
            StopCause::TimeLimit => "time_limit",
            StopCause::Cancel => "cancel",
            StopCause::Requeue => "requeue",
            StopCause::Signal => "signal",
            StopCause::Unknown => "unknown",
        }
    }
}

/// A running job whose `EndTime` is this close counts as stopped by its time limit: the
/// warning of `--signal=…@N` arrives N seconds before it, give or take the controller's
/// coarse timer.
pub const TIME_LIMIT_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The job's fields, as `scontrol show job -o` prints them (`Key=Value`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobState {
    /// Every field.
    pub fields: BTreeMap<String, String>,
    /// Where they came from ("scontrol" or "squeue").
    pub source: &'static str,
}

impl JobState {
    /// A field's value, when present and not a null marker ("None", "Unknown", "(null)").
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !matches!(*v, "" | "None" | "Unknown" | "(null)" | "N/A"))
    }

    /// The fields that explain a stop, as one line for the journal and the report.
    pub fn summary(&self) -> String {
        let keys = [
            "JobState",
            "Reason",
            "Restarts",
            "PreemptTime",
            "EndTime",
            "TimeLimit",
            "Requeue",
        ];
        let mut parts: Vec<String> = keys
            .iter()
            .filter_map(|k| self.fields.get(*k).map(|v| format!("{k}={v}")))
            .collect();
        parts.push(format!("(from {})", self.source));
        parts.join(" ")
    }
}

/// Parses the one-line output of `scontrol show job -o ID`. A value with spaces (a command
/// line) keeps them: a word without `Key=` belongs to the value before it.
pub fn parse_scontrol(line: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in line.split_whitespace() {
        let key_end = word.find('=').filter(|&i| {
            i > 0
                && word[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | ':' | '_'))
        });
        match key_end {
            Some(i) => {
                fields.insert(word[..i].to_string(), word[i + 1..].to_string());
                last = Some(word[..i].to_string());
            }
            None => {
                if let Some(v) = last.as_ref().and_then(|k| fields.get_mut(k)) {
                    v.push(' ');
                    v.push_str(word);
                }
            }
        }
    }
    fields
}

/// Why the job stopped, from its state. `restart_count` is `SLURM_RESTART_COUNT` of this
/// start; `now_unix` the current time; `end_unix` the job's `EndTime` as Unix time, when known.
pub fn classify(
    state: &JobState,
    restart_count: u32,
    now_unix: i64,
    end_unix: Option<i64>,
) -> StopCause {
    let job_state = state.get("JobState").unwrap_or("");
    let reason = state.get("Reason").unwrap_or("");
    let restarts: Option<u32> = state.get("Restarts").and_then(|r| r.parse().ok());
    if job_state.starts_with("CANCELLED") {
        StopCause::Cancel
    } else if job_state.starts_with("PREEMPTED") || state.get("PreemptTime").is_some() {
        StopCause::Preemption
    } else if job_state.starts_with("TIMEOUT") || reason == "TimeLimit" {
        StopCause::TimeLimit
    } else if restarts.is_some_and(|r| r > restart_count)
        || job_state.starts_with("REQUEUE")
        || job_state.starts_with("PENDING")
    {
        StopCause::Requeue
    } else if job_state.starts_with("COMPLETING") {
        // Ending, with no time limit, preemption or requeue recorded: `scancel`.
        StopCause::Cancel
    } else if job_state.is_empty() {
        StopCause::Unknown
    } else if end_unix.is_some_and(|end| end - now_unix <= TIME_LIMIT_WINDOW.as_secs() as i64) {
        StopCause::TimeLimit
    } else {
        StopCause::Signal
    }
}

/// Why Slurm could not say a job's state: every way it was asked, and why each did not answer.
#[derive(Debug, thiserror::Error)]
#[error("{}", .tries.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct QueryError {
    /// `scontrol`, then `squeue`, then `sacct`, in the order asked.
    pub tries: Vec<QueryFailure>,
}

/// Why one of Slurm's commands did not give a job's state.
#[derive(Debug, thiserror::Error)]
pub enum QueryFailure {
    /// `scontrol show job` answered without a `JobState`.
    #[error("`scontrol show job {job_id}` printed no JobState")]
    NoJobState {
        /// The job.
        job_id: String,
    },
    /// `squeue` or `sacct` answered without the job.
    #[error("{command} does not list job {job_id}")]
    NotListed {
        /// The command (`squeue`, `sacct`).
        command: &'static str,
        /// The job.
        job_id: String,
    },
    /// The command could not be run, or failed.
    #[error(transparent)]
    Helper(#[from] helper::HelperError),
}

/// Asks Slurm for job `job_id`'s state: `scontrol show job -o`, else `squeue`, else `sacct`
/// (where accounting runs). `Err` says why none could answer.
pub async fn query(reaper: &Reaper, job_id: &str) -> Result<JobState, QueryError> {
    let limit = Duration::from_secs(20);
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let scontrol = helper::run_for_output(
        reaper,
        &argv(&["scontrol", "show", "job", "-o", job_id]),
        limit,
    )
    .await;
    let scontrol_error = match scontrol {
        Ok(out) => {
            let fields = parse_scontrol(out.lines().next().unwrap_or(""));
            if fields.contains_key("JobState") {
                return Ok(JobState {
                    fields,
                    source: "scontrol",
                });
            }
            QueryFailure::NoJobState {
                job_id: job_id.to_string(),
            }
        }
        Err(e) => e.into(),
    };
    let mut tries = vec![scontrol_error];
    let commands: [(&'static str, Vec<String>); 2] = [
        (
            "squeue",
            argv(&["squeue", "-h", "-j", job_id, "-o", "%T|%r|%e"]),
        ),
        (
            "sacct",
            argv(&[
                "sacct",
                "-n",
                "-P",
                "-X",
                "-j",
                job_id,
                "-o",
                "State,Reason,End",
            ]),
        ),
    ];
    for (source, command) in commands {
        match helper::run_for_output(reaper, &command, limit).await {
            Ok(out) => match parse_columns(&out) {
                Some(fields) => return Ok(JobState { fields, source }),
                None => tries.push(QueryFailure::NotListed {
                    command: source,
                    job_id: job_id.to_string(),
                }),
            },
            Err(e) => tries.push(e.into()),
        }
    }
    Err(QueryError { tries })
}

/// `JobState|Reason|EndTime` (the first line of `squeue -o %T|%r|%e` or `sacct -P -o
/// State,Reason,End`) as fields; `None` without a state.
pub fn parse_columns(out: &str) -> Option<BTreeMap<String, String>> {
    let line = out.lines().next().unwrap_or("").trim();
    let mut fields = BTreeMap::new();
    for (key, value) in ["JobState", "Reason", "EndTime"]
        .iter()
        .zip(line.split('|'))
    {
        if !value.is_empty() {
            fields.insert(key.to_string(), value.to_string());
        }
    }
    fields.contains_key("JobState").then_some(fields)
}

/// Parses Slurm's local time stamps (`2026-11-30T01:55:05`) into Unix time, using the
/// machine's time zone offset as `date` sees it.
pub fn parse_slurm_time(text: &str) -> Option<i64> {
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let local = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(local - local_utc_offset())
}

fn local_utc_offset() -> i64 {
    // SAFETY: localtime_r writes only into the tm we own.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(line: &str) -> JobState {
        JobState {
            fields: parse_scontrol(line),
            source: "scontrol",
        }
    }

    #[test]
    fn parses_scontrol_one_line_output() {
        let s = state("JobId=1 JobName=t.sbatch JobState=RUNNING Reason=None Requeue=1 Restarts=0 Command=/tmp/my job.sh EndTime=Unknown");
        assert_eq!(s.get("JobState"), Some("RUNNING"));
        assert_eq!(s.get("Reason"), None, "None is a null marker");
        assert_eq!(s.fields["Command"], "/tmp/my job.sh");
        assert_eq!(s.get("EndTime"), None);
        assert!(s
            .summary()
            .starts_with("JobState=RUNNING Reason=None Restarts=0"));
    }

    #[test]
    fn the_cause_comes_from_the_job_state() {
        let now = 1_000_000;
        let c = |line: &str, end: Option<i64>| classify(&state(line), 0, now, end);
        assert_eq!(c("JobState=CANCELLED Reason=None", None), StopCause::Cancel);
        assert_eq!(
            c("JobState=COMPLETING Reason=None Restarts=0", None),
            StopCause::Cancel
        );
        assert_eq!(
            c("JobState=COMPLETING Reason=TimeLimit", None),
            StopCause::TimeLimit
        );
        assert_eq!(
            c("JobState=TIMEOUT Reason=None", None),
            StopCause::TimeLimit
        );
        assert_eq!(
            c("JobState=RUNNING PreemptTime=2026-11-30T01:00:00", None),
            StopCause::Preemption
        );
        assert_eq!(
            c(
                "JobState=RUNNING PreemptTime=None Restarts=0",
                Some(now + 120)
            ),
            StopCause::TimeLimit
        );
        assert_eq!(
            c("JobState=RUNNING Restarts=0", Some(now + 7200)),
            StopCause::Signal
        );
        assert_eq!(c("JobState=RUNNING Restarts=0", None), StopCause::Signal);
        assert_eq!(
            c("JobState=COMPLETING Restarts=1", None),
            StopCause::Requeue
        );
        assert_eq!(
            c("JobState=PENDING Reason=BeginTime", None),
            StopCause::Requeue
        );
        assert_eq!(c("", None), StopCause::Unknown);
        // A job started after one requeue still counts Restarts=1 as its own.
        assert_eq!(
            classify(&state("JobState=RUNNING Restarts=1"), 1, now, None),
            StopCause::Signal
        );
    }

    #[test]
    fn squeue_and_sacct_columns() {
        let f = parse_columns("CANCELLED by 0|None|2026-11-30T01:00:00\n").unwrap();
        let s = JobState {
            fields: f,
            source: "sacct",
        };
        assert_eq!(classify(&s, 0, 0, None), StopCause::Cancel);
        assert_eq!(parse_columns(""), None);
        let f = parse_columns("RUNNING|None|Unknown").unwrap();
        assert_eq!(f["EndTime"], "Unknown");
    }

    #[test]
    fn slurm_time_stamps_are_local_time() {
        let t = parse_slurm_time("1970-01-02T00:00:00").unwrap();
        assert_eq!(t + local_utc_offset(), 86_400);
        assert_eq!(parse_slurm_time("Unknown"), None);
    }

    #[test]
    fn a_failed_query_says_why_each_command_did_not_answer() {
        use crate::process::reaper::ExitStatus;
        use helper::{HelperError, HelperOutput};
        let err = QueryError {
            tries: vec![
                QueryFailure::Helper(HelperError::Failed {
                    argv: vec!["scontrol".into(), "show".into(), "job".into(), "7".into()],
                    output: HelperOutput {
                        status: Some(ExitStatus::Code(1)),
                        stdout: String::new(),
                        stderr: "noise\nslurm_load_jobs error: Invalid job id specified\n".into(),
                    },
                }),
                QueryFailure::NotListed {
                    command: "squeue",
                    job_id: "7".into(),
                },
                QueryFailure::Helper(HelperError::NotInstalled {
                    program: "sacct".into(),
                }),
            ],
        };
        assert_eq!(
            err.to_string(),
            "`scontrol show job 7` exited with code 1: slurm_load_jobs error: Invalid job id specified; \
             squeue does not list job 7; \
             `sacct` is not installed here (not on PATH): Slurm's client commands are missing in this environment (a container without them?)"
        );
        let no_state = QueryFailure::NoJobState { job_id: "7".into() };
        assert_eq!(
            no_state.to_string(),
            "`scontrol show job 7` printed no JobState"
        );
    }
}
