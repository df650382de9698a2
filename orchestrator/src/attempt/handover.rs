//! Hand-over: the stage that starts the moment another one ends, planned while that one runs.
//!
//! Between one stage's end and the next one's spawn, a sweep of short stages run one at a
//! time waits for the scheduler's whole turn: the ended attempt's bookkeeping, its journal
//! record, the next attempt's plan. When a single stage runs and the scheduler can already tell
//! which stage will start when it ends, it plans that successor's first attempt while the
//! stage runs, and the ending stage's own task spawns it at the point where the run loop would
//! have started it:
//! - [`Kind::Slot`]: the first ready stage, which starts as soon as the running stage gives its
//!   slot back (its first process exited with 0 and nothing of its tree is left; see
//!   [`crate::attempt::supervise::supervise`]), before that stage's outputs are verified;
//! - [`Kind::Chain`]: the downstream stage that waits on the running stage alone, which starts
//!   once that stage succeeded (outputs verified), when no other stage is ready.
//!
//! The run loop records the start afterwards as if it had made it. Promises: at most one
//! successor is planned at a time, and only for a command stage's first attempt on the CPU; it
//! starts at most once, only at its point, and never after a stop was asked for; a successor
//! that does not start gives back the files opened for it (its socket file is removed) and is
//! left to the run loop, which starts it the ordinary way.

use crate::attempt::launch::{start_attempt, AttemptPlan, CancelLevel, Launched, Opened, Services};
use crate::attempt::outcome::Failure;
use std::cell::RefCell;
use std::rc::Rc;
use tokio::sync::watch;

/// When a successor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// When the stage before it gives its slot back (its tree is gone, its exit status 0).
    Slot,
    /// When the stage before it succeeded.
    Chain,
}

/// A successor's first attempt, planned.
pub(crate) struct Successor {
    /// The stage it follows.
    pub(crate) after: usize,
    /// The stage itself.
    pub(crate) index: usize,
    /// When it starts.
    pub(crate) kind: Kind,
    plan: AttemptPlan,
    files: Option<Opened>,
}

/// A successor's start: the stage and its spawned attempt (or why it could not spawn).
pub(crate) struct Started {
    /// The successor stage.
    pub(crate) stage: usize,
    /// Its attempt, spawned, or why it could not be.
    pub(crate) launched: Result<Box<Launched>, Failure>,
}

impl Successor {
    /// Stage `index`'s planned attempt `plan` (with the files opened for it, if any), to start
    /// after stage `after` at `kind`.
    pub(crate) fn new(
        after: usize,
        index: usize,
        kind: Kind,
        plan: AttemptPlan,
        files: Option<Opened>,
    ) -> Successor {
        Successor {
            after,
            index,
            kind,
            plan,
            files,
        }
    }

    /// Starts it, unless a stop was asked for: then it gives its files back and returns `None`.
    pub(crate) fn start(
        self,
        cancel: &watch::Receiver<CancelLevel>,
        services: &Services,
    ) -> Option<Started> {
        if *cancel.borrow() != CancelLevel::None {
            self.give_back();
            return None;
        }
        let span = tracing::info_span!(target: "orchestrate::stage", "stage", stage = %self.plan.name, attempt = self.plan.attempt);
        let started = span.in_scope(|| {
            tracing::debug!(kind = ?self.kind, "started by the stage before it as it ended (hand-over)");
            start_attempt(self.plan, self.files, services)
        });
        Some(Started {
            stage: self.index,
            launched: started,
        })
    }

    /// Closes the files opened for it and removes its socket file.
    pub(crate) fn give_back(self) {
        if let Some(files) = self.files {
            files.give_back();
        }
    }
}

/// What a running stage's task needs to start the successor planned after it, if one is.
pub(crate) struct HandOff {
    /// The running stage.
    pub(crate) after: usize,
    pub(crate) next_up: NextUp,
    pub(crate) cancel: watch::Receiver<CancelLevel>,
    pub(crate) services: std::rc::Rc<Services>,
}

impl HandOff {
    /// Starts the successor planned to follow at `kind`, if there is one and no stop was asked
    /// for (see [`Successor::start`]).
    pub(crate) fn start(&self, kind: Kind) -> Option<Started> {
        self.next_up
            .take(self.after, kind)
            .and_then(|s| s.start(&self.cancel, &self.services))
    }

    /// What becomes of the stage's slot once its tree is gone with exit status 0: the
    /// successor planned for it starts there, or the slot waits for the stage's result (its
    /// chain successor is planned, which the scheduler does only while nothing else is ready or
    /// can become ready before the stage ends: no other stage runs, no retry or GPU waits),
    /// or the run loop may give it to a ready stage now.
    pub(crate) fn slot_freed(&self) -> Slot {
        match self.start(Kind::Slot) {
            Some(started) => Slot::HandedOver(started),
            None if self.next_up.is_planned(self.after, Kind::Chain) => Slot::NoTaker,
            None => Slot::Free,
        }
    }
}

/// A freed slot's fate (see [`HandOff::slot_freed`]).
// Returned and taken apart at once; boxing the started attempt would cost an allocation a stage.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Slot {
    /// The successor runs in it already; the run loop records it at its next turn.
    HandedOver(Started),
    /// Nobody can take it before the stage ends: it is given back with the result.
    NoTaker,
    /// The run loop may start a ready stage in it.
    Free,
}

/// The run's planned successor, shared by the run loop (which plans it) and the task of the
/// stage it follows (which starts it).
#[derive(Clone, Default)]
pub(crate) struct NextUp(Rc<RefCell<Option<Successor>>>);

impl NextUp {
    /// Plans `successor` (replacing none: the run loop plans one only while none is planned).
    pub(crate) fn plan(&self, successor: Successor) {
        let old = self.0.borrow_mut().replace(successor);
        debug_assert!(old.is_none(), "a second successor planned");
        if let Some(old) = old {
            old.give_back();
        }
    }

    /// Whether the successor planned is the one to start after stage `after` at `kind`.
    pub(crate) fn is_planned(&self, after: usize, kind: Kind) -> bool {
        self.0
            .borrow()
            .as_ref()
            .is_some_and(|s| s.after == after && s.kind == kind)
    }

    /// Takes the successor planned to start after stage `after` at `kind`, if that is the one.
    pub(crate) fn take(&self, after: usize, kind: Kind) -> Option<Successor> {
        let mut slot = self.0.borrow_mut();
        if slot
            .as_ref()
            .is_some_and(|s| s.after == after && s.kind == kind)
        {
            slot.take()
        } else {
            None
        }
    }

    /// Gives back the successor planned after stage `after` if it did not start (that stage
    /// has ended): the run loop starts it the ordinary way if it still should.
    pub(crate) fn abandon(&self, after: usize) {
        let taken = {
            let mut slot = self.0.borrow_mut();
            if slot.as_ref().is_some_and(|s| s.after == after) {
                slot.take()
            } else {
                None
            }
        };
        if let Some(s) = taken {
            s.give_back();
        }
    }
}
