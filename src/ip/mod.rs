//! Client addresses: an address's text form, made once per connection for
//! the access log and `X-Forwarded-For` ([`IpText`]); the key it is rate
//! limited by ([`ClientAddr`]: IPv6 per /64); and which proxies' claims
//! about the client are believed ([`forwarded`]).
//!
//! IPv4 (nearly every connection) is written without `core::fmt`, and the
//! text is read per request as a `&str` with no further check (an inline
//! buffer would need a UTF-8 check per read).
mod forwarded;

pub(crate) use forwarded::Client;
pub use forwarded::TrustedProxies;

use std::net::{IpAddr, Ipv6Addr};

/// The text form of one address.
#[derive(Clone, Debug)]
pub(crate) struct IpText(Box<str>);

impl IpText {
    /// An IPv4 client that reached a dual-stack (`[::]`) listener arrives as
    /// `::ffff:a.b.c.d`: written as `a.b.c.d`, so that its rate-limit key and
    /// `X-Forwarded-For` do not depend on the listener's address family.
    pub(crate) fn new(ip: IpAddr) -> Self {
        let text = match ip.to_canonical() {
            IpAddr::V4(v4) => {
                // At most 15 bytes.
                let mut text = String::with_capacity(15);
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push('.');
                    }
                    text.push_str(itoa::Buffer::new().format(octet));
                }
                text
            }
            IpAddr::V6(v6) => v6.to_string(),
        };
        IpText(text.into_boxed_str())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// A client's address as the gateway counts and names it: its text (the
/// access log, `X-Forwarded-For`) and its rate-limit key. An IPv6 client
/// is keyed by its /64, the block one subscriber is usually given (a single
/// host can take any address in it); IPv4, and IPv4-mapped IPv6, by the
/// address.
#[derive(Clone, Debug)]
pub(crate) struct ClientAddr {
    /// The address, IPv4-mapped IPv6 as IPv4.
    ip: IpAddr,
    text: IpText,
    /// IPv6 only: the /64 prefix's text (`2001:db8:1:2::/64`).
    prefix: Option<Box<str>>,
}

impl ClientAddr {
    pub(crate) fn new(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        let prefix = match ip {
            IpAddr::V4(_) => None,
            IpAddr::V6(v6) => Some(v6_prefix_key(v6).into_boxed_str()),
        };
        ClientAddr {
            ip,
            text: IpText::new(ip),
            prefix,
        }
    }

    /// The address as text.
    pub(crate) fn as_str(&self) -> &str {
        self.text.as_str()
    }

    /// The address (IPv4-mapped IPv6 as IPv4).
    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The key of its rate-limit buckets (`client_ip` policies and the
    /// authentication-failure guard).
    pub(crate) fn limit_key(&self) -> &str {
        self.prefix.as_deref().unwrap_or(self.text.as_str())
    }
}

/// The /64 that holds `v6`, as `network/64` text.
fn v6_prefix_key(v6: Ipv6Addr) -> String {
    let network = Ipv6Addr::from(u128::from(v6) & !(u128::MAX >> 64));
    format!("{network}/64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_families_format_as_display_does() {
        for ip in [
            "0.0.0.0",
            "192.0.2.7",
            "255.255.255.255",
            "10.0.0.1",
            "::1",
            "2001:db8::8a2e:370:7334",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_str(), ip.to_canonical().to_string());
        }
    }

    #[test]
    fn ipv4_mapped_addresses_are_written_as_ipv4() {
        for (mapped, v4) in [
            ("::ffff:192.0.2.1", "192.0.2.1"),
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("::ffff:c000:0201", "192.0.2.1"),
        ] {
            let ip: IpAddr = mapped.parse().unwrap();
            assert_eq!(IpText::new(ip).as_str(), v4, "{mapped}");
        }
        // Not mapped: left alone (IPv4-compatible `::a.b.c.d` is deprecated, not IPv4).
        let ip: IpAddr = "::192.0.2.1".parse().unwrap();
        assert_eq!(IpText::new(ip).as_str(), "::c000:201");
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64_and_ipv4_by_the_address() {
        for (ip, text, key) in [
            ("192.0.2.7", "192.0.2.7", "192.0.2.7"),
            ("::ffff:192.0.2.7", "192.0.2.7", "192.0.2.7"),
            ("2001:db8:1:2::1", "2001:db8:1:2::1", "2001:db8:1:2::/64"),
            (
                "2001:db8:1:2:ffff:ffff:ffff:ffff",
                "2001:db8:1:2:ffff:ffff:ffff:ffff",
                "2001:db8:1:2::/64",
            ),
            ("2001:db8:1:3::1", "2001:db8:1:3::1", "2001:db8:1:3::/64"),
            ("::1", "::1", "::/64"),
            ("fe80::1:2:3:4", "fe80::1:2:3:4", "fe80::/64"),
        ] {
            let addr = ClientAddr::new(ip.parse().unwrap());
            assert_eq!((addr.as_str(), addr.limit_key()), (text, key), "{ip}");
        }
        // Two hosts of one /64 share a key; the next /64 does not.
        let key = |ip: &str| ClientAddr::new(ip.parse().unwrap()).limit_key().to_owned();
        assert_eq!(key("2001:db8::1"), key("2001:db8::abcd:1"));
        assert_ne!(key("2001:db8::1"), key("2001:db8:0:1::1"));
    }
}
