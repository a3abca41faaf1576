//! Entering a network namespace by name, the one way fibre does it: the daemon's
//! `--netns NAME` mirrors and forwards in the namespace `ip netns add NAME` made, and the
//! test and bench harness (`fibre-testbed`) enters the namespaces it builds through here
//! too, so the two cannot disagree on how a name becomes a namespace.

use std::io;
use std::os::fd::AsRawFd;

/// Moves the calling thread into the network namespace `name` (as `ip netns exec`
/// does: `/run/netns/NAME`); sockets opened and threads started afterwards are of that
/// namespace, other threads are unaffected. The one way fibre enters a namespace: the
/// daemon's `--netns`, and the harness's namespaces in `fibre-testbed`.
pub fn enter(name: &str) -> io::Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a namespace name: {name:?}"),
        ));
    }
    let path = format!("/run/netns/{name}");
    let file =
        std::fs::File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    // SAFETY: `setns` takes a descriptor this function holds open for the call and a
    // namespace type; it touches no memory of this process and changes only the calling
    // thread's namespace.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{path}: {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_a_path_is_refused_before_any_file_is_opened() {
        for name in ["", ".", "..", "a/b", "../etc"] {
            let e = enter(name).expect_err(name);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}: {e}");
        }
    }

    #[test]
    fn a_namespace_that_is_not_there_is_named_in_the_error() {
        let e = enter("fibre-no-such-namespace").expect_err("no such namespace");
        assert!(
            e.to_string().contains("/run/netns/fibre-no-such-namespace"),
            "{e}"
        );
    }
}
