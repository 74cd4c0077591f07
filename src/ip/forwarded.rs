//! Which proxies may say who the client is ([`TrustedProxies`]), and the
//! client a request is from once their word is taken ([`Client`]).
//!
//! Only a trusted connection's header is read, and only as far as trusted
//! addresses go: each proxy appends the address it received the request
//! from, so walking the list from the right, every trusted entry vouches
//! for the one on its left, and the first untrusted entry is the client.
//! Whatever stands left of it was written by the client and is never read.
use http::header::{HeaderMap, HeaderName};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::ClientAddr;

/// `[server.client_ip] trusted_proxies`: the networks whose connections
/// may say who the client is (in a PROXY protocol header, or in the
/// configured `X-Forwarded-For`-style field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Box<[IpNet]>);

impl TrustedProxies {
    /// The networks given.
    pub fn new(networks: Vec<IpNet>) -> Self {
        TrustedProxies(networks.into_boxed_slice())
    }

    /// One entry as the configuration writes it: a network in CIDR form
    /// (`10.0.0.0/8`, `2001:db8::/32`) or one address. A network with bits
    /// set past its prefix is refused (`10.0.0.1/8` is likely a typo for
    /// either `10.0.0.0/8` or `10.0.0.1/32`); IPv4-mapped IPv6 is taken as
    /// IPv4, as client addresses are.
    pub fn parse_entry(text: &str) -> Result<IpNet, String> {
        let net = match text.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => match text.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(ip),
                Err(_) => {
                    return Err(format!(
                        "invalid network {text:?}: expected CIDR (\"10.0.0.0/8\", \"2001:db8::/32\") or an address"
                    ))
                }
            },
        };
        if net.addr() != net.network() {
            return Err(format!(
                "{text:?} has bits set past its /{} prefix: write {}/{} (the network) or a single address",
                net.prefix_len(),
                net.network(),
                net.prefix_len()
            ));
        }
        Ok(match net {
            IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
                Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net),
                None => net,
            },
            net => net,
        })
    }

    /// Whether no network is trusted (the default).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is in one of the networks (IPv4-mapped IPv6 matched as
    /// IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// The client a request is from.
#[derive(Debug)]
pub(crate) enum Client<'a> {
    /// The connection's own address: its source is not trusted, or its
    /// header named no one (absent, empty, or not a list of addresses).
    Connection(&'a ClientAddr),
    /// The client a trusted source's header named.
    Forwarded(Box<Forwarded>),
}

/// A client named by trusted proxies, and the chain that vouches for it.
#[derive(Debug)]
pub(crate) struct Forwarded {
    client: ClientAddr,
    /// `X-Forwarded-For` for the upstream: the client, the trusted proxies
    /// after it, then the connection's source.
    chain: String,
}

impl<'a> Client<'a> {
    /// The client of a request whose connection speaks for `source`. From
    /// a trusted source, the rightmost address of `header` (every field
    /// line, in order) that is not itself trusted; if every one is trusted,
    /// the leftmost. From an untrusted source, or when the header is absent
    /// or holds an entry that is not an address (in the part read), the
    /// source itself. Allocates only for a trusted source's header.
    pub(crate) fn of(
        source: &'a ClientAddr,
        source_trusted: bool,
        headers: &HeaderMap,
        header: &HeaderName,
        trusted: &TrustedProxies,
    ) -> Self {
        if !source_trusted {
            return Client::Connection(source);
        }
        // Trusted entries right of the client, right to left.
        let mut hops: Vec<IpAddr> = Vec::new();
        let mut client = None;
        'walk: for value in headers.get_all(header).iter().rev() {
            for entry in value.as_bytes().rsplit(|&b| b == b',') {
                if entry.iter().all(|&b| b == b' ' || b == b'\t') {
                    continue;
                }
                let Some(ip) = parse_entry(entry) else {
                    return Client::Connection(source);
                };
                let ip = ip.to_canonical();
                if trusted.contains(ip) {
                    hops.push(ip);
                } else {
                    client = Some(ip);
                    break 'walk;
                }
            }
        }
        let Some(client) = client.or_else(|| hops.pop()) else {
            return Client::Connection(source);
        };
        let mut chain = String::with_capacity(16 * (hops.len() + 2));
        let _ = write!(chain, "{client}");
        for hop in hops.iter().rev() {
            let _ = write!(chain, ", {hop}");
        }
        let _ = write!(chain, ", {}", source.as_str());
        Client::Forwarded(Box::new(Forwarded {
            client: ClientAddr::new(client),
            chain,
        }))
    }

    /// The client's address.
    pub(crate) fn addr(&self) -> &ClientAddr {
        match self {
            Client::Connection(addr) => addr,
            Client::Forwarded(f) => &f.client,
        }
    }

    /// The `X-Forwarded-For` value for the upstream: the client first;
    /// after it, for a client named by trusted proxies, those proxies and
    /// the connection's source. Nothing the gateway did not trust.
    pub(crate) fn forwarded_for(&self) -> &str {
        match self {
            Client::Connection(addr) => addr.as_str(),
            Client::Forwarded(f) => &f.chain,
        }
    }
}

/// One entry of an `X-Forwarded-For`-style list: an address, bracketed
/// IPv6 (`[2001:db8::1]`), or either with a port (`192.0.2.1:443`,
/// `[2001:db8::1]:443`), as some proxies write them. `None` for anything
/// else (`unknown`, RFC 7239 obfuscated names, zone ids).
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry)
        .ok()?
        .trim_matches(|c| c == ' ' || c == '\t');
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok
            .then(|| inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6))
            .flatten();
    }
    let (v4, port) = text.split_once(':')?;
    is_port(port)
        .then(|| v4.parse::<Ipv4Addr>().ok().map(IpAddr::V4))
        .flatten()
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests;
