//! The host: everything that exists once per `orchestrate` process, shared by every run in it.
//!
//! The CLI is one host with one run; the daemon is one host with many. A [`Host`] owns:
//! - the child-subreaper status and the only `wait4(-1)` reaper ([`Reaper`]): every process any
//!   run spawns goes through it, so no run collects another's exit statuses;
//! - one guard process, which kills every stage process of this host if the process dies;
//! - the directory of event sockets;
//! - NVML (or its absence), one GPU pool for all runs, and the idle baseline of each GPU;
//! - the CPU budget that built-in CPU stages share;
//! - the Slurm allocation this process runs in, read once (`crate::slurm::Allocation`): its
//!   GPUs bound the inventory, and every run's placement starts from it;
//! - the fork servers of built-in workers, their standbys and the zygotes of Python stages
//!   ([`Forkers`]), stopped with it;
//! - the MPS daemons of GPUs that stages share through MPS ([`crate::gpu::mps`]), stopped
//!   with it at the latest;
//! - the `ORCHESTRATE_*` switches ([`Settings`]), read once by whoever starts it.
//!
//! Promises: a GPU is given to one stage of one run at a time; it is given only when the
//! driver lists no process on it and its memory is at its idle baseline (a GPU held by a
//! process that is not ours is not assigned, and the waiting stage is told who holds it);
//! stages waiting for GPUs are queued in ticket order (higher priority first, then
//! submission order) with backfill and reservations ([`gpu_queue`]): a stage that fits the
//! free GPUs never waits behind one that cannot start, and a waiting stage is guaranteed its
//! turn by a reservation.

pub mod descriptors;
pub mod gpu_queue;
pub mod quarantine_release;
pub(crate) mod sockets;

use crate::gpu::{self, GpuInfo, GpuPool, Inventory, MemoryProbe};
use crate::host::sockets::SocketDir;
use crate::process::forkers::Forkers;
use crate::process::guard::Guard;
use crate::process::reaper::Reaper;
use crate::settings::Settings;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// A run's place in the queue for GPUs: lower is served first (a higher priority, then an
/// earlier ticket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    /// The run's priority, negated: a higher priority sorts first.
    pub(crate) rank: i64,
    /// The run's number among the runs of this host, in the order they were ticketed.
    pub number: u64,
}

/// The stages waiting for GPUs (by owner, "run X, stage `y`"), why, and the reservations.
#[derive(Debug, Default)]
struct GpuQueue {
    waiters: BTreeMap<String, gpu_queue::Waiter>,
    /// The reason each waiter was last given.
    reasons: BTreeMap<String, GpuWait>,
    /// GPUs reserved or claimed for a waiter at the last placement (UUID → owner).
    reserved: BTreeMap<String, String>,
    next_seq: u64,
}

/// The queue as `/metrics` shows it: each waiting stage ("run X, stage `y`") with the kinds of
/// reason it was last given ([`GpuBusy::kind`]), and each reserved GPU (UUID) with the stage it
/// is reserved for.
pub type GpuQueueNow = (Vec<(String, Vec<&'static str>)>, Vec<(String, String)>);

/// A waiter that has not asked for this long has left the queue (a waiting stage asks at
/// least every half second).
const QUEUE_FORGETS: std::time::Duration = std::time::Duration::from_secs(5);

/// What the machine's GPUs are and how they are read.
pub struct GpuInventory {
    /// Every GPU (empty without NVML).
    pub gpus: Vec<GpuInfo>,
    /// The probe, when NVML (or the test stand-in) answered.
    pub probe: Option<Rc<dyn MemoryProbe>>,
    /// The driver version, or why there is no NVML.
    pub status: Result<String, gpu::NvmlUnavailable>,
    /// Set when NVML's numbering differs from the PCI bus order stages are given.
    pub order_note: Option<String>,
}

/// Why a stage waits for GPUs: not a failure, the stage is placed once they come free. Said
/// to the user (and compared, to say it again only when it changes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GpuWait {
    /// Not enough GPUs are free, clean and unreserved; why not, GPU by GPU.
    #[error("waiting for {n} GPU(s): {}{}", join(.reasons, "; "), reserved_text(.reserved))]
    Busy {
        /// GPUs the stage asks for.
        n: usize,
        /// Why GPUs could not be given (at least one).
        reasons: Vec<GpuBusy>,
        /// NVML indices of the GPUs reserved for this stage (nothing after it takes them).
        reserved: Vec<u32>,
    },
}

fn reserved_text(reserved: &[u32]) -> String {
    if reserved.is_empty() {
        return String::new();
    }
    format!("; GPU(s) {} reserved for it", join(reserved, ", "))
}

/// Why one GPU (or none) could not be given to a waiting stage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GpuBusy {
    /// The driver lists processes on it.
    #[error("GPU {index} held by {}", join(.holders, ", "))]
    Held {
        /// NVML index.
        index: u32,
        /// The first (up to 3) of them.
        holders: Vec<gpu::Holder>,
    },
    /// Its memory could not be read.
    #[error("GPU {index} cannot be read")]
    Unreadable {
        /// NVML index.
        index: u32,
    },
    /// Memory is in use beyond its idle baseline by something the driver does not list.
    #[error(
        "GPU {index} has {} MiB in use by something the driver does not list (idle: {} MiB)",
        .used_bytes >> 20,
        .idle_bytes >> 20
    )]
    Unlisted {
        /// NVML index.
        index: u32,
        /// Bytes in use now.
        used_bytes: u64,
        /// Its idle baseline, in bytes.
        idle_bytes: u64,
    },
    /// A stage of this host holds it.
    #[error("GPU {index} busy with {stage}")]
    Ours {
        /// NVML index.
        index: u32,
        /// The holder, as the pool names it (run and stage).
        stage: String,
    },
    /// Reserved for a stage before this one in the queue (see [`gpu_queue`]).
    #[error("GPU {index} reserved for {stage}")]
    Reserved {
        /// NVML index.
        index: u32,
        /// The stage it is reserved for (run and stage).
        stage: String,
    },
    /// Stages share it and the asker's declaration does not fit beside theirs (or it wants the
    /// GPU whole).
    #[error("GPU {index} shared by {sharers} ({} MiB left to declare)", .room >> 20)]
    Shared {
        /// NVML index.
        index: u32,
        /// The stages sharing it.
        sharers: String,
        /// Bytes not yet declared.
        room: u64,
    },
    /// Quarantined after a leak (`orchestrate gpu release` gives it back).
    #[error("GPU {index} quarantined after a leak")]
    Quarantined {
        /// NVML index.
        index: u32,
    },
    /// Its error counters say it needs a reset ([`gpu::health::refusal`]).
    #[error("GPU {index} refused by the health gate: {why}")]
    Unhealthy {
        /// NVML index.
        index: u32,
        /// Which counters.
        why: String,
    },
    /// An XID hit it in the stage's last attempt: its retry goes elsewhere.
    #[error("GPU {index} hit by an XID in this stage's last attempt")]
    Avoided {
        /// NVML index.
        index: u32,
    },
    /// No GPU is busy, there are just too few.
    #[error("not enough free GPUs")]
    NotEnough,
}

/// Every [`GpuBusy::kind`], for `/metrics`.
pub const GPU_WAIT_KINDS: &[&str] = &[
    "held_by_other",
    "unreadable",
    "unlisted_memory",
    "busy",
    "reserved",
    "quarantined",
    "unhealthy",
    "avoided",
    "not_enough",
];

impl GpuBusy {
    /// The kind of reason, as `/metrics` labels it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            GpuBusy::Held { .. } => "held_by_other",
            GpuBusy::Unreadable { .. } => "unreadable",
            GpuBusy::Unlisted { .. } => "unlisted_memory",
            GpuBusy::Ours { .. } | GpuBusy::Shared { .. } => "busy",
            GpuBusy::Reserved { .. } => "reserved",
            GpuBusy::Quarantined { .. } => "quarantined",
            GpuBusy::Unhealthy { .. } => "unhealthy",
            GpuBusy::Avoided { .. } => "avoided",
            GpuBusy::NotEnough => "not_enough",
        }
    }
}

/// How the GPU pool names the holder of a stage's GPUs: "run X, stage `y`".
pub(crate) fn gpu_owner(run_id: &str, stage: &str) -> String {
    format!("run {run_id}, stage `{stage}`")
}

/// The items' texts, separated by `sep`.
fn join<T: std::fmt::Display>(items: &[T], sep: &str) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// Process-wide machinery shared by every run of this process. Lives on one thread.
pub struct Host {
    /// The only reaper of this process.
    pub reaper: Reaper,
    _guard: Guard,
    /// Event sockets of every run's stages.
    pub sockets: SocketDir,
    /// The GPUs (inside a Slurm job: only those the job was given on this node).
    pub inventory: GpuInventory,
    /// Why the inventory is smaller than the machine's, when it is.
    pub gpu_note: Option<String>,
    /// The Slurm allocation this process runs in, if any.
    pub allocation: Option<crate::slurm::Allocation>,
    /// The `ORCHESTRATE_*` switches this host was started with.
    pub settings: Settings,
    /// The fork servers, standbys and zygotes stages start through.
    pub forkers: Rc<Forkers>,
    /// The MPS daemons of the GPUs that stages share through MPS now.
    pub mps: Rc<crate::gpu::mps::MpsDaemons>,
    pool: RefCell<GpuPool>,
    /// Lowest used memory seen on each GPU with no process on it.
    idle: RefCell<HashMap<String, u64>>,
    /// Stages waiting for GPUs, and the reservations.
    queue: RefCell<GpuQueue>,
    /// Woken whenever GPUs are given back.
    pub gpus_freed: tokio::sync::Notify,
    /// Cores of the machine.
    pub cpus: usize,
    /// Built-in stages running on the CPU, across runs.
    pub cpu_builtin_running: Cell<usize>,
    next_run: Cell<u64>,
}

impl Drop for Host {
    /// The host is done (the CLI's run ended, the daemon stops): the fork servers its runs
    /// shared go with it, stopped and reaped, so that nothing of it outlives it.
    fn drop(&mut self) {
        self.forkers.shutdown();
        self.mps.shutdown();
    }
}

impl Host {
    /// Becomes a child subreaper, starts the reaper and the guard, creates the socket
    /// directory and reads the GPU inventory; `settings` are the process's switches. Call once
    /// per process, inside a tokio `LocalSet` on a current-thread runtime.
    pub fn start(settings: Settings) -> crate::error::Result<Rc<Host>> {
        use crate::error::Context;
        // What a run asks next (whether stages get a cgroup namespace), found out meanwhile;
        // not asked at all with cgroups turned off.
        if settings.cgroups {
            crate::process::cgroup::namespace::Support::find_out_early();
        }
        let sockets = SocketDir::create().context("cannot create a directory for event sockets")?;
        // The guard is this program started again: its start (an exec and a large binary's
        // loading, which the thread starting it waits for) overlaps the reaper's start and
        // the GPU inventory, on a thread of its own.
        let guard = start_guard(sockets.path());
        let reaper = Reaper::start().context("cannot become a child subreaper")?;
        let fake = gpu::fake::from_env();
        let through_nvml = fake.is_none();
        let mut inventory = match fake {
            Some((gpus, probe)) => GpuInventory {
                gpus,
                probe: Some(Rc::new(probe)),
                status: Ok("fake GPUs (ORCHESTRATE_FAKE_GPUS)".into()),
                order_note: None,
            },
            None => match gpu::discover() {
                Inventory::Available {
                    gpus,
                    probe,
                    driver,
                    order,
                } => GpuInventory {
                    gpus,
                    probe: Some(Rc::from(probe as Box<dyn MemoryProbe>)),
                    status: Ok(driver),
                    order_note: order.note(),
                },
                Inventory::Unavailable(why) => GpuInventory {
                    gpus: Vec::new(),
                    probe: None,
                    status: Err(why),
                    order_note: None,
                },
            },
        };
        let allocation = crate::slurm::Allocation::detect();
        let (gpus, slurm_note) =
            crate::slurm::allowed_gpus(std::mem::take(&mut inventory.gpus), allocation.as_ref());
        let gpu_note = match (slurm_note, inventory.order_note.take()) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        inventory.gpus = gpus;
        let mut idle = HashMap::new();
        if let Some(probe) = &inventory.probe {
            for g in &inventory.gpus {
                if probe.holders(&g.uuid).is_empty() {
                    if let Ok(used) = probe.used_bytes(&g.uuid) {
                        idle.insert(g.uuid.clone(), used);
                    }
                }
            }
        }
        if through_nvml && inventory.probe.is_some() {
            // After the reads above, which its own start would hold up (NVML's lock).
            gpu::listen_for_xids();
        }
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let forkers = Rc::new(Forkers::new(&settings));
        let mps = Rc::new(crate::gpu::mps::MpsDaemons::new(
            settings.mps_control.clone(),
            sockets.path().to_path_buf(),
            reaper.clone(),
            forkers.clone(),
        ));
        let guard = guard().context("cannot start the guard process")?;
        Ok(Rc::new(Host {
            reaper,
            _guard: guard,
            sockets,
            pool: RefCell::new(GpuPool::new(inventory.gpus.clone())),
            inventory,
            gpu_note,
            allocation,
            forkers,
            mps,
            settings,
            idle: RefCell::new(idle),
            queue: RefCell::new(GpuQueue::default()),
            gpus_freed: tokio::sync::Notify::new(),
            cpus,
            cpu_builtin_running: Cell::new(0),
            next_run: Cell::new(0),
        }))
    }

    /// A ticket for a new run of `priority`: after every run ticketed before at that priority.
    pub fn ticket(&self, priority: i32) -> Ticket {
        let n = self.next_run.get();
        self.next_run.set(n + 1);
        Ticket {
            rank: -i64::from(priority),
            number: n,
        }
    }

    /// Whether the machine has GPUs to give.
    pub fn has_gpus(&self) -> bool {
        !self.inventory.gpus.is_empty()
    }

    /// GPUs that can still be given (not quarantined).
    pub(crate) fn usable_gpus(&self) -> usize {
        self.pool.borrow().usable()
    }

    /// Takes `n` GPUs for `owner` of the run holding `ticket`, each clean (no process on it,
    /// memory within `tolerance` of its idle baseline), passing the health gate (its error
    /// counters, `gpu::health::refusal`) and not in `avoid` (the GPUs an XID hit in the stage's
    /// last attempt), or says why the stage must wait. The queue's rule ([`gpu_queue`]): a
    /// stage that fits the free GPUs starts whatever waits before it, unless those GPUs are
    /// reserved for a stage before it in the queue. With `share` (bytes declared by
    /// `gpu_memory`), `n` is 1 and the stage gets a share of a GPU that is free or shared by
    /// stages whose declarations leave room for it.
    pub(crate) fn take_gpus(
        &self,
        n: usize,
        share: Option<u64>,
        ticket: Ticket,
        owner: &str,
        tolerance: u64,
        avoid: &[String],
    ) -> Result<Vec<GpuInfo>, GpuWait> {
        let now = std::time::Instant::now();
        let mut states = self.gpu_states(tolerance);
        // The GPUs an XID hit in this stage's last attempt are not for it, whatever they show.
        for (g, (index, state)) in self.inventory.gpus.iter().zip(states.iter_mut()) {
            if avoid.contains(&g.uuid) {
                *state = gpu_queue::GpuState::Held(GpuBusy::Avoided { index: *index });
            }
        }
        let mut queue = self.queue.borrow_mut();
        // A waiter that stopped asking (its stage was cancelled, its run ended) leaves.
        queue
            .waiters
            .retain(|_, w| now.duration_since(w.asked) < QUEUE_FORGETS);
        let asker = match queue.waiters.get_mut(owner) {
            Some(w) => {
                w.asked = now;
                w.n = n;
                w.bytes = share;
                w.clone()
            }
            None => gpu_queue::Waiter {
                key: (ticket, queue.next_seq),
                owner: owner.to_string(),
                n,
                bytes: share,
                since: now,
                asked: now,
            },
        };
        let others: Vec<gpu_queue::Waiter> = queue.waiters.values().cloned().collect();
        let (placement, claims) = gpu_queue::place(&states, &others, &asker, now);
        let gpus = self.gpus();
        queue.reserved = claims
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.clone().map(|c| (gpus[i].uuid.clone(), c)))
            .collect();
        match placement {
            gpu_queue::Placement::Take(chosen) => {
                queue.waiters.remove(owner);
                let uuids: Vec<&str> = chosen.iter().map(|&i| gpus[i].uuid.as_str()).collect();
                let mut pool = self.pool.borrow_mut();
                let got = match share {
                    Some(bytes) => pool.take_share(uuids[0], owner, bytes).map(|g| vec![g]),
                    None => pool.take(n, owner, |g| uuids.contains(&g.uuid.as_str())),
                };
                Ok(got.expect("the queue chose GPUs that are free for it"))
            }
            gpu_queue::Placement::Wait { reasons, reserved } => {
                if !queue.waiters.contains_key(owner) {
                    queue.next_seq += 1;
                }
                queue.waiters.insert(owner.to_string(), asker);
                let reserved = reserved.iter().map(|&i| gpus[i].index).collect();
                let wait = GpuWait::Busy {
                    n,
                    reasons,
                    reserved,
                };
                queue.reasons.insert(owner.to_string(), wait.clone());
                Err(wait)
            }
        }
    }

    /// Every GPU's state for the queue: free and clean, ours, held by something else or
    /// unreadable, quarantined. Lowers a GPU's idle baseline when it reads lower.
    fn gpu_states(&self, tolerance: u64) -> Vec<(u32, gpu_queue::GpuState)> {
        use gpu_queue::GpuState;
        let probe = self.inventory.probe.clone();
        let mut idle = self.idle.borrow_mut();
        let pool = self.pool.borrow();
        let mut state = |g: &GpuInfo| {
            if pool.quarantined(&g.uuid) {
                return GpuState::Quarantined;
            }
            if let Some(stage) = pool.holder(&g.uuid) {
                return GpuState::Ours(stage.to_string());
            }
            let sharers = pool.sharers(&g.uuid);
            if !sharers.is_empty() {
                let declared: u64 = sharers.iter().map(|(_, b)| b).sum();
                let base = idle.get(&g.uuid).copied().unwrap_or(0);
                let names: Vec<&str> = sharers.iter().map(|(o, _)| *o).collect();
                return GpuState::Shared {
                    sharers: names.join("; "),
                    room: g.total_bytes.saturating_sub(base).saturating_sub(declared),
                };
            }
            let Some(probe) = &probe else {
                return GpuState::Free;
            };
            let holders = probe.holders(&g.uuid);
            if !holders.is_empty() {
                return GpuState::Held(GpuBusy::Held {
                    index: g.index,
                    holders: holders.into_iter().take(3).collect(),
                });
            }
            if let Some(why) = probe
                .counters(&g.uuid)
                .and_then(|c| gpu::health::refusal(&c))
            {
                return GpuState::Held(GpuBusy::Unhealthy {
                    index: g.index,
                    why,
                });
            }
            let Ok(used) = probe.used_bytes(&g.uuid) else {
                return GpuState::Held(GpuBusy::Unreadable { index: g.index });
            };
            let base = idle.entry(g.uuid.clone()).or_insert(used);
            if used < *base {
                *base = used;
            }
            if used > base.saturating_add(tolerance) {
                return GpuState::Held(GpuBusy::Unlisted {
                    index: g.index,
                    used_bytes: used,
                    idle_bytes: *base,
                });
            }
            GpuState::Free
        };
        self.inventory
            .gpus
            .iter()
            .map(|g| (g.index, state(g)))
            .collect()
    }

    /// The stages waiting for GPUs now, each with why (the last reason it was given), and the
    /// GPUs reserved for a waiting stage (UUID → the stage): for `/metrics`.
    pub fn gpu_queue_now(&self) -> GpuQueueNow {
        let queue = self.queue.borrow();
        let waiting = queue
            .waiters
            .keys()
            .map(|owner| {
                let kinds = match queue.reasons.get(owner) {
                    Some(GpuWait::Busy { reasons, .. }) => {
                        let mut kinds: Vec<&'static str> =
                            reasons.iter().map(GpuBusy::kind).collect();
                        kinds.sort_unstable();
                        kinds.dedup();
                        kinds
                    }
                    None => Vec::new(),
                };
                (owner.clone(), kinds)
            })
            .collect();
        let reserved = queue
            .reserved
            .iter()
            .filter(|(_, stage)| queue.waiters.contains_key(stage.as_str()))
            .map(|(u, s)| (u.clone(), s.clone()))
            .collect();
        (waiting, reserved)
    }

    /// Gives back what `owner` ([`gpu_owner`]) holds of `gpus` and wakes waiting runs.
    pub(crate) fn give_back_gpus(&self, gpus: &[GpuInfo], owner: &str) {
        if gpus.is_empty() {
            return;
        }
        self.pool.borrow_mut().give_back(gpus, owner);
        self.gpus_freed.notify_waiters();
    }

    /// No further stage of any run is placed on `uuid`.
    pub(crate) fn quarantine(&self, uuid: &str) {
        self.pool.borrow_mut().quarantine(uuid);
        self.gpus_freed.notify_waiters();
    }

    /// Stages may be placed on `uuid` again (see [`Host::release_quarantined_gpu`]).
    fn lift_quarantine(&self, uuid: &str) {
        if self.pool.borrow_mut().lift_quarantine(uuid) {
            self.gpus_freed.notify_waiters();
        }
    }

    /// The run holding `ticket` no longer waits for GPUs (it ended or has nothing ready).
    pub(crate) fn stop_waiting(&self, ticket: Ticket) {
        let mut queue = self.queue.borrow_mut();
        let before = queue.waiters.len();
        queue.waiters.retain(|_, w| w.key.0 != ticket);
        if queue.waiters.len() != before {
            let waiters = std::mem::take(&mut queue.waiters);
            queue.reasons.retain(|owner, _| waiters.contains_key(owner));
            queue.waiters = waiters;
            drop(queue);
            self.gpus_freed.notify_waiters();
        }
    }

    /// The GPUs (all of them).
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.inventory.gpus
    }

    /// The idle baseline of GPU `uuid`: the lowest used memory seen on it with no process on
    /// it (None before it was ever seen idle).
    pub fn idle_baseline(&self, uuid: &str) -> Option<u64> {
        self.idle.borrow().get(uuid).copied()
    }

    /// Whether GPU `uuid` is quarantined (no further stage is placed on it).
    pub fn quarantined(&self, uuid: &str) -> bool {
        self.pool.borrow().quarantined(uuid)
    }
}

/// Starts the guard (see [`crate::process::guard`]) on a thread of its own, or on this one
/// where no thread can be made; the returned call waits for it.
fn start_guard(cleanup: &std::path::Path) -> impl FnOnce() -> std::io::Result<Guard> {
    let dir = cleanup.to_path_buf();
    let pending = std::thread::Builder::new()
        .name("guard-start".into())
        .spawn(move || crate::process::guard::start(Some(&dir)))
        .map_err(|_| crate::process::guard::start(Some(cleanup)));
    move || match pending {
        Ok(thread) => thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the guard's start failed"))),
        Err(started_here) => started_here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_says_why_gpu_by_gpu() {
        let holder = |pid| gpu::Holder {
            pid,
            name: "python".into(),
            bytes: None,
        };
        let wait = GpuWait::Busy {
            n: 1,
            reasons: vec![
                GpuBusy::Held {
                    index: 0,
                    holders: vec![holder(7), holder(8)],
                },
                GpuBusy::Unreadable { index: 1 },
                GpuBusy::Unlisted {
                    index: 2,
                    used_bytes: 3 << 20,
                    idle_bytes: 1 << 20,
                },
                GpuBusy::Ours {
                    index: 3,
                    stage: "run r, stage `a`".into(),
                },
                GpuBusy::Reserved {
                    index: 4,
                    stage: "run q, stage `big`".into(),
                },
                GpuBusy::Quarantined { index: 5 },
            ],
            reserved: vec![6, 7],
        };
        assert_eq!(
            wait.to_string(),
            "waiting for 1 GPU(s): GPU 0 held by pid 7 (python), pid 8 (python); GPU 1 cannot be read; \
             GPU 2 has 3 MiB in use by something the driver does not list (idle: 1 MiB); \
             GPU 3 busy with run r, stage `a`; GPU 4 reserved for run q, stage `big`; \
             GPU 5 quarantined after a leak; GPU(s) 6, 7 reserved for it"
        );
        let none = GpuWait::Busy {
            n: 1,
            reasons: vec![GpuBusy::NotEnough],
            reserved: Vec::new(),
        };
        assert_eq!(
            none.to_string(),
            "waiting for 1 GPU(s): not enough free GPUs"
        );
    }
}
