//! The address of the client behind the console's reverse proxies, for the login limit: the
//! console serves plain HTTP, so it sits behind a TLS proxy, and every request's peer is that
//! proxy. `X-Forwarded-For` is believed only from the proxies named in `--trusted-proxies`,
//! and only as far as they wrote it: walking it from the right, the first address that is not
//! a trusted proxy is the client (whatever a client wrote to the left of it is ignored).

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// The proxies whose `X-Forwarded-For` is believed: addresses or networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

/// An entry of `--trusted-proxies` that is no address or network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP address or network (10.0.0.0/8, 192.0.2.7, fd00::/8)")]
pub struct NotANetwork(String);

impl FromStr for TrustedProxies {
    type Err = NotANetwork;

    /// Addresses and networks separated by commas or spaces.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split([',', ' '])
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| NotANetwork(entry.to_owned()))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl TrustedProxies {
    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|network| network.contains(&address))
    }

    /// The client of a request from `peer` carrying the `X-Forwarded-For` values
    /// `forwarded_for`, in the order they arrived: the peer itself unless it is a trusted
    /// proxy; else the rightmost forwarded address that is not a trusted proxy (or, if every
    /// one is, the leftmost).
    pub fn client<'a>(
        &self,
        peer: Option<IpAddr>,
        forwarded_for: impl Iterator<Item = &'a str>,
    ) -> Option<IpAddr> {
        let peer = peer?;
        if !self.trusts(peer) {
            return Some(peer);
        }
        let hops: Vec<&str> = forwarded_for.flat_map(|value| value.split(',')).collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            // The hop a trusted proxy wrote; what a client wrote before it cannot be an address.
            let Ok(address) = hop.trim().parse::<IpAddr>() else {
                break;
            };
            client = address;
            if !self.trusts(address) {
                break;
            }
        }
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().expect("address"))
    }

    #[test]
    fn only_a_trusted_proxy_is_believed_and_only_for_what_it_wrote() {
        let proxies: TrustedProxies = "10.0.0.0/8, 192.0.2.7".parse().expect("networks");
        // No proxy in front: the peer is the client, whatever it claims.
        assert_eq!(
            proxies.client(ip("203.0.113.9"), ["198.51.100.1"].into_iter()),
            ip("203.0.113.9")
        );
        // Behind the proxy: the address it appended.
        assert_eq!(
            proxies.client(ip("10.1.2.3"), ["198.51.100.1"].into_iter()),
            ip("198.51.100.1")
        );
        // A client's own X-Forwarded-For is to the left of what the proxy appended.
        assert_eq!(
            proxies.client(
                ip("10.1.2.3"),
                ["1.1.1.1, 198.51.100.1", "192.0.2.7"].into_iter()
            ),
            ip("198.51.100.1")
        );
        // Garbage a client wrote stops the walk at the last address a proxy wrote.
        assert_eq!(
            proxies.client(ip("10.1.2.3"), ["not-an-ip, 198.51.100.1"].into_iter()),
            ip("198.51.100.1")
        );
        // A trusted proxy that forwarded nothing.
        assert_eq!(
            proxies.client(ip("10.1.2.3"), std::iter::empty()),
            ip("10.1.2.3")
        );
        assert_eq!(
            TrustedProxies::default().client(ip("10.1.2.3"), ["198.51.100.1"].into_iter()),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn entries_are_addresses_or_networks() {
        assert_eq!(
            "fd00::/8 ::1".parse::<TrustedProxies>().map(|p| p.0.len()),
            Ok(2)
        );
        assert_eq!(
            "10.0.0.0/8,proxy.internal".parse::<TrustedProxies>(),
            Err(NotANetwork("proxy.internal".to_owned()))
        );
    }
}
