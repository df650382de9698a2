//! Who is at fault when a GPU is not back at its baseline after a stage.
//!
//! By the time a verdict is made every process of the stage's tree is gone, so a process
//! still holding memory is either one of ours that escaped (an orphan the subreaper took in,
//! or a process carrying one of our stage tokens) or someone else's (another user, a
//! notebook). Memory held only by someone else is not the stage's leak. Everything else stays
//! a leak: a holder of ours, memory no listed process accounts for, and holders that cannot be
//! examined (NVML reports host PIDs inside containers; the driver may not say how much a
//! process holds).

use super::Holder;

/// Whose a process holding GPU memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// This orchestrator's: a descendant of it, or a process carrying one of its stage tokens.
    Ours,
    /// Someone else's: visible here, neither a descendant nor carrying our token.
    Foreign,
    /// Not visible in this process's `/proc` (another PID namespace): cannot be told.
    Unknown,
}

/// The attribution of memory above a GPU's baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribution {
    /// The stage's leak, with why, when the reason is not simply "the memory is still held".
    Stage(Option<String>),
    /// Only processes outside the stage's tree hold the excess.
    TakenByOther,
}

/// Decides whose fault `excess` bytes above the baseline are, given the GPU's `holders` and
/// how to tell each holder's owner. Memory held by no listed process, by any process of ours,
/// or by processes whose owner or size cannot be read, is the stage's; only when every holder
/// is foreign and their memory covers the excess (within `tolerance`) is the GPU taken by
/// someone else.
pub fn attribute(
    excess: u64,
    tolerance: u64,
    holders: &[Holder],
    owner: impl Fn(u32) -> Owner,
) -> Attribution {
    if holders.is_empty() {
        return Attribution::Stage(None);
    }
    let mut foreign_bytes: u64 = 0;
    for h in holders {
        match owner(h.pid) {
            Owner::Ours => {
                return Attribution::Stage(Some(format!("{h} is a process of this orchestrator")))
            }
            Owner::Unknown => {
                return Attribution::Stage(Some(format!(
                    "{h} is not visible here (NVML reports host process ids inside containers): whose it is cannot be told, so the strict verdict stands"
                )))
            }
            Owner::Foreign => match h.bytes {
                Some(b) => foreign_bytes = foreign_bytes.saturating_add(b),
                None => {
                    return Attribution::Stage(Some(format!(
                        "the driver does not say how much {h} holds, so the strict verdict stands"
                    )))
                }
            },
        }
    }
    if foreign_bytes.saturating_add(tolerance) < excess {
        return Attribution::Stage(Some(format!(
            "{} MiB above the baseline are held by no listed process",
            (excess - foreign_bytes) >> 20
        )));
    }
    Attribution::TakenByOther
}

/// The owner of live process `pid`, seen from this process: ours when this process is among
/// its ancestors or its environment carries `token_prefix` (`ORCHESTRATE_STAGE_TOKEN=<our
/// pid>-`), unknown when `/proc` does not show it, else foreign.
pub fn owner_of(pid: u32, token_prefix: &[u8]) -> Owner {
    let me = crate::process::scan::own_pid();
    let mut current = pid as i32;
    let mut seen = 0;
    loop {
        let Some(stat) = std::fs::read_to_string(format!("/proc/{current}/stat"))
            .ok()
            .and_then(|t| crate::process::scan::parse_stat(&t))
        else {
            // The holder itself invisible: another namespace. An ancestor gone mid-walk: the
            // walk ends there.
            return if current == pid as i32 {
                Owner::Unknown
            } else {
                break;
            };
        };
        if stat.ppid == me || stat.pid == me {
            return Owner::Ours;
        }
        if stat.ppid <= 1 || seen > 4096 {
            break;
        }
        current = stat.ppid;
        seen += 1;
    }
    if crate::process::scan::environ_any(pid as i32, |entry| entry.starts_with(token_prefix)) {
        Owner::Ours
    } else {
        Owner::Foreign
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn holder(pid: u32, mib: Option<u64>) -> Holder {
        Holder {
            pid,
            name: "python3".into(),
            bytes: mib.map(|m| m * MIB),
        }
    }

    fn foreign_except(ours: u32, unknown: u32) -> impl Fn(u32) -> Owner {
        move |pid| {
            if pid == ours {
                Owner::Ours
            } else if pid == unknown {
                Owner::Unknown
            } else {
                Owner::Foreign
            }
        }
    }

    #[test]
    fn foreign_holders_covering_the_excess_are_not_the_stages_leak() {
        let h = [holder(815, Some(3682))];
        assert_eq!(
            attribute(3682 * MIB, 64 * MIB, &h, foreign_except(0, 0)),
            Attribution::TakenByOther
        );
        // Two strangers together, within the tolerance.
        let h = [holder(815, Some(2000)), holder(816, Some(1650))];
        assert_eq!(
            attribute(3682 * MIB, 64 * MIB, &h, foreign_except(0, 0)),
            Attribution::TakenByOther
        );
    }

    #[test]
    fn a_holder_of_ours_or_unlisted_memory_is_a_leak() {
        let h = [holder(815, Some(3682)), holder(900, Some(10))];
        assert!(matches!(
            attribute(3692 * MIB, 64 * MIB, &h, foreign_except(900, 0)),
            Attribution::Stage(Some(why)) if why.contains("pid 900")
        ));
        assert_eq!(
            attribute(4000 * MIB, 64 * MIB, &[], foreign_except(0, 0)),
            Attribution::Stage(None)
        );
        // A stranger holds 1 GiB, 3 GiB more are nobody's.
        let h = [holder(815, Some(1024))];
        assert!(matches!(
            attribute(4096 * MIB, 64 * MIB, &h, foreign_except(0, 0)),
            Attribution::Stage(Some(why)) if why.contains("3072 MiB") && why.contains("no listed process")
        ));
    }

    #[test]
    fn holders_that_cannot_be_examined_keep_the_strict_verdict() {
        let h = [holder(815, Some(3682))];
        assert!(matches!(
            attribute(3682 * MIB, 64 * MIB, &h, foreign_except(0, 815)),
            Attribution::Stage(Some(why)) if why.contains("containers")
        ));
        let h = [holder(815, None)];
        assert!(matches!(
            attribute(3682 * MIB, 64 * MIB, &h, foreign_except(0, 0)),
            Attribution::Stage(Some(why)) if why.contains("does not say")
        ));
    }

    #[test]
    fn owners_seen_from_proc() {
        use std::process::Command;
        // A child of this test process is ours.
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(
            owner_of(child.id(), b"ORCHESTRATE_STAGE_TOKEN=x-"),
            Owner::Ours
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // A process outside our tree (pid 1, or whatever this namespace's init is) is foreign.
        assert_eq!(owner_of(1, b"ORCHESTRATE_STAGE_TOKEN=x-"), Owner::Foreign);
        // A pid no process has here is unknown.
        assert_eq!(owner_of(u32::MAX >> 2, b"T="), Owner::Unknown);
    }
}
