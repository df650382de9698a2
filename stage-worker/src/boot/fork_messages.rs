//! The fork server's framing: length-prefixed JSON messages on a Unix socket, with the
//! descriptors of a message sent alongside its prefix. Shared by the server
//! ([`crate::boot::forkserver`]) and its standbys ([`crate::boot::standby`]).

use protocol::fork::ForkReply;
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Sends `reply`, length-prefixed (a little-endian u32 of its JSON's length, then the JSON), on
/// `sock`.
pub fn send(sock: &mut UnixStream, reply: &ForkReply) -> io::Result<()> {
    let body = serde_json::to_vec(reply).expect("reply serializes");
    let mut msg = (body.len() as u32).to_le_bytes().to_vec();
    msg.extend_from_slice(&body);
    sock.write_all(&msg)
}

/// Reads one length-prefixed message and the descriptors sent with its prefix; `None` at end
/// of file.
pub fn receive_framed(sock: &UnixStream) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut len = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut len)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(r) = c {
                // SAFETY: descriptors received with SCM_RIGHTS are new and ours.
                fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        (msg.bytes, fds)
    };
    if n == 0 {
        return Ok(None);
    }
    let mut reader = sock;
    if n < 4 {
        reader.read_exact(&mut len[n..])?;
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > 16 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {n} bytes"),
        ));
    }
    let mut body = vec![0u8; n];
    reader.read_exact(&mut body)?;
    Ok(Some((body, fds)))
}

/// Reads one length-prefixed JSON message and its descriptors from `sock` (an adoption, on a
/// standby's socket); `None` at end of file.
pub fn receive_message<T: serde::de::DeserializeOwned>(
    sock: &UnixStream,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let Some((body, fds)) = receive_framed(sock)? else {
        return Ok(None);
    };
    let message =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((message, fds)))
}
