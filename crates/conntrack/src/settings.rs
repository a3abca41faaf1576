//! The settings connection tracking follows: the namespace's `net.netfilter.nf_conntrack_*`
//! sysctls, read from `/proc/sys/net/netfilter` of the namespace the reading thread is
//! in, as the kernel keeps them per network namespace. Times are held in nanoseconds.

use std::io;
use std::path::Path;

const SECOND: u64 = 1_000_000_000;

/// How long a TCP connection lives without a packet, by its state, as the kernel's
/// `nf_conntrack_tcp_timeout_*` sysctls say (in nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpTimeouts {
    /// SYN_SENT (and a new connection's first moment).
    pub syn_sent: u64,
    /// SYN_RECV.
    pub syn_recv: u64,
    /// ESTABLISHED.
    pub established: u64,
    /// FIN_WAIT.
    pub fin_wait: u64,
    /// CLOSE_WAIT.
    pub close_wait: u64,
    /// LAST_ACK.
    pub last_ack: u64,
    /// TIME_WAIT.
    pub time_wait: u64,
    /// CLOSE.
    pub close: u64,
    /// SYN_SENT2 (a simultaneous open): fixed in the kernel, no sysctl.
    pub syn_sent2: u64,
    /// The most a connection gets once `max_retrans` retransmissions went unanswered.
    pub max_retrans: u64,
    /// The most a connection gets while data it carried is unacknowledged.
    pub unacknowledged: u64,
}

/// The namespace's connection tracking settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `nf_conntrack_max`: the most connections tracked at once (0: no limit).
    pub max: u32,
    /// `nf_conntrack_checksum`: whether packets arriving with a checksum not yet checked
    /// have it checked (a bad one makes the packet invalid).
    pub checksum: bool,
    /// `nf_conntrack_tcp_loose`: whether a TCP connection is picked up from a packet
    /// other than its first SYN.
    pub tcp_loose: bool,
    /// `nf_conntrack_tcp_be_liberal`: whether only out-of-window RSTs are invalid.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_tcp_ignore_invalid_rst`: whether an RST out of sequence is let be.
    pub tcp_ignore_invalid_rst: bool,
    /// `nf_conntrack_tcp_max_retrans`: retransmissions before the shorter timeout.
    pub tcp_max_retrans: u32,
    /// The TCP timeouts.
    pub tcp: TcpTimeouts,
    /// `nf_conntrack_udp_timeout`: a UDP flow not (yet) a stream.
    pub udp: u64,
    /// `nf_conntrack_udp_timeout_stream`: a UDP flow answered and alive for 2 s.
    pub udp_stream: u64,
    /// `nf_conntrack_icmp_timeout`.
    pub icmp: u64,
    /// `nf_conntrack_icmpv6_timeout`.
    pub icmpv6: u64,
    /// `nf_conntrack_generic_timeout`: every other protocol.
    pub generic: u64,
}

impl Settings {
    /// Linux's defaults, as a new namespace has them (`nf_conntrack_max` aside, which
    /// the kernel sizes by the memory it has).
    pub fn kernel_defaults() -> Settings {
        let minutes = 60 * SECOND;
        Settings {
            max: 262_144,
            checksum: true,
            tcp_loose: true,
            tcp_be_liberal: false,
            tcp_ignore_invalid_rst: false,
            tcp_max_retrans: 3,
            tcp: TcpTimeouts {
                syn_sent: 2 * minutes,
                syn_recv: 60 * SECOND,
                established: 5 * 24 * 60 * minutes,
                fin_wait: 2 * minutes,
                close_wait: 60 * SECOND,
                last_ack: 30 * SECOND,
                time_wait: 2 * minutes,
                close: 10 * SECOND,
                syn_sent2: 2 * minutes,
                max_retrans: 5 * minutes,
                unacknowledged: 5 * minutes,
            },
            udp: 30 * SECOND,
            udp_stream: 120 * SECOND,
            icmp: 30 * SECOND,
            icmpv6: 30 * SECOND,
            generic: 600 * SECOND,
        }
    }

    /// The settings of the namespace the calling thread is in. Without the kernel's
    /// connection tracking loaded (no `/proc/sys/net/netfilter/nf_conntrack_max`), its
    /// defaults; a value that cannot be read or parsed is an error naming the sysctl.
    pub fn read() -> io::Result<Settings> {
        Settings::read_from(Path::new("/proc/sys/net/netfilter"))
    }

    /// The settings under `dir`, laid out as `/proc/sys/net/netfilter`.
    pub fn read_from(dir: &Path) -> io::Result<Settings> {
        let mut s = Settings::kernel_defaults();
        if !dir.join("nf_conntrack_max").exists() {
            return Ok(s);
        }
        let number = |name: &str| -> io::Result<u64> {
            let path = dir.join(format!("nf_conntrack_{name}"));
            let text = std::fs::read_to_string(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            text.trim().parse::<u64>().map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {:?} is not a number: {e}", path.display(), text.trim()),
                )
            })
        };
        let seconds = |name: &str| number(name).map(|n| n.saturating_mul(SECOND));
        s.max = u32::try_from(number("max")?).unwrap_or(u32::MAX);
        s.checksum = number("checksum")? != 0;
        s.tcp_loose = number("tcp_loose")? != 0;
        s.tcp_be_liberal = number("tcp_be_liberal")? != 0;
        if dir.join("nf_conntrack_tcp_ignore_invalid_rst").exists() {
            s.tcp_ignore_invalid_rst = number("tcp_ignore_invalid_rst")? != 0;
        }
        s.tcp_max_retrans = u32::try_from(number("tcp_max_retrans")?).unwrap_or(u32::MAX);
        s.tcp.syn_sent = seconds("tcp_timeout_syn_sent")?;
        s.tcp.syn_recv = seconds("tcp_timeout_syn_recv")?;
        s.tcp.established = seconds("tcp_timeout_established")?;
        s.tcp.fin_wait = seconds("tcp_timeout_fin_wait")?;
        s.tcp.close_wait = seconds("tcp_timeout_close_wait")?;
        s.tcp.last_ack = seconds("tcp_timeout_last_ack")?;
        s.tcp.time_wait = seconds("tcp_timeout_time_wait")?;
        s.tcp.close = seconds("tcp_timeout_close")?;
        s.tcp.max_retrans = seconds("tcp_timeout_max_retrans")?;
        s.tcp.unacknowledged = seconds("tcp_timeout_unacknowledged")?;
        s.udp = seconds("udp_timeout")?;
        s.udp_stream = seconds("udp_timeout_stream")?;
        s.icmp = seconds("icmp_timeout")?;
        s.icmpv6 = seconds("icmpv6_timeout")?;
        s.generic = seconds("generic_timeout")?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctls_are_read_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("fibre-ct-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, value: &str| {
            std::fs::write(dir.join(format!("nf_conntrack_{name}")), value).unwrap()
        };
        for (name, value) in [
            ("max", "1000"),
            ("checksum", "0"),
            ("tcp_loose", "0"),
            ("tcp_be_liberal", "1"),
            ("tcp_max_retrans", "5"),
            ("tcp_timeout_syn_sent", "120"),
            ("tcp_timeout_syn_recv", "60"),
            ("tcp_timeout_established", "3600"),
            ("tcp_timeout_fin_wait", "120"),
            ("tcp_timeout_close_wait", "60"),
            ("tcp_timeout_last_ack", "30"),
            ("tcp_timeout_time_wait", "120"),
            ("tcp_timeout_close", "10"),
            ("tcp_timeout_max_retrans", "300"),
            ("tcp_timeout_unacknowledged", "300"),
            ("udp_timeout", "31"),
            ("udp_timeout_stream", "180"),
            ("icmp_timeout", "30"),
            ("icmpv6_timeout", "30"),
            ("generic_timeout", "600"),
        ] {
            write(name, &format!("{value}\n"));
        }
        let s = Settings::read_from(&dir).unwrap();
        assert_eq!(s.max, 1000);
        assert!(!s.checksum && !s.tcp_loose && s.tcp_be_liberal);
        assert_eq!(s.tcp_max_retrans, 5);
        assert_eq!(s.tcp.established, 3600 * SECOND);
        assert_eq!((s.udp, s.udp_stream), (31 * SECOND, 180 * SECOND));
        write("udp_timeout", "soon");
        let e = Settings::read_from(&dir).unwrap_err().to_string();
        assert!(
            e.contains("nf_conntrack_udp_timeout") && e.contains("soon"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_namespace_reads() {
        // The machine's own settings read, whether or not conntrack is loaded.
        Settings::read().unwrap();
    }
}
