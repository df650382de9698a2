//! The bound on what the daemon holds for requests not yet complete, all connections together.
//!
//! Promises: the bytes the daemon's connections hold for unfinished request lines (their
//! buffers' capacity, the memory they really take) never add up to more than the budget's
//! limit; a connection that would take more is refused (its caller closes it), and what a
//! connection holds is given back when its [`Share`] drops, however the connection ends. The
//! per-line cap ([`protocol::daemon::MAX_REQUEST_BYTES`]) bounds one connection; this bounds
//! the daemon.

use std::cell::Cell;

/// The bytes every connection's unfinished requests hold, and the most they may.
#[derive(Debug)]
pub struct RequestBudget {
    held: Cell<usize>,
    limit: usize,
}

impl RequestBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> RequestBudget {
        RequestBudget {
            held: Cell::new(0),
            limit,
        }
    }

    /// The most bytes all connections may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.held.get()
    }

    /// A share for one connection, holding nothing yet.
    pub fn share(&self) -> Share<'_> {
        Share {
            budget: self,
            held: 0,
        }
    }
}

/// What one connection holds of a [`RequestBudget`].
#[derive(Debug)]
pub struct Share<'a> {
    budget: &'a RequestBudget,
    held: usize,
}

impl Share<'_> {
    /// Whether this connection may hold `bytes` in all (more or fewer than now) without the
    /// daemon going over its limit.
    pub fn allows(&self, bytes: usize) -> bool {
        bytes <= self.held || self.budget.held() - self.held + bytes <= self.budget.limit
    }

    /// Records that this connection now holds `bytes`.
    pub fn set(&mut self, bytes: usize) {
        let others = self.budget.held() - self.held;
        self.budget.held.set(others + bytes);
        self.held = bytes;
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_together_stay_within_the_limit_and_give_back_what_they_held() {
        let budget = RequestBudget::new(100);
        let mut a = budget.share();
        let mut b = budget.share();
        assert!(a.allows(60));
        a.set(60);
        assert!(b.allows(40));
        assert!(!b.allows(41), "60 + 41 is over 100");
        b.set(40);
        assert!(
            a.allows(60) && a.allows(10),
            "holding as much or less is always allowed"
        );
        assert!(!a.allows(61));
        a.set(10);
        assert_eq!(budget.held(), 50);
        drop(b);
        assert_eq!(budget.held(), 10);
        drop(a);
        assert_eq!(budget.held(), 0);
    }
}
