//! Idle TCP connections held open by another process, as a local user without the token
//! would: a forked child (uid and gid 65534, "nobody", when the test runs as root) connects
//! to each address and then sends nothing, opening again every connection the server closes,
//! until the [`IdleFlood`] is dropped.

use std::net::SocketAddrV4;

/// The uid (and gid) the connections come from when the test runs as root.
pub const NOBODY: u32 = 65534;

/// A child process holding idle connections; killed when dropped.
pub struct IdleFlood {
    pid: libc::pid_t,
    /// Connections it established (counted by `connect`; the server may have closed some
    /// since).
    pub connected: u32,
    /// The uid it connected as.
    pub uid: u32,
}

/// The soft limit on open files raised to the hard one in this process; the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a pointer to a live rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

impl IdleFlood {
    /// Opens `per_address` idle connections to each of `addresses` from a forked child (as
    /// [`NOBODY`] when this process is root) and returns once all have been tried.
    pub fn start(addresses: &[SocketAddrV4], per_address: usize) -> IdleFlood {
        let hard = raise_nofile();
        // Everything the child uses is prepared here: after `fork` it only makes system calls.
        let targets: Vec<libc::sockaddr_in> = addresses.iter().map(sockaddr).collect();
        let wanted = (addresses.len() * per_address + 64) as u64;
        let root = nix::unistd::geteuid().is_root();
        let limit = libc::rlimit {
            rlim_cur: if root { wanted } else { wanted.min(hard) },
            rlim_max: if root { wanted.max(hard) } else { hard },
        };
        // One entry per connection: its descriptor and the target it goes to.
        let targets_of: Vec<usize> = (0..targets.len())
            .flat_map(|t| std::iter::repeat_n(t, per_address))
            .collect();
        let mut polls = vec![
            libc::pollfd {
                fd: -1,
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            };
            targets_of.len()
        ];
        let mut pipe = [0; 2];
        // SAFETY: pipe2 fills the two descriptors.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0
        );
        // SAFETY: the child calls only async-signal-safe functions and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: system calls on prepared values; the child ends in `pause`/`_exit`.
            unsafe { hold(pipe[1], &limit, root, &targets, &mut polls, &targets_of) }
        }
        // SAFETY: closing our copy of the write end; reading into a live buffer.
        let mut report = [0u8; 8];
        let n = unsafe {
            libc::close(pipe[1]);
            let n = libc::read(pipe[0], report.as_mut_ptr().cast(), report.len());
            libc::close(pipe[0]);
            n
        };
        assert_eq!(n, 8, "the child holding the connections reports");
        IdleFlood {
            pid,
            connected: u32::from_ne_bytes(report[..4].try_into().unwrap()),
            uid: u32::from_ne_bytes(report[4..].try_into().unwrap()),
        }
    }
}

/// The child: limits, identity, connections, report, then wait to be killed.
unsafe fn hold(
    report: libc::c_int,
    limit: &libc::rlimit,
    root: bool,
    targets: &[libc::sockaddr_in],
    polls: &mut [libc::pollfd],
    targets_of: &[usize],
) -> ! {
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    libc::setrlimit(libc::RLIMIT_NOFILE, limit);
    if root
        && (libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(NOBODY) != 0
            || libc::setuid(NOBODY) != 0)
    {
        libc::_exit(1);
    }
    let mut connected: u32 = 0;
    for (poll, target) in polls.iter_mut().zip(targets_of.iter()) {
        poll.fd = connect(&targets[*target]);
        if poll.fd >= 0 {
            connected += 1;
        }
    }
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&connected.to_ne_bytes());
    out[4..].copy_from_slice(&libc::getuid().to_ne_bytes());
    libc::write(report, out.as_ptr().cast(), out.len());
    // Then keep them up, as an attacker would: every connection the server closes is opened
    // again, five times a second.
    loop {
        libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 200);
        for (poll, target) in polls.iter_mut().zip(targets_of.iter()) {
            if poll.revents == 0 {
                continue;
            }
            libc::close(poll.fd);
            poll.fd = connect(&targets[*target]);
            poll.revents = 0;
        }
    }
}

/// A new connection to `target`; -1 when it failed.
unsafe fn connect(target: &libc::sockaddr_in) -> libc::c_int {
    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    if fd < 0 {
        return fd;
    }
    let addr = (target as *const libc::sockaddr_in).cast::<libc::sockaddr>();
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    if libc::connect(fd, addr, len) != 0 {
        libc::close(fd);
        return -1;
    }
    fd
}

fn sockaddr(addr: &SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

impl Drop for IdleFlood {
    fn drop(&mut self) {
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}
