//! The host's queue for GPUs: backfill with reservations.
//!
//! The rule, for every stage of every run that asks for GPUs (documented in
//! `docs/running.md#gpu-queue`):
//! - Stages are considered in queue order: a higher priority first, then the earlier run, then
//!   the stage that started waiting first.
//! - A stage whose GPUs are free (no stage of ours on them, nothing else listed, memory at the
//!   idle baseline, not quarantined, not reserved) gets them, whatever waits before it: a stage
//!   that cannot have its GPUs now never keeps one that fits the free GPUs from starting
//!   (backfill).
//! - A waiting stage is guaranteed its turn by a reservation: once its GPUs would be free
//!   soonest (the free GPUs and those our own stages hold, which come back when those stages
//!   end, are enough for it), or once it has waited [`RESERVE_AFTER`] (then GPUs held by
//!   processes that are not ours count too), it reserves that many GPUs, free ones first, and
//!   no stage after it in the queue takes them. It starts as soon as they are all free.
//! - A stage that declares `gpu_memory` asks for a share of one GPU: a GPU is free for it when
//!   no stage holds it whole and the declarations of the stages sharing it leave room for its
//!   own; a stage that wants GPUs whole counts a shared GPU as one our stages hold.
//!
//! [`place`] decides one request against a snapshot of the GPUs and the queue; it is pure, so
//! the rule is tested here without GPUs.

use super::{GpuBusy, Ticket};
use std::time::{Duration, Instant};

/// How long a stage waits before its reservation may include GPUs held by processes that are
/// not ours (another user's job, memory nobody lists).
pub const RESERVE_AFTER: Duration = Duration::from_secs(60);

/// A stage's place in the queue: its run's ticket, then the order in which it began to wait.
pub(crate) type QueueKey = (Ticket, u64);

/// One GPU as the queue sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GpuState {
    /// Free and clean.
    Free,
    /// A stage of this host holds it whole (run and stage).
    Ours(String),
    /// Stages of this host share it (their names), with this many bytes not yet declared.
    Shared {
        /// The stages sharing it ("run X, stage `a`; …").
        sharers: String,
        /// Its memory less the baseline and what the sharers declared.
        room: u64,
    },
    /// Something that is not ours holds it, or it cannot be read (why).
    Held(GpuBusy),
    /// Quarantined after a leak.
    Quarantined,
}

/// A stage waiting for GPUs.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    /// Its place in the queue.
    pub key: QueueKey,
    /// Who it is ("run X, stage `y`").
    pub owner: String,
    /// GPUs it asks for.
    pub n: usize,
    /// For a share of one GPU (`gpu_memory`): the bytes it declared.
    pub bytes: Option<u64>,
    /// When it began to wait.
    pub since: Instant,
    /// When it last asked (a waiter that stops asking leaves the queue).
    pub asked: Instant,
}

/// What a request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// These GPUs (indices into the snapshot).
    Take(Vec<usize>),
    /// Wait: why, GPU by GPU, and the GPUs reserved for the stage (indices), if any.
    Wait {
        /// Why each GPU it could not have is not free.
        reasons: Vec<GpuBusy>,
        /// GPUs reserved for it.
        reserved: Vec<usize>,
    },
}

/// Places `asker` (a waiter, or a stage about to become one) against `gpus` (NVML index and
/// state) and the other waiters `queue`, by the module's rule, at `now`. Also gives, GPU by
/// GPU, who holds a reservation on it (or a claim, for a waiter that fits now and takes them
/// at its next turn).
pub(crate) fn place(
    gpus: &[(u32, GpuState)],
    queue: &[Waiter],
    asker: &Waiter,
    now: Instant,
) -> (Placement, Vec<Option<String>>) {
    let mut claimed: Vec<Option<String>> = vec![None; gpus.len()];
    let mut order: Vec<&Waiter> = queue.iter().filter(|w| w.key != asker.key).collect();
    order.push(asker);
    order.sort_by_key(|w| w.key);
    for w in order {
        let is_asker = w.key == asker.key;
        let unclaimed = |want: &dyn Fn(&GpuState) -> bool, claimed: &[Option<String>]| {
            (0..gpus.len())
                .filter(|&i| claimed[i].is_none() && want(&gpus[i].1))
                .collect::<Vec<usize>>()
        };
        let fits = |s: &GpuState| match s {
            GpuState::Free => true,
            GpuState::Shared { room, .. } => w.bytes.is_some_and(|b| b <= *room),
            _ => false,
        };
        let free = unclaimed(&fits, &claimed);
        if free.len() >= w.n {
            let pick = free[..w.n].to_vec();
            if is_asker {
                return (Placement::Take(pick), claimed);
            }
            for &i in &pick {
                claimed[i] = Some(w.owner.clone());
            }
            continue;
        }
        // GPUs our own stages hold come back when those stages end.
        let ours = unclaimed(
            &|s| !fits(s) && matches!(s, GpuState::Ours(_) | GpuState::Shared { .. }),
            &claimed,
        );
        let long = now.saturating_duration_since(w.since) >= RESERVE_AFTER;
        let mut candidates: Vec<usize> = free.iter().chain(&ours).copied().collect();
        if long {
            candidates.extend(unclaimed(&|s| matches!(s, GpuState::Held(_)), &claimed));
        }
        let reserved: Vec<usize> = if candidates.len() >= w.n {
            candidates[..w.n].to_vec()
        } else {
            Vec::new()
        };
        if is_asker {
            let reasons = reasons(gpus, &claimed, w.bytes);
            let claims = claimed_with(claimed, &reserved, w);
            return (Placement::Wait { reasons, reserved }, claims);
        }
        for &i in &reserved {
            claimed[i] = Some(w.owner.clone());
        }
    }
    unreachable!("the asker is in the order")
}

fn claimed_with(
    mut claimed: Vec<Option<String>>,
    reserved: &[usize],
    w: &Waiter,
) -> Vec<Option<String>> {
    for &i in reserved {
        claimed[i] = Some(w.owner.clone());
    }
    claimed
}

/// Why each GPU that is not free for the asker is not: held, busy, reserved for another
/// stage, quarantined.
fn reasons(
    gpus: &[(u32, GpuState)],
    claimed: &[Option<String>],
    bytes: Option<u64>,
) -> Vec<GpuBusy> {
    let mut out = Vec::new();
    for (i, (index, state)) in gpus.iter().enumerate() {
        let index = *index;
        match (state, &claimed[i]) {
            (GpuState::Held(why), _) => out.push(why.clone()),
            (GpuState::Ours(stage), _) => out.push(GpuBusy::Ours {
                index,
                stage: stage.clone(),
            }),
            (GpuState::Quarantined, _) => out.push(GpuBusy::Quarantined { index }),
            (GpuState::Shared { sharers, room }, claim) => {
                if bytes.is_none_or(|b| b > *room) {
                    out.push(GpuBusy::Shared {
                        index,
                        sharers: sharers.clone(),
                        room: *room,
                    });
                } else if let Some(stage) = claim {
                    out.push(GpuBusy::Reserved {
                        index,
                        stage: stage.clone(),
                    });
                }
                continue;
            }
            (GpuState::Free, Some(stage)) => out.push(GpuBusy::Reserved {
                index,
                stage: stage.clone(),
            }),
            (GpuState::Free, None) => {}
        }
        // A busy GPU another stage has reserved: say so as well.
        if let (GpuState::Ours(_) | GpuState::Held(_), Some(stage)) = (state, &claimed[i]) {
            out.push(GpuBusy::Reserved {
                index,
                stage: stage.clone(),
            });
        }
    }
    if out.is_empty() {
        out.push(GpuBusy::NotEnough);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(number: u64) -> Ticket {
        Ticket { rank: 0, number }
    }

    fn waiter(run: u64, owner: &str, n: usize, since: Instant) -> Waiter {
        Waiter {
            key: (ticket(run), run),
            owner: owner.into(),
            n,
            bytes: None,
            since,
            asked: since,
        }
    }

    fn held(index: u32) -> GpuState {
        GpuState::Held(GpuBusy::Held {
            index,
            holders: vec![crate::gpu::Holder {
                pid: 4242,
                name: "python3".into(),
                bytes: Some(1 << 30),
            }],
        })
    }

    #[test]
    fn a_stage_that_fits_the_free_gpus_starts_past_one_that_waits_for_a_held_gpu() {
        let now = Instant::now();
        let gpus = [(0, held(0)), (1, GpuState::Free)];
        let big = waiter(0, "run a, stage `big`", 2, now);
        let small = waiter(1, "run b, stage `small`", 1, now);
        let (got, _) = place(&gpus, std::slice::from_ref(&big), &small, now);
        assert_eq!(got, Placement::Take(vec![1]));
        // The big one waits, naming the holder, with nothing reserved (a foreign holder may
        // never let go before its wait passes the bound).
        let (got, _) = place(&gpus, std::slice::from_ref(&small), &big, now);
        let Placement::Wait { reasons, reserved } = got else {
            panic!("waits: {got:?}")
        };
        assert!(reserved.is_empty());
        assert_eq!(
            reasons[0].to_string(),
            "GPU 0 held by pid 4242 (python3) holding 1024 MiB"
        );
    }

    #[test]
    fn once_its_gpus_would_be_free_soonest_nothing_new_takes_them() {
        let now = Instant::now();
        // GPU 0 is free again; GPU 1 is held by a small stage of ours, which will end.
        let gpus = [
            (0, GpuState::Free),
            (1, GpuState::Ours("run b, stage `small`".into())),
        ];
        let big = waiter(0, "run a, stage `big`", 2, now);
        let later = waiter(2, "run c, stage `small`", 1, now);
        let (got, claims) = place(&gpus, std::slice::from_ref(&big), &later, now);
        let Placement::Wait { reasons, .. } = got else {
            panic!("the later stage waits: {got:?}")
        };
        let text: Vec<String> = reasons.iter().map(ToString::to_string).collect();
        assert!(
            text.contains(&"GPU 0 reserved for run a, stage `big`".to_string()),
            "{text:?}"
        );
        assert_eq!(claims[0].as_deref(), Some("run a, stage `big`"));
        // Both free: the big one takes them.
        let gpus = [(0, GpuState::Free), (1, GpuState::Free)];
        let (got, _) = place(&gpus, std::slice::from_ref(&later), &big, now);
        assert_eq!(got, Placement::Take(vec![0, 1]));
        // And the later one, asking first, still may not.
        let (got, _) = place(&gpus, std::slice::from_ref(&big), &later, now);
        assert!(matches!(got, Placement::Wait { .. }), "{got:?}");
    }

    #[test]
    fn past_the_bound_a_reservation_includes_gpus_held_by_others() {
        let now = Instant::now();
        let gpus = [(0, held(0)), (1, GpuState::Free)];
        let long_ago = now - RESERVE_AFTER - Duration::from_secs(1);
        let big = waiter(0, "run a, stage `big`", 2, long_ago);
        let small = waiter(1, "run b, stage `small`", 1, now);
        let (got, _) = place(&gpus, std::slice::from_ref(&big), &small, now);
        assert!(matches!(got, Placement::Wait { .. }), "{got:?}");
        let (got, _) = place(&gpus, std::slice::from_ref(&small), &big, now);
        assert_eq!(
            got,
            Placement::Wait {
                reasons: vec![held_reason()],
                reserved: vec![1, 0]
            }
        );
    }

    fn held_reason() -> GpuBusy {
        let GpuState::Held(why) = held(0) else {
            unreachable!()
        };
        why
    }

    #[test]
    fn a_share_fits_beside_others_while_its_declaration_fits_and_a_whole_gpu_waits() {
        let now = Instant::now();
        let shared = GpuState::Shared {
            sharers: "run a, stage `s1`".into(),
            room: 30 << 30,
        };
        let gpus = [(0, shared)];
        let mut small = waiter(1, "run b, stage `s2`", 1, now);
        small.bytes = Some(20 << 30);
        assert_eq!(place(&gpus, &[], &small, now).0, Placement::Take(vec![0]));
        let mut big = waiter(2, "run c, stage `s3`", 1, now);
        big.bytes = Some(40 << 30);
        let (got, _) = place(&gpus, &[], &big, now);
        let Placement::Wait { reasons, .. } = got else {
            panic!("{got:?}")
        };
        assert_eq!(
            reasons[0].to_string(),
            "GPU 0 shared by run a, stage `s1` (30720 MiB left to declare)"
        );
        let whole = waiter(3, "run d, stage `w`", 1, now);
        assert!(matches!(
            place(&gpus, &[], &whole, now).0,
            Placement::Wait { .. }
        ));
    }

    #[test]
    fn earlier_stages_that_fit_are_served_first() {
        let now = Instant::now();
        let gpus = [(0, GpuState::Free)];
        let first = waiter(0, "run a, stage `x`", 1, now);
        let second = waiter(1, "run b, stage `y`", 1, now);
        let (got, _) = place(&gpus, std::slice::from_ref(&first), &second, now);
        assert!(matches!(got, Placement::Wait { .. }), "{got:?}");
        let (got, _) = place(&gpus, std::slice::from_ref(&second), &first, now);
        assert_eq!(got, Placement::Take(vec![0]));
    }
}
