//! The daemon's control socket, made so that running the daemon as root is safe: it
//! replaces nothing but a stale socket (one that refuses connections: a regular file, a
//! directory, a link, a datagram socket at the path are refused and left as they were),
//! and never one another daemon made meanwhile; it is owner- and group-only (0660, the
//! group `--socket-group` names) before anyone can connect to it, being bound in a
//! private directory beside its path and only then put in place; its directory must be
//! writable by its owner alone (or sticky), so that no one else can swap what the
//! daemon works on; and on exit it is removed only if the path still names the socket
//! the daemon made.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The mode the socket is made with: read and write (what connecting needs) for its
/// owner and its group.
pub const MODE: u32 = 0o660;

/// A control socket bound and listening.
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's device and inode, to know it again at exit.
    identity: (u64, u64),
}

impl ControlSocket {
    /// Binds the control socket at `path`, its group `group` (a name or a number) if
    /// given. Refuses a path where a daemon already answers, or where something other
    /// than a stale socket is; a stale socket is replaced.
    pub fn bind(path: &Path, group: Option<&str>) -> io::Result<ControlSocket> {
        let gid = group.map(group_id).transpose()?;
        let shown = path.display();
        let fail = |e: io::Error| io::Error::new(e.kind(), format!("{shown}: {e}"));
        let stale = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{shown}: a daemon is already listening"),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => true,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                        "{shown}: a socket that is not a stale control socket ({e}): not replaced"
                    ),
                    ))
                }
            },
            Ok(m) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{shown}: {} is there, not a socket: not replaced",
                        kind(&m.file_type())
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(fail(e)),
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = std::fs::metadata(parent).map_err(fail)?;
        if dir.mode() & 0o022 != 0 && dir.mode() & 0o1000 == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{shown}: its directory {} is writable by others and not sticky: they could swap what the daemon makes there",
                    parent.display()
                ),
            ));
        }
        // A directory only this process's user may enter (short: a socket's path is at
        // most 107 bytes): no one connects to the socket before its mode and group are
        // set.
        let private = parent.join(format!(".fibre{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", private.display())))?;
        let made = (|| {
            let inner = private.join("s");
            let listener = UnixListener::bind(&inner)?;
            std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(MODE))?;
            if let Some(gid) = gid {
                std::os::unix::fs::lchown(&inner, None, Some(gid))?;
            }
            let m = std::fs::symlink_metadata(&inner)?;
            if stale {
                // In place of the stale one, at once.
                std::fs::rename(&inner, path)?;
            } else {
                // Where nothing was: a link fails if another daemon put its socket
                // there meanwhile, where a rename would replace it.
                std::fs::hard_link(&inner, path)?;
            }
            Ok::<_, io::Error>((listener, (m.dev(), m.ino())))
        })();
        let _ = std::fs::remove_dir_all(&private);
        let (listener, identity) = made.map_err(fail)?;
        Ok(ControlSocket {
            listener,
            path: path.to_path_buf(),
            identity,
        })
    }

    /// The listening socket.
    pub fn listener(&self) -> io::Result<UnixListener> {
        self.listener.try_clone()
    }

    /// Removes the socket file, if its path still names the socket made (also when
    /// dropped, whichever way the daemon ends).
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.identity {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.remove();
    }
}

/// What a file that is not a socket is, said plainly.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a special file"
    }
}

/// The group `group` names: a number, or a name `/etc/group` lists.
fn group_id(group: &str) -> io::Result<u32> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(|e| {
        io::Error::new(e.kind(), format!("--socket-group {group}: /etc/group: {e}"))
    })?;
    group_in(&groups, group).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("--socket-group {group}: no such group in /etc/group"),
        )
    })
}

/// The number of the group named `name` in the text of `/etc/group`.
fn group_in(groups: &str, name: &str) -> Option<u32> {
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fibre-control-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("a scratch directory");
        dir
    }

    /// A regular file, a directory and a link at the path are refused and left as they
    /// were; a live socket is refused; a stale one is replaced; the socket made is
    /// 0660 and answers; on removal, only the socket made goes.
    #[test]
    fn the_socket_replaces_nothing_but_a_stale_one() {
        let dir = scratch("replace");
        let path = dir.join("control.sock");
        std::fs::write(&path, b"precious").unwrap();
        let e = ControlSocket::bind(&path, None).err().expect("refused");
        assert!(e.to_string().contains("a regular file"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(ControlSocket::bind(&path, None).is_err());
        assert!(path.is_dir());
        std::fs::remove_dir(&path).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
        assert!(ControlSocket::bind(&path, None).is_err());
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_file(&path).unwrap();

        let first = ControlSocket::bind(&path, None).expect("bound");
        let m = std::fs::metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, MODE);
        let e = ControlSocket::bind(&path, None)
            .err()
            .expect("a daemon listens");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        UnixStream::connect(&path).expect("the socket answers");
        // Dropped, it is removed.
        drop(first);
        assert!(!path.exists());
        // One left by a daemon killed (no one listens) is stale: replaced.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let second = ControlSocket::bind(&path, None).expect("a stale socket replaced");
        UnixStream::connect(&path).expect("the new socket answers");
        // Only what it made goes: not a file put at its path since.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's").unwrap();
        drop(second);
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        std::fs::remove_file(&path).unwrap();
        let third = ControlSocket::bind(&path, Some(&own_group().to_string())).expect("bound");
        assert_eq!(std::fs::metadata(&path).unwrap().gid(), own_group());
        drop(third);
        assert!(!path.exists());
        // A datagram socket (a log's) is not a stale control socket: refused, left.
        let datagram = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let e = ControlSocket::bind(&path, None).err().expect("refused");
        assert!(e.to_string().contains("not replaced"), "{e}");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_socket());
        drop(datagram);
        std::fs::remove_file(&path).unwrap();
        // A group that cannot be found: refused before anything is made.
        assert!(ControlSocket::bind(&path, Some("no-such-group-here")).is_err());
        assert!(!path.exists());
        // Nothing left beside it: the private directory is gone.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A directory others may write to, not sticky: refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ControlSocket::bind(&path, None).err().expect("refused");
        assert!(e.to_string().contains("writable by others"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        drop(ControlSocket::bind(&path, None).expect("sticky: bound"));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    fn own_group() -> u32 {
        std::fs::metadata("/proc/self").unwrap().gid()
    }

    #[test]
    fn groups_are_found_by_name_or_number() {
        let groups = "root:x:0:\nadm:x:4:syslog,admin\nnetdev:x:107:\n";
        assert_eq!(group_in(groups, "adm"), Some(4));
        assert_eq!(group_in(groups, "netdev"), Some(107));
        assert_eq!(group_in(groups, "ad"), None);
        assert_eq!(group_in(groups, "x"), None);
        assert_eq!(group_id("1234").unwrap(), 1234);
        let e = group_id("no-such-group-here").unwrap_err();
        assert!(e.to_string().contains("no such group"), "{e}");
    }
}
