//! Which connections a listener keeps: each listener (the web view's, `--metrics-addr`'s) has
//! an [`Admission`] of its own, with two budgets that do not share.
//!
//! - **Pending**: a connection that has not yet shown it may be served (for the web view, a
//!   request head with the token; for `/metrics` alone, a complete request for it). At most
//!   [`Budgets::pending`] of them; one more makes the listener drop its *oldest* pending
//!   connection, so idle sockets cannot keep a newcomer out: they only push each other out. A
//!   pending connection also has [`super::http::HEAD_TIMEOUT`] for each request head (kept
//!   alive through refusals, it stays pending, and stays subject to being dropped).
//! - **Admitted**: a connection past that point, counted against [`Budgets::admitted`] until
//!   it closes; one over it is answered 503 and closed. A kept-alive connection closes when no
//!   next request head comes within [`super::http::HEAD_TIMEOUT`], and a write that stalls
//!   [`super::http::WRITE_TIMEOUT`] closes it too, so an admitted connection lives as long as
//!   its requests keep coming and its answers are taken (an event stream as long as its
//!   reader takes its events).
//!
//! So what a client without the token can hold is `pending` descriptors per listener, whatever
//! it does; the owner's request and a scrape get through all the same.

use crate::host::descriptors::AcceptErrors;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// The sizes of a listener's two budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Connections that have not shown they may be served.
    pub pending: usize,
    /// Connections being served.
    pub admitted: usize,
}

/// The web view's budgets: its pages' event streams are admitted connections.
pub const WEB: Budgets = Budgets {
    pending: 64,
    admitted: 1024,
};
/// `--metrics-addr`'s budgets: a scrape is one short answer.
pub const METRICS: Budgets = Budgets {
    pending: 64,
    admitted: 64,
};

/// One listener's connections.
pub struct Admission {
    /// What is counted, for the log.
    name: &'static str,
    budgets: Budgets,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Pending connections, oldest first: their ticket's number and their task.
    pending: VecDeque<(u64, Option<AbortHandle>)>,
    admitted: usize,
    /// Pending connections dropped for newer ones, for the log.
    dropped: u64,
}

/// Where a connection stands; dropping it (the connection's task ending, or aborted) frees its
/// place.
pub struct Ticket {
    admission: Rc<Admission>,
    number: u64,
    admitted: bool,
}

impl Admission {
    /// A listener's admission, `name` for the log.
    pub fn new(name: &'static str, budgets: Budgets) -> Rc<Admission> {
        Rc::new(Admission {
            name,
            budgets,
            state: RefCell::default(),
        })
    }

    /// A new connection, pending. When the pending budget is full the oldest pending
    /// connection is dropped (its task aborted, which closes its socket).
    pub fn arrive(self: &Rc<Self>) -> Ticket {
        let evicted = {
            let mut state = self.state.borrow_mut();
            let evicted = if state.pending.len() >= self.budgets.pending {
                state.dropped += 1;
                if state.dropped.is_power_of_two() {
                    tracing::warn!(
                        "{}: {} connections without a complete request; the oldest dropped for a newer one ({} so far)",
                        self.name,
                        self.budgets.pending,
                        state.dropped
                    );
                }
                state.pending.pop_front()
            } else {
                None
            };
            state.next += 1;
            let number = state.next;
            state.pending.push_back((number, None));
            (number, evicted)
        };
        let (number, evicted) = evicted;
        if let Some((_, Some(task))) = evicted {
            task.abort();
        }
        Ticket {
            admission: self.clone(),
            number,
            admitted: false,
        }
    }

    /// Drops the oldest pending connection, if any (a descriptor is needed elsewhere).
    pub fn shed_oldest(&self) -> bool {
        let evicted = self.state.borrow_mut().pending.pop_front();
        match evicted {
            Some((_, task)) => {
                if let Some(task) = task {
                    task.abort();
                }
                true
            }
            None => false,
        }
    }

    /// (pending, admitted) now.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state.borrow();
        (state.pending.len(), state.admitted)
    }
}

/// Accepts on `listener` until the task is aborted: each connection arrives pending in
/// `admission` and is served by `serve`, which admits it (or not) with its [`Ticket`]. Out of
/// descriptors, the listener drops its oldest pending connection and pauses briefly.
pub fn accept_loop<F, Fut>(
    listener: TcpListener,
    admission: Rc<Admission>,
    serve: F,
) -> JoinHandle<()>
where
    F: Fn(TcpStream, Ticket) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    tokio::task::spawn_local(async move {
        let mut errors = AcceptErrors::default();
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    errors.accepted(admission.name);
                    let _ = stream.set_nodelay(true);
                    let ticket = admission.arrive();
                    let number = ticket.number;
                    let task = tokio::task::spawn_local(serve(stream, ticket));
                    admission.track(number, task.abort_handle());
                    // Let the new connection read its head before the next one arrives: a
                    // burst of accepts must not push a waiting request out unread.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    if crate::host::descriptors::out_of_descriptors(&e) {
                        admission.shed_oldest();
                    }
                    errors.failed(admission.name, &e).await;
                }
            }
        }
    })
}

/// The listen backlog of the web view's listeners: a burst of connections waits in the
/// kernel instead of having its handshakes dropped (then retried after a second or more).
pub const BACKLOG: libc::c_int = 1024;

/// Sets `listener`'s backlog to [`BACKLOG`] (the standard library listens with 128).
pub fn deepen_backlog(listener: &std::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) again on a listening socket we own changes only its backlog.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Admission {
    /// Ties pending connection `number` to its task, so that it can be dropped for a newer
    /// one (a connection already admitted or gone is left alone).
    fn track(&self, number: u64, task: AbortHandle) {
        let mut state = self.state.borrow_mut();
        if let Some(entry) = state.pending.iter_mut().find(|(n, _)| *n == number) {
            entry.1 = Some(task);
        }
    }
}

impl Ticket {
    /// Moves the connection from the pending budget to the admitted one; `false` when that
    /// one is full (the caller answers 503 and closes).
    pub fn admit(&mut self) -> bool {
        if self.admitted {
            return true;
        }
        let mut state = self.admission.state.borrow_mut();
        if state.admitted >= self.admission.budgets.admitted {
            return false;
        }
        state.pending.retain(|(n, _)| *n != self.number);
        state.admitted += 1;
        self.admitted = true;
        true
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Ok(mut state) = self.admission.state.try_borrow_mut() else {
            return;
        };
        if self.admitted {
            state.admitted -= 1;
        } else {
            state.pending.retain(|(n, _)| *n != self.number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Rc<Admission> {
        Admission::new(
            "test",
            Budgets {
                pending: 2,
                admitted: 1,
            },
        )
    }

    #[test]
    fn a_full_pending_budget_drops_its_oldest_not_the_newcomer() {
        let a = small();
        let first = a.arrive();
        let second = a.arrive();
        let mut third = a.arrive();
        assert_eq!(a.counts(), (2, 0));
        // The first was pushed out: the third (and the second) can still be admitted.
        assert!(third.admit());
        assert_eq!(a.counts(), (1, 1));
        drop(first);
        assert_eq!(
            a.counts(),
            (1, 1),
            "a dropped-out ticket frees nothing twice"
        );
        drop(second);
        assert_eq!(a.counts(), (0, 1));
        drop(third);
        assert_eq!(a.counts(), (0, 0));
    }

    #[test]
    fn the_admitted_budget_is_separate_and_bounded() {
        let a = small();
        let mut one = a.arrive();
        let mut two = a.arrive();
        assert!(one.admit());
        assert!(!two.admit(), "over the admitted budget");
        assert_eq!(a.counts(), (1, 1));
        drop(one);
        assert!(two.admit());
        assert_eq!(a.counts(), (0, 1));
    }

    #[test]
    fn shedding_takes_the_oldest_pending() {
        let a = small();
        let _one = a.arrive();
        let mut two = a.arrive();
        assert!(a.shed_oldest());
        assert_eq!(a.counts(), (1, 0));
        assert!(two.admit());
        assert!(!a.shed_oldest());
    }
}
