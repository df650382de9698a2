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
//! - the `ORCHESTRATE_*` switches ([`Settings`]), read once by whoever starts it.
//!
//! Promises: a GPU is given to one stage of one run at a time; it is given only when the
//! driver lists no process on it and its memory is at its idle baseline (a GPU held by a
//! process that is not ours is not assigned, and the waiting stage is told who holds it);
//! runs waiting for GPUs are served in ticket order (higher priority first, then submission
//! order), so a run never waits behind a later one of the same priority.

pub mod descriptors;
pub(crate) mod sockets;

use crate::gpu::{self, GpuInfo, GpuPool, Inventory, MemoryProbe};
use crate::host::sockets::SocketDir;
use crate::process::forkers::Forkers;
use crate::process::guard::Guard;
use crate::process::reaper::Reaper;
use crate::settings::Settings;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

/// A run's place in the queue for GPUs: lower is served first (a higher priority, then an
/// earlier ticket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    /// The run's priority, negated: a higher priority sorts first.
    rank: i64,
    /// The run's number among the runs of this host, in the order they were ticketed.
    pub number: u64,
}

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
    /// Runs ahead of this one in the queue wait for GPUs.
    #[error("waiting for {n} GPU(s): runs submitted earlier (or with a higher priority) are waiting for GPUs first")]
    Queued {
        /// GPUs the stage asks for.
        n: usize,
    },
    /// Not enough GPUs are free and clean; why not, GPU by GPU.
    #[error("waiting for {n} GPU(s): {}", join(.reasons, "; "))]
    Busy {
        /// GPUs the stage asks for.
        n: usize,
        /// Why GPUs could not be given (at least one).
        reasons: Vec<GpuBusy>,
    },
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
    /// Its error counters say it needs a reset ([`gpu::health::refusal`]).
    #[error("GPU {index} refused by the health gate: {why}")]
    Unhealthy {
        /// NVML index.
        index: u32,
        /// Which counters.
        why: String,
    },
    /// No GPU is busy, there are just too few.
    #[error("not enough free GPUs")]
    NotEnough,
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
    pool: RefCell<GpuPool>,
    /// Lowest used memory seen on each GPU with no process on it.
    idle: RefCell<HashMap<String, u64>>,
    /// Runs waiting for GPUs.
    waiting: RefCell<BTreeSet<Ticket>>,
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
    }
}

impl Host {
    /// Becomes a child subreaper, starts the reaper and the guard, creates the socket
    /// directory and reads the GPU inventory; `settings` are the process's switches. Call once
    /// per process, inside a tokio `LocalSet` on a current-thread runtime.
    pub fn start(settings: Settings) -> crate::error::Result<Rc<Host>> {
        use crate::error::Context;
        let sockets = SocketDir::create().context("cannot create a directory for event sockets")?;
        let guard = crate::process::guard::start(Some(sockets.path()))
            .context("cannot start the guard process")?;
        let reaper = Reaper::start().context("cannot become a child subreaper")?;
        let mut inventory = match gpu::fake::from_env() {
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
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Ok(Rc::new(Host {
            reaper,
            _guard: guard,
            sockets,
            pool: RefCell::new(GpuPool::new(inventory.gpus.clone())),
            inventory,
            gpu_note,
            allocation,
            forkers: Rc::new(Forkers::new(&settings)),
            settings,
            idle: RefCell::new(idle),
            waiting: RefCell::new(BTreeSet::new()),
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
    /// counters, `gpu::health::refusal`) and not in `avoid`, or says why the stage must wait.
    /// A run whose ticket is not the first among the waiting runs waits for them.
    pub(crate) fn take_gpus(
        &self,
        n: usize,
        ticket: Ticket,
        owner: &str,
        tolerance: u64,
        avoid: &[String],
    ) -> Result<Vec<GpuInfo>, GpuWait> {
        if let Some(first) = self.waiting.borrow().first() {
            if *first < ticket {
                return Err(GpuWait::Queued { n });
            }
        }
        let mut reasons: Vec<GpuBusy> = Vec::new();
        let probe = self.inventory.probe.clone();
        let mut idle = self.idle.borrow_mut();
        let mut pool = self.pool.borrow_mut();
        let got = pool.take(n, owner, |g| {
            if avoid.contains(&g.uuid) {
                return false;
            }
            let Some(probe) = &probe else { return true };
            let holders = probe.holders(&g.uuid);
            let used = probe.used_bytes(&g.uuid).ok();
            if !holders.is_empty() {
                reasons.push(GpuBusy::Held {
                    index: g.index,
                    holders: holders.into_iter().take(3).collect(),
                });
                return false;
            }
            if let Some(why) = probe
                .counters(&g.uuid)
                .and_then(|c| gpu::health::refusal(&c))
            {
                reasons.push(GpuBusy::Unhealthy {
                    index: g.index,
                    why,
                });
                return false;
            }
            let Some(used) = used else {
                reasons.push(GpuBusy::Unreadable { index: g.index });
                return false;
            };
            let base = idle.entry(g.uuid.clone()).or_insert(used);
            if used < *base {
                *base = used;
            }
            if used > base.saturating_add(tolerance) {
                reasons.push(GpuBusy::Unlisted {
                    index: g.index,
                    used_bytes: used,
                    idle_bytes: *base,
                });
                return false;
            }
            true
        });
        match got {
            Some(gpus) => {
                self.waiting.borrow_mut().remove(&ticket);
                Ok(gpus)
            }
            None => {
                self.waiting.borrow_mut().insert(ticket);
                // Only when the stage waits: which of our stages hold the other GPUs.
                reasons.extend(self.inventory.gpus.iter().filter_map(|g| {
                    pool.holder(&g.uuid).map(|h| GpuBusy::Ours {
                        index: g.index,
                        stage: h.to_string(),
                    })
                }));
                if reasons.is_empty() {
                    reasons.push(GpuBusy::NotEnough);
                }
                Err(GpuWait::Busy { n, reasons })
            }
        }
    }

    /// Gives GPUs back and wakes waiting runs.
    pub(crate) fn give_back_gpus(&self, gpus: &[GpuInfo]) {
        if gpus.is_empty() {
            return;
        }
        self.pool.borrow_mut().give_back(gpus);
        self.gpus_freed.notify_waiters();
    }

    /// No further stage of any run is placed on `uuid`.
    pub(crate) fn quarantine(&self, uuid: &str) {
        self.pool.borrow_mut().quarantine(uuid);
        self.gpus_freed.notify_waiters();
    }

    /// The run holding `ticket` no longer waits for GPUs (it ended or has nothing ready).
    pub(crate) fn stop_waiting(&self, ticket: Ticket) {
        if self.waiting.borrow_mut().remove(&ticket) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_says_why_gpu_by_gpu() {
        assert_eq!(
            GpuWait::Queued { n: 2 }.to_string(),
            "waiting for 2 GPU(s): runs submitted earlier (or with a higher priority) are waiting for GPUs first"
        );
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
            ],
        };
        assert_eq!(
            wait.to_string(),
            "waiting for 1 GPU(s): GPU 0 held by pid 7 (python), pid 8 (python); GPU 1 cannot be read; \
             GPU 2 has 3 MiB in use by something the driver does not list (idle: 1 MiB); \
             GPU 3 busy with run r, stage `a`"
        );
        let none = GpuWait::Busy {
            n: 1,
            reasons: vec![GpuBusy::NotEnough],
        };
        assert_eq!(
            none.to_string(),
            "waiting for 1 GPU(s): not enough free GPUs"
        );
    }
}
