//! The helpers a host starts stages through instead of exec: the fork servers of built-in
//! workers with their standbys (`super::fork_server`) and the zygotes of Python stages
//! (`super::zygote`). One [`Forkers`] per host, owned by it (`crate::host::Host`) and handed
//! to every spawn ([`super::tree::spawn`]); [`Forkers::shutdown`] stops them all when the host
//! is done.

use super::fork_server::Servers;
use super::zygote::Zygotes;
use crate::settings::Settings;

/// A host's fork servers, standbys and zygotes (see the module's documentation).
pub struct Forkers {
    /// The fork servers of built-in workers, with their standbys.
    pub(crate) fork_servers: Servers,
    /// The zygotes of Python stages with `preload`.
    pub(crate) zygotes: Zygotes,
}

impl Forkers {
    /// None started yet; `settings` says which of them may be.
    pub fn new(settings: &Settings) -> Forkers {
        Forkers {
            fork_servers: Servers::new(settings),
            zygotes: Zygotes::new(settings.zygote, settings.standby),
        }
    }

    /// Asks the fork server that started worker `pid` for a standby under its environment
    /// (see `super::fork_server::Servers::prepare_standby`).
    pub fn prepare_standby(&self, pid: i32) {
        self.fork_servers.prepare_standby(pid);
    }

    /// Kills every waiting standby, of fork servers and zygotes, whose environment sets `name`
    /// to `value`: what it was readied under is going away.
    pub fn stop_standbys_where(&self, name: &str, value: &str) {
        self.fork_servers.stop_standbys_where(name, value);
        self.zygotes.stop_standbys_where(name, value);
    }

    /// Stops every fork server, standby and zygote and waits until they are gone.
    pub fn shutdown(&self) {
        self.fork_servers.shutdown();
        self.zygotes.shutdown();
    }
}
