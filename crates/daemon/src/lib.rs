//! `fibre daemon` as a library: the kernel's routing state mirrored over rtnetlink and
//! followed (`daemon`: the event loop, one thread owning the mirror), the control protocol
//! and the commands it answers (`commands`), the metrics (`metrics`), the forwarding
//! workers started and supervised (`forwarding`), the firewall mirrored beside them
//! (`firewall`), the connection table shown (`conntrack`), and the control socket made
//! safely (`control_socket`). The `fibre` command is a thin layer over it: it parses the
//! arguments and calls [`run`] or [`ctl`], and answers the commands on a configuration
//! file as the daemon answers them ([`route_get`], [`route_show`], [`rule_show`], ...).

#![forbid(unsafe_code)]

mod commands;
mod conntrack;
mod control_socket;
mod daemon;
mod firewall;
mod forwarding;
mod metrics;

pub use commands::{
    addr_show, families, link_show, nexthop_show, query_of, route_get, route_show, rule_show, Done,
    Out,
};
pub use daemon::{ctl, run, CtlArgs, DaemonArgs, Io};
