//! A standby: a child of the fork server that starts the CUDA driver before it knows its
//! stage, so that the stage it becomes does not wait for that.
//!
//! When a stage's last step is done (its `finishing` event), `orchestrate` asks the fork server
//! for a standby under that stage's environment ([`protocol::fork::ForkRequest::standby`]). The
//! standby takes on a worker's process attributes ([`crate::boot::forked_child::detach`]), initialises
//! the CUDA driver (libtorch counts the devices: `cuInit`, about 0.1 s on an H200; no context
//! is created, no device memory taken, and NVML lists nothing of it, so the previous stage's
//! release is checked exactly as before), and then waits on its own socket. The stage that
//! next starts on the same GPUs with the same driver variables ([`protocol::fork::driver_env`])
//! adopts it ([`protocol::fork::Adopt`]): it takes the stage's stdout, stderr, environment and
//! working directory, answers with its PID and runs the stage as a forked worker would,
//! creating its CUDA context then — after the GPUs were handed on. A standby whose socket
//! closes, or that is offered a stage with other driver variables, exits without running
//! anything.

use crate::boot::fork_messages::{receive_message, send};
use crate::boot::forked_child::CommandLineRunner;
use crate::boot::forked_child::{detach, take_on};
use protocol::fork::{driver_env, Adopt, ForkReply, ForkRequest};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// In the new child: detach, start the driver, wait for a stage and become its worker (see the
/// module comment), which it runs through `run`. Never returns.
pub fn become_standby(
    request: &ForkRequest,
    fds: Vec<OwnedFd>,
    server_sock: RawFd,
    pipe_w: RawFd,
    run: CommandLineRunner,
) -> ! {
    detach(request, &fds, server_sock, pipe_w);
    let mut fds = fds.into_iter();
    let (out, err) = (fds.next(), fds.next());
    let Some(control) = fds.next() else {
        std::process::exit(1)
    };
    drop((out, err));
    take_on(&request.env, &request.cwd);
    let started = Instant::now();
    // The device count is libtorch's first CUDA call: it runs `cuInit` and creates no context.
    let devices = tch::Cuda::device_count();
    let driver_s = started.elapsed().as_secs_f64();
    let mut sock = UnixStream::from(control);
    // Never wait forever, whatever happens to `orchestrate` (which kills an unused standby
    // after a minute).
    let _ = sock.set_read_timeout(Some(std::time::Duration::from_secs(120)));
    let (adopt, stage_fds) = match receive_message::<Adopt>(&sock) {
        Ok(Some(m)) => m,
        // Not wanted (the socket closed) or unreadable: nothing ran, nothing to report.
        _ => std::process::exit(0),
    };
    if let Err(why) = adoptable(request, &adopt, &stage_fds) {
        let _ = send(&mut sock, &ForkReply::Refused { reason: why });
        std::process::exit(1);
    }
    // SAFETY: dup2 onto this process's stdout and stderr of descriptors it received.
    let duped = unsafe {
        libc::dup2(stage_fds[0].as_raw_fd(), 1) >= 0 && libc::dup2(stage_fds[1].as_raw_fd(), 2) >= 0
    };
    if !duped {
        std::process::exit(1);
    }
    drop(stage_fds);
    if adopt.cgroup_namespace {
        // Moved into the stage's cgroup by `orchestrate`: a namespace rooted there, as a
        // forked worker is born in (this thread's, which runs the stage and every thread it
        // starts). Refused without CAP_SYS_ADMIN: it goes on without one.
        // SAFETY: unshare takes flags only.
        unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    }
    take_on(&adopt.env, &adopt.cwd);
    let waited_s = started.elapsed().as_secs_f64() - driver_s;
    let pid = std::process::id();
    if send(
        &mut sock,
        &ForkReply::Forked {
            pid,
            lacks: Vec::new(),
        },
    )
    .is_err()
    {
        std::process::exit(1);
    }
    drop(sock);
    // The stage starts now: its log's clock and its `t_worker_start` count from here.
    crate::log::restart();
    crate::log!(
        "started by the fork server (pid {pid}), from a standby: its CUDA driver started \
         {:.0} ms before ({driver_s:.3} s, {devices} device(s)), then it waited {waited_s:.3} s",
        (driver_s + waited_s) * 1e3
    );
    run(&adopt.argv)
}

/// Whether this standby may become the stage `adopt` describes: the same protocol, the same
/// driver variables as it started the driver under, and the stage's two descriptors.
fn adoptable(request: &ForkRequest, adopt: &Adopt, fds: &[OwnedFd]) -> Result<(), String> {
    if adopt.v != protocol::PROTOCOL_VERSION {
        return Err(format!(
            "an adoption of protocol version {}, this stage-worker speaks {}",
            adopt.v,
            protocol::PROTOCOL_VERSION
        ));
    }
    let pairs = |env: &[(String, String)]| {
        driver_env(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    if pairs(&adopt.env) != pairs(&request.env) {
        return Err("the stage's driver variables differ from the standby's".into());
    }
    if fds.len() != 2 {
        return Err(format!(
            "an adoption carries 2 descriptors, this one {}",
            fds.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(env: &[(&str, &str)]) -> ForkRequest {
        ForkRequest {
            v: protocol::PROTOCOL_VERSION,
            argv: vec![],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: "/".into(),
            parent: 1,
            cgroup: None,
            cgroup_namespace: false,
            standby: true,
        }
    }

    fn adopt(env: &[(&str, &str)]) -> Adopt {
        Adopt {
            v: protocol::PROTOCOL_VERSION,
            argv: vec!["stage-worker".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: "/".into(),
            cgroup_namespace: false,
        }
    }

    fn two_fds() -> Vec<OwnedFd> {
        let (a, b) = UnixStream::pair().unwrap();
        vec![a.into(), b.into()]
    }

    #[test]
    fn a_stage_with_the_same_driver_variables_may_adopt_whatever_else_differs() {
        let standby = request(&[("CUDA_VISIBLE_DEVICES", "GPU-1"), ("STAGE", "s1")]);
        let stage = adopt(&[("STAGE", "s2"), ("CUDA_VISIBLE_DEVICES", "GPU-1")]);
        assert_eq!(adoptable(&standby, &stage, &two_fds()), Ok(()));
    }

    #[test]
    fn another_gpu_or_driver_setting_or_protocol_is_refused() {
        let standby = request(&[("CUDA_VISIBLE_DEVICES", "GPU-1")]);
        for env in [
            vec![("CUDA_VISIBLE_DEVICES", "GPU-2")],
            vec![
                ("CUDA_VISIBLE_DEVICES", "GPU-1"),
                ("CUDA_MODULE_LOADING", "EAGER"),
            ],
            vec![],
        ] {
            let why = adoptable(&standby, &adopt(&env), &two_fds()).unwrap_err();
            assert!(why.contains("driver variables"), "{why}");
        }
        let mut old = adopt(&[("CUDA_VISIBLE_DEVICES", "GPU-1")]);
        old.v += 1;
        assert!(adoptable(&standby, &old, &two_fds()).is_err());
        let same = adopt(&[("CUDA_VISIBLE_DEVICES", "GPU-1")]);
        assert!(adoptable(&standby, &same, &two_fds()[..1]).is_err());
    }
}
