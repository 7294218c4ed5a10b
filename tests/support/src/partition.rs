//! A network partition of one pod of the test bed's real node, made of packet drops on the
//! loopback interface with `tc` (needs root, as the test bed's node does).
//!
//! The real node's pods share the host's network namespace, each on a loopback address of its
//! own, so a pod is cut off by dropping every packet from or to its address: an HTB root qdisc
//! sends matching packets to a class whose queue holds none (`pfifo limit 0`), and everything
//! else to a class far faster than loopback. (The kernels the test bed runs on may lack
//! `tc`'s drop action, and every other qdisc but HTB and pfifo.) Kept open: the pod's traffic to
//! itself, and clients on 127.0.0.1 (the test) connecting to one port of the pod, so that a
//! test can hold a client session across the partition.
//!
//! Connections open when the partition starts stay open but carry nothing, as in a real
//! partition: each side notices only by its own timeouts.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::Context as _;

/// The pod's address cut off until this is dropped (or [`Partition::heal`]).
#[derive(Debug)]
pub struct Partition {
    healed: bool,
}

impl Partition {
    /// Cuts `pod` off from every other address, but for connections from 127.0.0.1 to its
    /// `kept_port`.
    pub fn isolate(pod: Ipv4Addr, kept_port: u16) -> anyhow::Result<Partition> {
        let partition = Partition { healed: false };
        let ip = format!("{pod}/32");
        let port = kept_port.to_string();
        let host = "127.0.0.1/32";
        let setup: Vec<Vec<&str>> = vec![
            vec![
                "qdisc", "replace", "dev", "lo", "root", "handle", "1:", "htb", "default", "1",
            ],
            vec![
                "class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate",
                "100gbit",
            ],
            vec![
                "class", "add", "dev", "lo", "parent", "1:", "classid", "1:2", "htb", "rate",
                "8bit",
            ],
            vec![
                "qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "20:", "pfifo", "limit",
                "0",
            ],
        ];
        let pass = "1:1";
        let drop = "1:2";
        let rules: Vec<(&str, Vec<&str>, &str)> = vec![
            ("1", vec!["src", &ip, "dst", &ip], pass),
            ("2", vec!["src", &ip, "sport", &port, "dst", host], pass),
            ("3", vec!["src", host, "dst", &ip, "dport", &port], pass),
            ("10", vec!["src", &ip], drop),
            ("11", vec!["dst", &ip], drop),
        ];
        for arguments in setup {
            tc(&arguments)?;
        }
        for (priority, matches, class) in rules {
            tc(&filter(priority, &matches, class))?;
        }
        Ok(partition)
    }

    /// Ends the partition: packets flow again.
    pub fn heal(mut self) -> anyhow::Result<()> {
        self.healed = true;
        tc(&["qdisc", "del", "dev", "lo", "root"])
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if !self.healed {
            let _ = tc(&["qdisc", "del", "dev", "lo", "root"]);
        }
    }
}

/// `tc filter add` of one u32 rule: `matches` are pairs of a field (`src`, `dst`, `sport`,
/// `dport`) and its value, all of which must hold.
fn filter<'a>(priority: &'a str, matches: &[&'a str], class: &'a str) -> Vec<&'a str> {
    let mut arguments = vec![
        "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", priority, "u32",
    ];
    for pair in matches.chunks(2) {
        arguments.extend(["match", "ip", pair[0], pair[1]]);
        if pair[0].ends_with("port") {
            arguments.push("0xffff");
        }
    }
    arguments.extend(["flowid", class]);
    arguments
}

fn tc(arguments: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("tc")
        .args(arguments)
        .output()
        .context("running tc (from iproute2)")?;
    anyhow::ensure!(
        output.status.success(),
        "tc {}: {}",
        arguments.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_matches_every_pair_and_ports_whole() {
        let arguments = filter("2", &["src", "127.77.0.5/32", "sport", "5432"], "1:1");
        assert_eq!(
            arguments.join(" "),
            "filter add dev lo parent 1: protocol ip prio 2 u32 match ip src 127.77.0.5/32 match ip sport 5432 0xffff flowid 1:1"
        );
    }
}
