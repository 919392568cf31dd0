//! The one rule both families judge a probed address by: who uses it, from the answers to a
//! check's probes (ARP requests for IPv4, duplicate-address-detection Neighbor Solicitations
//! for IPv6). Any host can forge any frame in any MAC's name, so only evidence a tenant cannot
//! fake cheaply counts: the address's own client answering settles it; otherwise one host must
//! answer every one of the [`PROBE_NUM`] probes, must not answer for addresses nobody holds (a
//! proxy responder), and, where the cap applies, must not hold
//! [`MAX_CONFLICTS_PER_HOST`] of the pool's addresses in conflict already.
//!
//! What differs per family (how probes are sent, which addresses nobody holds, where conflicts
//! are kept, which proxies are remembered) comes in through [`Inquiry`]; what the verdict leads
//! to (withholding, reporting) stays with each server's probe module.

use vmdhcp_core::pool::MAX_CONFLICTS_PER_HOST;
use vmdhcp_core::{MacAddr, NamespacedName};

use super::{Answers, PROBE_NUM, PROXY_CANARY_ANSWERS};

/// What a check found out about who uses an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The address's own client answered, at any time in the window: it uses the address.
    Holder,
    /// Another host answered every probe, and not for addresses nobody holds: it uses it.
    Taken(MacAddr),
    /// The host that answered also answers for addresses nobody holds (a router with proxy ARP
    /// or `proxy_ndp`, or a tenant answering everything): not a user of the address.
    Proxy(MacAddr),
    /// The host that answered already holds [`MAX_CONFLICTS_PER_HOST`] of the pool's addresses
    /// in conflict: its answer makes no more.
    Capped(MacAddr),
    /// Nobody answered every probe (a host answering with a new MAC each time is nobody).
    Nobody,
}

/// One address of a pool to check, and how: what each family's server asks its probe module.
#[derive(Clone, Copy, Debug)]
pub struct Check<'a, A> {
    /// Where it is probed.
    pub interface: &'a str,
    /// Its pool.
    pub pool: &'a NamespacedName,
    /// The address.
    pub ip: A,
    /// The client it is reserved for, whose answer settles the check.
    pub holder: Option<MacAddr>,
    /// Whether [`MAX_CONFLICTS_PER_HOST`] applies (not when rechecking a recorded conflict).
    pub cap: bool,
}

/// One address to judge, and what its family knows of the pool.
pub struct Inquiry<'a, A> {
    /// The address.
    pub ip: A,
    /// The client it is reserved for, whose answer settles the check.
    pub holder: Option<MacAddr>,
    /// Whether the probe may end as soon as another host answered every probe (IPv6: a client
    /// that declined solicits again within a second), rather than listening out the window for
    /// the holder (IPv4).
    pub end_when_taken: bool,
    /// A host already known on this pool as a proxy responder: its answer makes no conflict,
    /// and costs no canary probe.
    pub known_proxy: &'a dyn Fn(MacAddr) -> bool,
    /// Addresses of the pool nobody should answer for, to ask the answering host about
    /// (computed only when a host answered).
    pub canaries: &'a dyn Fn() -> Vec<A>,
    /// Where the cap applies (not when rechecking a recorded conflict): how many of the pool's
    /// other addresses a host holds in conflict already.
    pub held: Option<&'a dyn Fn(MacAddr) -> usize>,
}

/// Finds out who uses `inquiry.ip` with `probe` (addresses to ask about, and when what was
/// heard is enough to stop listening): first the address, then, if another host answered every
/// probe, the canaries. Blocking for as long as `probe` is: up to two probe windows.
pub fn weigh<A, E>(
    probe: impl Fn(&[A], &dyn Fn(&Answers<A>) -> bool) -> Result<Answers<A>, E>,
    inquiry: &Inquiry<'_, A>,
) -> Result<Evidence, E>
where
    A: Copy + PartialEq,
{
    let (ip, holder) = (inquiry.ip, inquiry.holder);
    let holder_heard = |a: &Answers<A>| holder.is_some_and(|h| a.answered(h, ip));
    let taken = |a: &Answers<A>| a.steady(ip, PROBE_NUM).any(|m| Some(m) != holder);
    let answers = if inquiry.end_when_taken {
        probe(&[ip], &|a: &Answers<A>| holder_heard(a) || taken(a))?
    } else {
        probe(&[ip], &holder_heard)?
    };
    if holder_heard(&answers) {
        return Ok(Evidence::Holder);
    }
    let mut steady = answers.steady(ip, PROBE_NUM).filter(|m| Some(*m) != holder);
    let Some(first) = steady.next() else {
        return Ok(Evidence::Nobody);
    };
    let Some(other) = std::iter::once(first)
        .chain(steady)
        .find(|m| !(inquiry.known_proxy)(*m))
    else {
        return Ok(Evidence::Proxy(first));
    };
    let canaries = (inquiry.canaries)();
    if !canaries.is_empty() {
        let enough = |a: &Answers<A>| a.addresses_of(other) >= PROXY_CANARY_ANSWERS;
        let heard = probe(&canaries, &enough)?;
        if enough(&heard) {
            return Ok(Evidence::Proxy(other));
        }
    }
    if inquiry
        .held
        .is_some_and(|held| held(other) >= MAX_CONFLICTS_PER_HOST)
    {
        return Ok(Evidence::Capped(other));
    }
    Ok(Evidence::Taken(other))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arp::Heard;
    use std::cell::RefCell;
    use std::net::Ipv4Addr;

    const VM: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OTHER: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const THIRD: MacAddr = MacAddr([2, 0, 0, 0, 0, 3]);
    const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const CANARY: [Ipv4Addr; 4] = [
        Ipv4Addr::new(192, 0, 2, 100),
        Ipv4Addr::new(192, 0, 2, 101),
        Ipv4Addr::new(192, 0, 2, 102),
        Ipv4Addr::new(192, 0, 2, 103),
    ];
    const EVERY_ROUND: u8 = (1 << PROBE_NUM) - 1;

    /// A network that answers each asked address with `heard` (every host in the rounds given),
    /// recording what was asked.
    struct Network {
        heard: Vec<Heard<Ipv4Addr>>,
        asked: RefCell<Vec<Vec<Ipv4Addr>>>,
    }

    impl Network {
        fn new(heard: &[(MacAddr, Ipv4Addr, u8)]) -> Self {
            Network {
                heard: heard
                    .iter()
                    .map(|&(mac, ip, rounds)| Heard { mac, ip, rounds })
                    .collect(),
                asked: RefCell::default(),
            }
        }

        fn probe(
            &self,
            ips: &[Ipv4Addr],
            _done: &dyn Fn(&Answers<Ipv4Addr>) -> bool,
        ) -> Result<Answers<Ipv4Addr>, ()> {
            self.asked.borrow_mut().push(ips.to_vec());
            let mut answers = Answers::default();
            for h in self.heard.iter().filter(|h| ips.contains(&h.ip)) {
                for round in 0..PROBE_NUM {
                    if h.rounds & (1 << round) != 0 {
                        answers.record(h.mac, h.ip, round);
                    }
                }
            }
            Ok(answers)
        }
    }

    fn judge(net: &Network, known: &[MacAddr], held: Option<usize>) -> Evidence {
        let known_proxy = |m: MacAddr| known.contains(&m);
        let canaries = || CANARY.to_vec();
        let held_by = move |_: MacAddr| held.unwrap_or(0);
        let inquiry = Inquiry {
            ip: IP,
            holder: Some(VM),
            end_when_taken: false,
            known_proxy: &known_proxy,
            canaries: &canaries,
            held: held.map(|_| &held_by as &dyn Fn(MacAddr) -> usize),
        };
        weigh(|ips, done| net.probe(ips, done), &inquiry).unwrap()
    }

    #[test]
    fn the_holder_settles_it_and_one_answer_is_not_a_user() {
        let holder = Network::new(&[(VM, IP, 0b1), (OTHER, IP, EVERY_ROUND)]);
        assert_eq!(judge(&holder, &[], None), Evidence::Holder);
        assert_eq!(holder.asked.borrow().len(), 1, "no canaries once settled");
        let once = Network::new(&[(OTHER, IP, 0b1)]);
        assert_eq!(judge(&once, &[], None), Evidence::Nobody);
    }

    #[test]
    fn a_host_answering_every_probe_takes_it_unless_it_answers_canaries_or_is_at_its_cap() {
        let taken = Network::new(&[(OTHER, IP, EVERY_ROUND)]);
        assert_eq!(judge(&taken, &[], None), Evidence::Taken(OTHER));
        assert_eq!(taken.asked.borrow()[1], CANARY, "the canaries asked");
        let proxy = Network::new(&[
            (OTHER, IP, EVERY_ROUND),
            (OTHER, CANARY[0], 0b1),
            (OTHER, CANARY[3], 0b1),
        ]);
        assert_eq!(judge(&proxy, &[], None), Evidence::Proxy(OTHER));
        // One canary is not enough to be a proxy.
        let one = Network::new(&[(OTHER, IP, EVERY_ROUND), (OTHER, CANARY[0], 0b1)]);
        assert_eq!(judge(&one, &[], None), Evidence::Taken(OTHER));
        assert_eq!(
            judge(&taken, &[], Some(MAX_CONFLICTS_PER_HOST)),
            Evidence::Capped(OTHER)
        );
        assert_eq!(
            judge(&taken, &[], Some(MAX_CONFLICTS_PER_HOST - 1)),
            Evidence::Taken(OTHER)
        );
    }

    #[test]
    fn a_known_proxy_costs_no_canary_and_hides_no_other_host() {
        let alone = Network::new(&[(OTHER, IP, EVERY_ROUND)]);
        assert_eq!(judge(&alone, &[OTHER], None), Evidence::Proxy(OTHER));
        assert_eq!(alone.asked.borrow().len(), 1);
        let beside = Network::new(&[(OTHER, IP, EVERY_ROUND), (THIRD, IP, EVERY_ROUND)]);
        assert_eq!(judge(&beside, &[OTHER], None), Evidence::Taken(THIRD));
    }
}
