//! An IP address's text form, made once per connection for the rate
//! limiter's per-address key and `X-Forwarded-For`: IPv4 (nearly every
//! connection) without `core::fmt`, and read per request as a `&str` with no
//! further check (an inline buffer would need a UTF-8 check per read).
use std::net::IpAddr;

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
}
