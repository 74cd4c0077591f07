//! The PROXY protocol (HAProxy's; v1 text and v2 binary): with
//! `proxy_protocol = true`, every connection begins with a header from a
//! trusted proxy that names the client, before TLS and HTTP. A connection
//! from an untrusted peer, or without a valid header by the first request's
//! deadline, is closed without a response.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use ppp::{HeaderResult, PartialResult};

use crate::config::{ServerSettings, TrustedProxies};

/// What a listener takes from the proxies in front of it.
#[derive(Debug, Clone, Default)]
pub struct Proxies {
    /// Peers that may name the client (a PROXY header, or the
    /// `[server.client_ip]` field the pipeline reads).
    pub trusted: TrustedProxies,
    /// Every connection must begin with a PROXY header.
    pub proxy_protocol: bool,
}

impl Proxies {
    /// The gateway listener's, from `[server]`.
    pub fn gateway(s: &ServerSettings) -> Self {
        Proxies {
            trusted: s.client_ip.trusted_proxies.clone(),
            proxy_protocol: s.proxy_protocol,
        }
    }
}

/// The most bytes a header may take: a v1 header is at most 107; a v2
/// header is 16 bytes, then addresses (at most 216) and TLVs, which
/// balancers keep short (an AWS endpoint id, a TLS summary).
pub(crate) const MAX_HEADER: usize = 4096;

/// The longest v1 header, its line end included (the specification's 107).
const V1_MAX: usize = 107;

/// A v2 header's fixed part: the signature, version and command, family
/// and protocol, and the length of the rest.
const V2_FIXED: usize = 16;

/// Why a connection's PROXY header was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("connection closed before a complete PROXY header")]
    Closed,
    #[error("no PROXY header by header_read_timeout")]
    TimedOut,
    #[error("PROXY header longer than {MAX_HEADER} bytes")]
    TooLong,
    #[error("not a PROXY header: {0}")]
    Invalid(String),
    #[error("reading the PROXY header: {0}")]
    Io(#[from] io::Error),
    #[error("shutting down")]
    Draining,
}

/// The client the connection's PROXY header names: its source address, or
/// `None` when it names none (a v2 `LOCAL` command, such as a balancer's
/// health check; v1 `UNKNOWN`; a v2 address family other than IPv4/IPv6):
/// then the connection is the balancer's own, and whatever client field it
/// carries is not to be trusted.
/// Reads exactly the header's bytes, so what follows (a TLS ClientHello, an
/// HTTP request) is left on the socket. Gives up at `by`, and at once when
/// the listener drains.
pub(super) async fn read_client(
    stream: &mut TcpStream,
    by: Instant,
    stop: watch::Receiver<bool>,
) -> Result<Option<IpAddr>, HeaderError> {
    let read = tokio::time::timeout_at(by.into(), read_header(stream));
    tokio::select! {
        biased;
        read = read => match read {
            Ok(Ok(source)) => Ok(source),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(HeaderError::TimedOut),
        },
        () = crate::http_core::service::stopped(stop) => Err(HeaderError::Draining),
    }
}

/// Reads one header: the source address it carries, if any. Each round
/// peeks at what has arrived; bytes that are all header are taken off the
/// socket (so the next peek waits for more), and once the header is whole
/// exactly its remaining bytes are.
async fn read_header(stream: &mut TcpStream) -> Result<Option<IpAddr>, HeaderError> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut have = 0;
    loop {
        let n = stream.peek(&mut buf[have..]).await?;
        if n == 0 {
            return Err(HeaderError::Closed);
        }
        let seen = have + n;
        let done = classify(&buf[..seen])?;
        match done {
            None if seen == MAX_HEADER => return Err(HeaderError::TooLong),
            None => {
                stream.read_exact(&mut buf[have..seen]).await?;
                have = seen;
            }
            Some((len, source)) => {
                stream.read_exact(&mut buf[have..len]).await?;
                return Ok(source);
            }
        }
    }
}

/// What the bytes at the front of a connection say, once they are all
/// that has arrived: `None` when all of them are header and more is to
/// come, else the header's length and the source address it carries.
pub(crate) fn classify(buf: &[u8]) -> Result<Option<(usize, Option<IpAddr>)>, HeaderError> {
    if buf.starts_with(b"PROXY ") {
        return classify_v1(buf);
    }
    Ok(match HeaderResult::parse(buf) {
        HeaderResult::V2(Err(ppp::v2::ParseError::Partial(_, length)))
            if V2_FIXED + length > MAX_HEADER =>
        {
            return Err(HeaderError::TooLong)
        }
        incomplete if incomplete.is_incomplete() => None,
        HeaderResult::V1(Ok(h)) => Some((h.header.len(), v1_source(&h.addresses))),
        HeaderResult::V2(Ok(h)) => Some((h.len(), v2_source(&h))),
        HeaderResult::V1(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
        HeaderResult::V2(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
    })
}

/// [`classify`] for a v1 header: one line, ended by its first CRLF within
/// [`V1_MAX`] bytes. Until that has come it is incomplete, whatever the
/// parser makes of the part (it reads a port cut short, `… 56324 4`, as an
/// invalid port); then the parser reads that line alone, and the header
/// ends at the line's end, never at the parser's guess within it.
fn classify_v1(buf: &[u8]) -> Result<Option<(usize, Option<IpAddr>)>, HeaderError> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n").map(|at| at + 2) else {
        if buf.len() < V1_MAX {
            return Ok(None);
        }
        return Err(HeaderError::Invalid(format!(
            "a v1 header without a line end in {V1_MAX} bytes"
        )));
    };
    if end > V1_MAX {
        return Err(HeaderError::Invalid(format!(
            "a v1 header longer than {V1_MAX} bytes"
        )));
    }
    // `UNKNOWN`: whatever else the line holds is to be ignored (the
    // specification's words); it names no client.
    let line = &buf[..end];
    if line.starts_with(b"PROXY UNKNOWN") && matches!(line[13], b' ' | b'\r') {
        return Ok(Some((end, None)));
    }
    match HeaderResult::parse(line) {
        HeaderResult::V1(Ok(h)) if h.header.len() == end => {
            Ok(Some((end, v1_source(&h.addresses))))
        }
        HeaderResult::V1(Err(e)) => Err(HeaderError::Invalid(e.to_string())),
        _ => Err(HeaderError::Invalid(
            "a v1 header not ended by its CRLF".into(),
        )),
    }
}

fn v1_source(addresses: &ppp::v1::Addresses) -> Option<IpAddr> {
    match addresses {
        ppp::v1::Addresses::Tcp4(a) => Some(IpAddr::V4(a.source_address)),
        ppp::v1::Addresses::Tcp6(a) => Some(IpAddr::V6(a.source_address)),
        ppp::v1::Addresses::Unknown => None,
    }
}

fn v2_source(h: &ppp::v2::Header<'_>) -> Option<IpAddr> {
    if h.command == ppp::v2::Command::Local {
        return None;
    }
    match h.addresses {
        ppp::v2::Addresses::IPv4(a) => Some(IpAddr::V4(a.source_address)),
        ppp::v2::Addresses::IPv6(a) => Some(IpAddr::V6(a.source_address)),
        ppp::v2::Addresses::Unspecified | ppp::v2::Addresses::Unix(_) => None,
    }
}

/// Connections refused for their PROXY header (or their peer), in the log
/// at INFO: a misconfigured balancer (PROXY protocol off, or an address
/// missing from `trusted_proxies`) shows as every connection closed.
static PROXY_HEADERS_FAILING: crate::logging::Incident = crate::logging::Incident::new();

pub(super) fn refused(peer: SocketAddr, cause: &dyn std::fmt::Display) {
    tracing::debug!(%peer, %cause, "connection closed: PROXY protocol");
    if let Some(line) = PROXY_HEADERS_FAILING.failed(crate::logging::now_ms()) {
        line.log(
            tracing::Level::INFO,
            &"PROXY protocol headers",
            "connections closed",
            &format_args!("{cause} (peer {})", peer.ip()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// Writes `chunks` (with a pause between them) to a fresh connection
    /// and reads its header at the other end: the outcome, then every byte
    /// left on the socket once the writer closed.
    async fn exchange(chunks: &[&[u8]]) -> (Result<Option<IpAddr>, String>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        let writer = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for chunk in chunks {
                c.write_all(&chunk).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        let (mut s, _) = listener.accept().await.unwrap();
        let got = read_header(&mut s).await.map_err(|e| e.to_string());
        writer.await.unwrap();
        let mut rest = Vec::new();
        if got.is_ok() {
            s.read_to_end(&mut rest).await.unwrap();
        }
        (got, rest)
    }

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = ppp::v2::PROTOCOL_PREFIX.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend(((addresses.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend(addresses);
        h.extend(tlvs);
        h
    }

    const V4_ADDRESSES: [u8; 12] = [198, 51, 100, 7, 10, 0, 0, 1, 0x12, 0x34, 1, 187];

    #[tokio::test]
    async fn a_v1_header_names_the_client_and_leaves_the_request() {
        let (got, rest) =
            exchange(&[b"PROXY TCP4 198.51.100.7 10.0.0.1 4660 443\r\nGET / HTTP/1.1\r\n"]).await;
        assert_eq!(got, Ok(Some("198.51.100.7".parse().unwrap())));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        let (got, _) = exchange(&[b"PROXY TCP6 2001:db8::7 2001:db8::1 4660 443\r\n"]).await;
        assert_eq!(got, Ok(Some("2001:db8::7".parse().unwrap())));
        let (got, rest) = exchange(&[b"PROXY UNKNOWN\r\nx"]).await;
        assert_eq!((got, rest), (Ok(None), b"x".to_vec()));
    }

    #[tokio::test]
    async fn a_header_in_pieces_is_read_whole_and_no_further() {
        let (got, rest) =
            exchange(&[b"PROXY TCP4 198.5", b"1.100.7 10.0.0.1 1 2\r", b"\nabc"]).await;
        assert_eq!(got, Ok(Some("198.51.100.7".parse().unwrap())));
        assert_eq!(rest, b"abc");
        // Cut inside a port: the part is no header yet, not a bad one.
        let (got, _) = exchange(&[b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 44", b"3\r\n"]).await;
        assert_eq!(got, Ok(Some("2001:db8::1".parse().unwrap())));
        // `UNKNOWN` takes any bytes up to CRLF, a bare LF too.
        let (got, rest) = exchange(&[b"PROXY UNKNOWN a\nb\xc2", b"\x9b\r\nx"]).await;
        assert_eq!((got, rest), (Ok(None), b"x".to_vec()));
        // Ended by its first CRLF, whatever comes before it.
        let (got, rest) = exchange(&[b"PROXY UNKNOWN Y \n\r!P\r\nx"]).await;
        assert_eq!((got, rest), (Ok(None), b"x".to_vec()));
        // A line that never ends is refused once it is longer than any header.
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 100]].concat();
        let (got, _) = exchange(&[&long]).await;
        assert!(got.is_err_and(|e| e.contains("without a line end")));
        let h = v2(1, 0x11, &V4_ADDRESSES, &[]);
        let (got, rest) = exchange(&[
            &h[..5],
            &h[5..14],
            &h[14..20],
            &[&h[20..], b"\x16\x03\x01"].concat(),
        ])
        .await;
        assert_eq!(got, Ok(Some("198.51.100.7".parse().unwrap())));
        assert_eq!(rest, b"\x16\x03\x01");
    }

    #[tokio::test]
    async fn v2_addresses_tlvs_and_local() {
        // With a TLV (an AWS endpoint id, type 0xEA).
        let tlv = [0xEA, 0, 5, 1, b'v', b'p', b'c', b'e'];
        let (got, rest) =
            exchange(&[&[v2(1, 0x11, &V4_ADDRESSES, &tlv), b"GET".to_vec()].concat()]).await;
        assert_eq!(
            (got, rest),
            (Ok(Some("198.51.100.7".parse().unwrap())), b"GET".to_vec())
        );
        let mut v6 = Vec::new();
        v6.extend(
            "2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend(
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend([0, 1, 1, 187]);
        let (got, _) = exchange(&[&v2(1, 0x21, &v6, &[])]).await;
        assert_eq!(got, Ok(Some("2001:db8::7".parse().unwrap())));
        // LOCAL (a balancer's own health check): no client named.
        let (got, rest) = exchange(&[&[v2(0, 0x00, &[], &[]), b"GET".to_vec()].concat()]).await;
        assert_eq!((got, rest), (Ok(None), b"GET".to_vec()));
    }

    #[tokio::test]
    async fn anything_else_is_refused() {
        for (bytes, says) in [
            (
                &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
                "not a PROXY header",
            ),
            (
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                "not a PROXY header",
            ),
            (
                b"PROXY TCP4 198.51.100.7 10.0.0.1 1\r\n",
                "not a PROXY header",
            ),
            (
                b"PROXY TCP4 300.0.0.1 10.0.0.1 1 2\r\n",
                "not a PROXY header",
            ),
            (b"PROXY TCP4 198.51.100.7", "closed before"),
            (&[b'P'; 200], "not a PROXY header"),
        ] {
            let (got, _) = exchange(&[bytes]).await;
            let err = got.unwrap_err();
            assert!(err.contains(says), "{bytes:?}: {err}");
        }
        // A v2 header announcing more than the bound is refused before it is read.
        let mut h = v2(1, 0x11, &V4_ADDRESSES, &[]);
        h[14..16].copy_from_slice(&5000u16.to_be_bytes());
        let (got, _) = exchange(&[&h]).await;
        assert!(got.unwrap_err().contains("longer than"));
    }
}
