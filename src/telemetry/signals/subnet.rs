//! Denials by subnet: where a denied descriptor's value is an IP address (any key;
//! Envoy's `remote_address`, or `masked_remote_address` at /24 or narrower), its
//! denials are also counted for its /24 (IPv4) or /64 (IPv6), with the distinct
//! addresses denied in it. Fifty addresses of one network each a little over the
//! limit never reach the top offenders one by one; their subnet does.
//!
//! Like [`super::super::top`], each of [`SUB_WINDOWS`] sub-windows of [`SUB_WINDOW`]
//! holds at most [`CAPACITY`] subnets (Space-Saving by denials: a new subnet takes
//! the smallest one's place and inherits its count), so the view covers the last 60
//! to 70 s in bounded memory. Distinct addresses are a 256-bit map per subnet: exact
//! for IPv4 (one bit per last octet), a linear-counting estimate for IPv6. Only
//! denials come here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use crate::algorithm::{Micros, SECOND};

/// Subnets per sub-window.
pub const CAPACITY: usize = 256;
pub const SUB_WINDOW: Micros = 10 * SECOND;
pub const SUB_WINDOWS: usize = 7;
/// Subnets reported per rule and ranking.
pub const TOP: usize = 10;

/// The subnet of a descriptor value, as `a.b.c.0/24` or `x:x:x:x::/64` (RFC 5952's
/// shortest form), and the bit of the address within it; `None` for a value that is
/// no address (or a network wider than the subnet).
pub fn subnet_of(value: &str) -> Option<(String, u8)> {
    let (addr, prefix) = match value.split_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
        None => (value, None),
    };
    match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => {
            if prefix.is_some_and(|p| p < 24) {
                return None;
            }
            let [a, b, c, d] = v4.octets();
            Some((format!("{a}.{b}.{c}.0/24"), d))
        }
        IpAddr::V6(v6) => {
            if prefix.is_some_and(|p| p < 64) {
                return None;
            }
            let s = v6.segments();
            let low = u64::from(s[4]) << 48
                | u64::from(s[5]) << 32
                | u64::from(s[6]) << 16
                | u64::from(s[7]);
            let bit = (mix(low) >> 56) as u8;
            // Written as RFC 5952 writes it (`2001:db8::/64`, `::/64`), as an
            // operator would type it into a query.
            let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
            Some((format!("{net}/64"), bit))
        }
    }
}

/// splitmix64's finaliser: every bit of the interface id moves the bit chosen, as
/// linear counting needs (a hash whose low bits follow the input's would count
/// consecutive addresses as if none collided).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Default)]
struct Entry {
    denials: u64,
    addresses: [u64; 4],
    v6: bool,
}

impl Entry {
    fn distinct(&self) -> u64 {
        let set: u32 = self.addresses.iter().map(|w| w.count_ones()).sum();
        if !self.v6 || set == 0 {
            return u64::from(set);
        }
        // Linear counting: n = -m ln(empty / m).
        let m = 256.0_f64;
        let empty = (256 - set).max(1) as f64;
        (-m * (empty / m).ln()).round() as u64
    }
}

#[derive(Debug)]
struct Slot {
    epoch: u64,
    subnets: HashMap<String, Entry, ahash::RandomState>,
}

/// One rule's denials by subnet over a sliding minute.
#[derive(Debug)]
pub struct Subnets {
    slots: Vec<Mutex<Slot>>,
}

impl Default for Subnets {
    fn default() -> Self {
        Subnets {
            slots: (0..SUB_WINDOWS)
                .map(|_| {
                    Mutex::new(Slot {
                        epoch: u64::MAX,
                        subnets: HashMap::default(),
                    })
                })
                .collect(),
        }
    }
}

/// A subnet's denials and distinct addresses over the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Subnet {
    pub subnet: String,
    pub denials: u64,
    pub addresses: u64,
}

/// The two rankings of a rule's subnets.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopSubnets {
    pub by_denials: Vec<Subnet>,
    pub by_addresses: Vec<Subnet>,
}

impl Subnets {
    /// Counts a denial of the address at `bit` of `subnet`.
    pub fn add(&self, now: Micros, subnet: &str, bit: u8, v6: bool) {
        let epoch = now / SUB_WINDOW;
        let mut slot = self.slots[(epoch % SUB_WINDOWS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.epoch != epoch {
            slot.epoch = epoch;
            slot.subnets = HashMap::default();
        }
        if !slot.subnets.contains_key(subnet) && slot.subnets.len() >= CAPACITY {
            let min = slot
                .subnets
                .iter()
                .min_by_key(|(_, e)| e.denials)
                .map(|(k, e)| (k.clone(), e.denials));
            if let Some((k, denials)) = min {
                slot.subnets.remove(&k);
                slot.subnets.insert(
                    subnet.to_string(),
                    Entry {
                        denials,
                        ..Entry::default()
                    },
                );
            }
        }
        let e = slot.subnets.entry(subnet.to_string()).or_default();
        e.denials += 1;
        e.v6 = v6;
        e.addresses[usize::from(bit / 64)] |= 1 << (bit % 64);
    }

    /// The top subnets by denials and by distinct addresses in the window ending at
    /// `now`.
    pub fn top(&self, now: Micros) -> TopSubnets {
        let epoch = now / SUB_WINDOW;
        let mut merged: HashMap<String, Entry> = HashMap::new();
        for m in &self.slots {
            let slot = m.lock().unwrap_or_else(|p| p.into_inner());
            if slot.epoch > epoch || epoch - slot.epoch >= SUB_WINDOWS as u64 {
                continue;
            }
            for (k, e) in &slot.subnets {
                let into = merged.entry(k.clone()).or_default();
                into.denials += e.denials;
                into.v6 = e.v6;
                for (a, b) in into.addresses.iter_mut().zip(e.addresses) {
                    *a |= b;
                }
            }
        }
        let all: Vec<Subnet> = merged
            .into_iter()
            .map(|(subnet, e)| Subnet {
                addresses: e.distinct(),
                denials: e.denials,
                subnet,
            })
            .collect();
        let ranked = |key: fn(&Subnet) -> u64| {
            let mut v = all.clone();
            v.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.subnet.cmp(&b.subnet)));
            v.truncate(TOP);
            v
        };
        TopSubnets {
            by_denials: ranked(|s| s.denials),
            by_addresses: ranked(|s| s.addresses),
        }
    }

    /// Subnets held over every sub-window; never more than `SUB_WINDOWS * CAPACITY`.
    pub fn entries(&self) -> usize {
        self.slots
            .iter()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).subnets.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_700_000_000 * SECOND;

    #[test]
    fn addresses_and_narrow_networks_have_a_subnet() {
        assert_eq!(subnet_of("10.1.2.3"), Some(("10.1.2.0/24".into(), 3)));
        assert_eq!(subnet_of("10.1.2.0/24"), Some(("10.1.2.0/24".into(), 0)));
        assert_eq!(subnet_of("10.1.2.128/25").unwrap().0, "10.1.2.0/24");
        assert_eq!(subnet_of("10.1.0.0/16"), None);
        assert_eq!(
            subnet_of("2001:db8:1:2:3:4:5:6").unwrap().0,
            "2001:db8:1:2::/64"
        );
        assert_eq!(subnet_of("2001:db8::/32"), None);
        // The shortest form, zeros run together, as operators write it.
        assert_eq!(subnet_of("2001:db8::5").unwrap().0, "2001:db8::/64");
        assert_eq!(subnet_of("::1").unwrap().0, "::/64");
        assert_eq!(subnet_of("fe80:0:0:0:1::1").unwrap().0, "fe80::/64");
        assert_eq!(subnet_of("0:0:1:2::9").unwrap().0, "0:0:1:2::/64");
        for no in ["", "tenant-a", "10.1.2", "10.1.2.3/x", "/24", "300.1.2.3"] {
            assert_eq!(subnet_of(no), None, "{no}");
        }
    }

    #[test]
    fn distinct_addresses_are_counted_and_memory_is_bounded() {
        let s = Subnets::default();
        for i in 0..50u8 {
            let (net, bit) = subnet_of(&format!("10.1.2.{i}")).unwrap();
            s.add(T0, &net, bit, false);
            s.add(T0, &net, bit, false);
        }
        for i in 0..200u64 {
            let addr = format!("2001:db8:0:1::{:x}", i + 1);
            let (net, bit) = subnet_of(&addr).unwrap();
            s.add(T0, &net, bit, true);
        }
        let top = s.top(T0);
        assert_eq!(top.by_denials[0].subnet, "2001:db8:0:1::/64");
        assert_eq!(top.by_denials[0].denials, 200);
        let v6 = top.by_denials[0].addresses;
        assert!((150..=260).contains(&v6), "an estimate near 200: {v6}");
        let v4 = &top.by_denials[1];
        assert_eq!(
            (v4.subnet.as_str(), v4.denials, v4.addresses),
            ("10.1.2.0/24", 100, 50)
        );

        // A flood of distinct subnets never holds more than the capacity.
        for i in 0..100_000u32 {
            let addr = std::net::Ipv4Addr::from(i << 8);
            let (net, bit) = subnet_of(&addr.to_string()).unwrap();
            s.add(T0, &net, bit, false);
        }
        assert!(s.entries() <= CAPACITY, "{}", s.entries());
        // The window slides: 70 s later nothing is left.
        assert_eq!(s.top(T0 + 70 * SECOND), TopSubnets::default());
    }
}
