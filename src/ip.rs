//! An IP address's text form on the stack, for the rate limiter's per-address
//! key and `X-Forwarded-For`: no allocation, and IPv4 (nearly every request)
//! without `core::fmt`, which cost ~3 000 instructions per request for the
//! two uses.
use std::io::Write;
use std::net::IpAddr;

/// The text form of one address.
#[derive(Clone)]
pub(crate) struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl IpText {
    pub(crate) fn new(ip: IpAddr) -> Self {
        let mut text = IpText {
            buf: [0; 48],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                // At most 15 bytes.
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b".");
                    }
                    text.push(itoa::Buffer::new().format(octet).as_bytes());
                }
            }
            IpAddr::V6(_) => {
                // 45 bytes is the longest text form of an address.
                let mut cursor: &mut [u8] = &mut text.buf;
                if write!(cursor, "{ip}").is_ok() {
                    text.len = 48 - cursor.len();
                }
            }
        }
        text
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl std::fmt::Debug for IpText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
    }
}
