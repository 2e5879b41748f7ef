//! Where the `http` executor may connect: never to an internal address (loopback, private,
//! shared, link-local with the cloud metadata service, unique-local, multicast, broadcast,
//! unspecified, reserved, and the IPv6 forms that embed such an IPv4 address) unless the
//! operator's `--http-allow` lets the task's namespace reach that network.
//!
//! Names are judged after resolution, by the [`GuardedResolver`] the client connects through
//! (the connection uses only the addresses it kept, so a name cannot resolve one way for the
//! check and another for the connection). An IP literal in a URL never reaches a resolver:
//! [`literal_refusal`] judges it, for the task's URL and for every redirect's.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::executor::attempt::Scope;

/// The internal range `ip` lies in (`"loopback 127.0.0.0/8"`, ...), `None` for a public
/// address. An IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64, 6to4,
/// Teredo) is judged by the IPv4 address it reaches.
pub(crate) fn internal_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        _ if ip.is_unspecified() => "unspecified 0.0.0.0",
        (0, _) => "this network 0.0.0.0/8",
        (127, _) => "loopback 127.0.0.0/8",
        (10, _) => "private 10.0.0.0/8",
        (172, 16..=31) => "private 172.16.0.0/12",
        (192, 168) => "private 192.168.0.0/16",
        (100, 64..=127) => "shared address space 100.64.0.0/10",
        (169, 254) => "link-local 169.254.0.0/16 (cloud metadata)",
        _ if ip.is_broadcast() => "broadcast 255.255.255.255",
        (224..=239, _) => "multicast 224.0.0.0/4",
        (240..=255, _) => "reserved 240.0.0.0/4",
        _ => return None,
    })
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified ::");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    if let Some(v4) = embedded_v4(ip) {
        return internal_v4(v4);
    }
    let [first, second, third, ..] = ip.segments();
    Some(match first {
        // Translated by the operator's own NAT64, to wherever it routes.
        0x64 if second == 0xff9b && third == 1 => "local-use NAT64 64:ff9b:1::/48",
        _ if ip.is_multicast() => "multicast ff00::/8",
        _ if first & 0xffc0 == 0xfe80 => "link-local fe80::/10",
        _ if first & 0xffc0 == 0xfec0 => "site-local fec0::/10",
        _ if first & 0xfe00 == 0xfc00 => "unique-local fc00::/7",
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address stands for, where it embeds one: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`), 6to4 (`2002:AABB:CCDD::/48`) and Teredo (`2001:0::/32`, the client address inverted).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let last = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] | [0, 0, 0, 0, 0, 0, ..] => Some(last),
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(last),
        [0x2002, high, low, ..] => Some(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low))),
        [0x2001, 0, ..] => Some(Ipv4Addr::from(!u32::from(last))),
        _ => None,
    }
}

/// Parses a `--http-allow` network: a CIDR (`10.20.0.0/16`, `fd00::/8`) or one address.
pub(crate) fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if !text.contains('/') {
        return text
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|error| format!("{text:?} is neither a CIDR nor an address ({error})"));
    }
    let network: IpNet =
        text.parse().map_err(|error| format!("{text:?} is not a CIDR such as 10.20.0.0/16 ({error})"))?;
    if network.trunc() != network {
        return Err(format!("{text:?} has host bits set: did you mean {}?", network.trunc()));
    }
    Ok(network)
}

/// The `--http-allow` setting: the networks every namespace may reach, and each listed
/// namespace's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HttpAllow {
    every: Vec<IpNet>,
    by_namespace: BTreeMap<String, Vec<IpNet>>,
}

impl HttpAllow {
    pub(crate) fn insert(&mut self, scope: Scope, network: IpNet) {
        match scope {
            Scope::Every => self.every.push(network),
            Scope::Namespace(namespace) => self.by_namespace.entry(namespace).or_default().push(network),
        }
    }

    /// What a namespace without entries of its own may reach.
    pub(crate) fn common(&self) -> Networks {
        Networks(self.every.clone())
    }

    /// Each namespace with entries of its own, with what it may reach (its networks and every
    /// namespace's).
    pub(crate) fn namespaces(&self) -> impl Iterator<Item = (&str, Networks)> {
        self.by_namespace.iter().map(|(namespace, own)| {
            let mut networks = self.every.clone();
            networks.extend(own.iter().copied());
            (namespace.as_str(), Networks(networks))
        })
    }
}

/// The internal networks one client may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Networks(Vec<IpNet>);

impl Networks {
    /// `Err` with the internal range when `ip` is internal and no allowed network holds it
    /// (nor, for an IPv6 form of an IPv4 address, that IPv4 address).
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), &'static str> {
        let Some(range) = internal_range(ip) else { return Ok(()) };
        let v4 = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let allowed = |ip: IpAddr| self.0.iter().any(|network| network.contains(&ip));
        if allowed(ip) || v4.is_some_and(allowed) { Ok(()) } else { Err(range) }
    }
}

/// A destination the executor will not connect to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// An IP literal in the URL (the task's or a redirect's).
    #[error("{ip} is an internal address ({range})")]
    Literal { ip: IpAddr, range: &'static str },
    /// A name that resolves to internal addresses only.
    #[error("{host} resolves only to internal addresses: {}", list(.addresses))]
    Resolved { host: String, addresses: Vec<(IpAddr, &'static str)> },
}

fn list(addresses: &[(IpAddr, &'static str)]) -> String {
    addresses.iter().map(|(ip, range)| format!("{ip} ({range})")).collect::<Vec<_>>().join(", ")
}

/// The refusal of `url`'s host when it is an IP literal `networks` does not allow (names are
/// the resolver's to judge).
pub(crate) fn literal_refusal(url: &Url, networks: &Networks) -> Option<Refused> {
    let host = url.host_str()?;
    // The URL parser has normalised every IPv4 spelling (`0x7f.1`, `2130706433`) to dotted
    // decimal, and puts IPv6 literals in brackets.
    let ip: IpAddr = host.trim_start_matches('[').trim_end_matches(']').parse().ok()?;
    networks.check(ip).err().map(|range| Refused::Literal { ip, range })
}

/// The first [`Refused`] in an error's chain of sources.
pub(crate) fn refusal<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused);
        }
        current = error.source();
    }
    None
}

/// Resolves names with the system resolver and keeps only the addresses `networks` allows;
/// when none remain, resolution fails with [`Refused::Resolved`].
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    networks: Arc<Networks>,
}

impl GuardedResolver {
    pub(crate) fn new(networks: Arc<Networks>) -> GuardedResolver {
        GuardedResolver { networks }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let networks = self.networks.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: the client puts the URL's (or the scheme's) port in.
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = Vec::new();
            let mut kept = Vec::new();
            for addr in resolved {
                match networks.check(addr.ip()) {
                    Ok(()) => kept.push(addr),
                    Err(range) => refused.push((addr.ip(), range)),
                }
            }
            if kept.is_empty() && !refused.is_empty() {
                return Err(Box::new(Refused::Resolved { host, addresses: refused }) as _);
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

/// Redirects are followed (at most `max`) only to destinations `networks` allows: an IP literal
/// is judged here, a name by the resolver when the client connects.
pub(crate) fn redirect_policy(networks: Arc<Networks>, max: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        // The first of `previous` is the task's own URL.
        if attempt.previous().len() > max {
            let error = format!("more than {max} redirects");
            return attempt.error(error);
        }
        match literal_refusal(attempt.url(), &networks) {
            Some(refused) => attempt.error(refused),
            None => attempt.follow(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_classified() {
        let cases: &[(&str, Option<&str>)] = &[
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("172.15.255.255", None),
            ("172.32.0.1", None),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("169.253.1.1", None),
            ("192.169.0.1", None),
            ("223.255.255.255", None),
            ("0.0.0.0", Some("unspecified 0.0.0.0")),
            ("0.1.2.3", Some("this network 0.0.0.0/8")),
            ("127.0.0.1", Some("loopback 127.0.0.0/8")),
            ("127.255.255.254", Some("loopback 127.0.0.0/8")),
            ("10.0.0.1", Some("private 10.0.0.0/8")),
            ("172.16.0.1", Some("private 172.16.0.0/12")),
            ("172.31.255.255", Some("private 172.16.0.0/12")),
            ("192.168.1.1", Some("private 192.168.0.0/16")),
            ("100.64.0.1", Some("shared address space 100.64.0.0/10")),
            ("100.127.255.255", Some("shared address space 100.64.0.0/10")),
            ("169.254.169.254", Some("link-local 169.254.0.0/16 (cloud metadata)")),
            ("224.0.0.1", Some("multicast 224.0.0.0/4")),
            ("239.255.255.250", Some("multicast 224.0.0.0/4")),
            ("240.0.0.1", Some("reserved 240.0.0.0/4")),
            ("255.255.255.255", Some("broadcast 255.255.255.255")),
            ("2001:4860:4860::8888", None),
            ("2606:4700::1111", None),
            ("::", Some("unspecified ::")),
            ("::1", Some("loopback ::1")),
            ("fe80::1", Some("link-local fe80::/10")),
            ("febf::1", Some("link-local fe80::/10")),
            ("fec0::1", Some("site-local fec0::/10")),
            ("fc00::1", Some("unique-local fc00::/7")),
            ("fd12:3456::1", Some("unique-local fc00::/7")),
            ("ff02::1", Some("multicast ff00::/8")),
            ("::ffff:127.0.0.1", Some("loopback 127.0.0.0/8")),
            ("::ffff:169.254.169.254", Some("link-local 169.254.0.0/16 (cloud metadata)")),
            ("::ffff:10.1.2.3", Some("private 10.0.0.0/8")),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("loopback 127.0.0.0/8")),
            ("::8.8.8.8", None),
            ("64:ff9b::7f00:1", Some("loopback 127.0.0.0/8")),
            ("64:ff9b::a9fe:a9fe", Some("link-local 169.254.0.0/16 (cloud metadata)")),
            ("64:ff9b::808:808", None),
            ("64:ff9b:1::808:808", Some("local-use NAT64 64:ff9b:1::/48")),
            ("2002:7f00:1::1", Some("loopback 127.0.0.0/8")),
            ("2002:c0a8:0101::1", Some("private 192.168.0.0/16")),
            ("2002:808:808::1", None),
            // Teredo: the client address is stored inverted (127.0.0.1 → 80ff:fffe).
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Some("loopback 127.0.0.0/8")),
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", None),
        ];
        let mut wrong = Vec::new();
        for (text, want) in cases {
            let ip: IpAddr = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            let got = internal_range(ip);
            if got != *want {
                wrong.push(format!("{text}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn networks(list: &[&str]) -> Networks {
        Networks(list.iter().map(|n| parse_network(n).unwrap()).collect())
    }

    #[test]
    fn allowed_networks_open_internal_ranges_only_where_they_say() {
        let local = networks(&["127.0.0.0/8", "10.20.0.0/16", "fd00::/8"]);
        let none = Networks::default();
        let cases = [
            ("127.0.0.1", true, false),
            ("::ffff:127.0.0.1", true, false),
            ("::1", false, false),
            ("10.20.3.4", true, false),
            ("10.21.0.1", false, false),
            ("fd00::5", true, false),
            ("169.254.169.254", false, false),
            ("93.184.215.14", true, true),
        ];
        for (text, with_list, without) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(local.check(ip).is_ok(), with_list, "{text} with the list");
            assert_eq!(none.check(ip).is_ok(), without, "{text} without a list");
        }
    }

    #[test]
    fn networks_parse_as_cidrs_or_single_addresses() {
        assert_eq!(parse_network("10.20.0.0/16").unwrap().to_string(), "10.20.0.0/16");
        assert_eq!(parse_network("192.168.7.20").unwrap().to_string(), "192.168.7.20/32");
        assert_eq!(parse_network("fd00::1").unwrap().to_string(), "fd00::1/128");
        assert!(parse_network("10.20.1.0/16").unwrap_err().contains("did you mean 10.20.0.0/16"));
        assert!(parse_network("10.0.0.0/33").is_err());
        assert!(parse_network("intranet").is_err());
    }

    #[test]
    fn literal_hosts_are_judged_in_every_spelling() {
        let none = Networks::default();
        for url in [
            "http://127.0.0.1:8080/x",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "https://169.254.169.254/latest/meta-data/",
            "http://0.0.0.0:9/",
        ] {
            let url = Url::parse(url).unwrap();
            assert!(literal_refusal(&url, &none).is_some(), "{url} refused");
        }
        for url in ["http://example.com/", "http://8.8.8.8/", "http://localhost/"] {
            let url = Url::parse(url).unwrap();
            assert!(literal_refusal(&url, &none).is_none(), "{url} is not judged here");
        }
        let refused = literal_refusal(&Url::parse("http://[::1]:81/").unwrap(), &none).unwrap();
        assert_eq!(refused.to_string(), "::1 is an internal address (loopback ::1)");
    }

    #[tokio::test]
    async fn names_resolving_to_internal_addresses_only_are_refused() {
        let resolver = GuardedResolver::new(Arc::new(Networks::default()));
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(error) => error,
        };
        let refused = refusal(error.as_ref()).expect("a refusal");
        assert!(
            refused.to_string().starts_with("localhost resolves only to internal addresses: "),
            "{refused}"
        );
        assert!(refused.to_string().contains("127.0.0.1 (loopback 127.0.0.0/8)"), "{refused}");

        let allowed = GuardedResolver::new(Arc::new(networks(&["127.0.0.0/8"])));
        let addrs: Vec<SocketAddr> = match allowed.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => addrs.collect(),
            Err(error) => panic!("{error}"),
        };
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.ip().is_ipv4()), "{addrs:?}");
        assert!(!addrs.is_empty());
    }
}
