//! How often the web view's event streams write: the pace that the run feeds, the runs
//! list's stream and the pages' streams share.

use std::time::Duration;

/// A comment is sent on an idle event stream this often, so a dead peer is noticed.
pub const KEEPALIVE: Duration = Duration::from_secs(15);
/// An event stream gathers the events of this long into one write: a sweep's hundreds of
/// events a second then cost each open page a few wake-ups a second, not one per event.
pub const BATCH: Duration = Duration::from_millis(100);
