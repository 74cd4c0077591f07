//! Validation of `[server]` (listen address, TLS files, limits), and of
//! `[admin]`, which shares its socket-address rule.
use std::net::SocketAddr;
use std::path::PathBuf;

use super::problems::{Problems, MAX_CONNECTIONS};
use super::raw::{RawAdmin, RawClientIp, RawServer};
use super::{AdminSettings, ClientIpSettings, Limits, ServerSettings, TlsSettings, TrustedProxies};
use crate::tls::KeyExchange;

/// The most header bytes a request may have: twice this bounds the head a
/// connection buffers, and must fit HTTP/2's `u32` header-list limit.
const MAX_HEADER_BYTES: usize = 1 << 30;

pub(super) fn socket_addr(p: &mut Problems, path: &str, text: &str) -> Option<SocketAddr> {
    match text.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            p.add(
                path,
                format!("invalid address {text:?}: expected IP:PORT, e.g. \"127.0.0.1:8443\""),
            );
            None
        }
    }
}

/// `[admin]`: the address, and the extra host names it answers for (DNS
/// names only: `localhost` and IP addresses need no listing, and a port
/// is never part of the match).
pub(super) fn admin_settings(p: &mut Problems, raw: RawAdmin, tls_files: bool) -> AdminSettings {
    let listen = raw
        .enabled
        .then(|| socket_addr(p, "admin.listen", &raw.listen))
        .flatten();
    let mut allowed_hosts = Vec::new();
    for (i, host) in raw.allowed_hosts.iter().enumerate() {
        let name = host.to_ascii_lowercase();
        let dns_name = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !dns_name {
            p.add(
                format!("admin.allowed_hosts[{i}]"),
                format!("invalid host name {host:?}: expected a DNS name such as \"gateway-1.internal\", without port or scheme"),
            );
        } else if !allowed_hosts.contains(&name) {
            allowed_hosts.push(name);
        }
    }
    let tls = raw.tls.and_then(|tls| {
        let cert = pem_file(p, "admin.tls.cert", tls.cert, tls_files);
        let key = pem_file(p, "admin.tls.key", tls.key, tls_files);
        cert.zip(key)
            .map(|(cert, key)| TlsSettings::Files { cert, key })
    });
    AdminSettings {
        listen,
        allowed_hosts,
        tls,
    }
}

/// `[server.tls] key_exchange`: known group names, each once, at least one
/// (default: [`KeyExchange::DEFAULT`]).
fn key_exchange(p: &mut Problems, names: Option<&Vec<String>>) -> Vec<KeyExchange> {
    let Some(names) = names else {
        return KeyExchange::DEFAULT.to_vec();
    };
    let path = "server.tls.key_exchange";
    if names.is_empty() {
        p.add(path, "must name at least one group");
    }
    let mut groups = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match KeyExchange::from_name(name) {
            Some(k) if groups.contains(&k) => {
                p.add(format!("{path}[{i}]"), format!("{name:?} is listed twice"));
            }
            Some(k) => groups.push(k),
            None => {
                let known: Vec<&str> = KeyExchange::DEFAULT.iter().map(|k| k.name()).collect();
                p.add(
                    format!("{path}[{i}]"),
                    format!("unknown group {name:?}; the groups: {}", known.join(", ")),
                );
            }
        }
    }
    if groups.is_empty() {
        return KeyExchange::DEFAULT.to_vec();
    }
    groups
}

/// A PEM file setting at `path`: required, and present on disk when
/// `tls_files`.
fn pem_file(p: &mut Problems, path: &str, v: Option<String>, tls_files: bool) -> Option<PathBuf> {
    match v {
        None => {
            p.add(path, "required (a PEM file path)");
            None
        }
        Some(f) if tls_files && !std::path::Path::new(&f).is_file() => {
            p.add(path, format!("file {f:?} does not exist or is not a file"));
            None
        }
        Some(f) => Some(PathBuf::from(f)),
    }
}

/// `tls_files`: whether the certificate and key files must exist (not for
/// the admin commands, which never serve and may run on another machine).
pub(super) fn server_settings(p: &mut Problems, raw: RawServer, tls_files: bool) -> ServerSettings {
    let listen = socket_addr(
        p,
        "server.listen",
        raw.listen.as_deref().unwrap_or("0.0.0.0:8443"),
    )
    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8443)));
    let key_exchange = key_exchange(p, raw.tls.as_ref().and_then(|t| t.key_exchange.as_ref()));
    let tls = match (raw.insecure_http, raw.tls) {
        (true, _) => None,
        (false, None) => {
            p.add("server.tls", "required unless server.insecure_http = true (set cert and key, or self_signed = true)");
            None
        }
        (false, Some(tls)) if tls.self_signed => {
            if tls.cert.is_some() || tls.key.is_some() {
                p.add("server.tls.self_signed", "cannot be combined with cert/key");
            }
            Some(TlsSettings::SelfSigned)
        }
        (false, Some(tls)) => {
            let cert = pem_file(p, "server.tls.cert", tls.cert, tls_files);
            let key = pem_file(p, "server.tls.key", tls.key, tls_files);
            cert.zip(key)
                .map(|(cert, key)| TlsSettings::Files { cert, key })
        }
    };
    if raw.workers > 1024 {
        p.add("server.workers", "at most 1024 (0 = one per core)");
    }
    let l = raw.limits;
    if l.max_header_bytes < 1024 {
        p.add("server.limits.max_header_bytes", "must be at least 1024");
    } else if l.max_header_bytes > MAX_HEADER_BYTES {
        p.add(
            "server.limits.max_header_bytes",
            format!("at most {MAX_HEADER_BYTES}"),
        );
    }
    if l.max_body_bytes == 0 {
        p.add("server.limits.max_body_bytes", "must be greater than zero");
    }
    if l.max_connections == 0 {
        p.add("server.limits.max_connections", "must be greater than zero");
    } else if l.max_connections > MAX_CONNECTIONS {
        p.add(
            "server.limits.max_connections",
            format!("at most {MAX_CONNECTIONS}"),
        );
    }
    p.positive("server.limits.header_read_timeout", l.header_read_timeout);
    p.positive("server.limits.idle_timeout", l.idle_timeout);
    let client_ip = client_ip_settings(p, raw.client_ip);
    if raw.proxy_protocol && client_ip.trusted_proxies.is_empty() {
        p.add(
            "server.proxy_protocol",
            "requires server.client_ip.trusted_proxies: the addresses of the proxies that send the PROXY header",
        );
    }
    ServerSettings {
        listen,
        tls,
        workers: raw.workers,
        limits: Limits {
            max_header_bytes: l.max_header_bytes,
            max_body_bytes: l.max_body_bytes,
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            max_connections: l.max_connections,
            shutdown_grace: l.shutdown_grace,
        },
        proxy_protocol: raw.proxy_protocol,
        client_ip,
        shutdown_delay: raw.shutdown_delay,
        key_exchange,
    }
}

/// `[server.client_ip]`: each network checked on its own, and the field
/// name.
fn client_ip_settings(p: &mut Problems, raw: RawClientIp) -> ClientIpSettings {
    let mut networks = Vec::with_capacity(raw.trusted_proxies.len());
    for (i, text) in raw.trusted_proxies.iter().enumerate() {
        match TrustedProxies::parse_entry(text) {
            Ok(net) => networks.push(net),
            Err(why) => p.add(format!("server.client_ip.trusted_proxies[{i}]"), why),
        }
    }
    let header = match http::HeaderName::from_bytes(raw.header.as_bytes()) {
        Ok(name) if name == "forwarded" => {
            p.add(
                "server.client_ip.header",
                "\"forwarded\" (RFC 7239) is not read: name a field holding a comma-separated list of addresses, such as \"x-forwarded-for\"",
            );
            None
        }
        Ok(name) => Some(name),
        Err(_) => {
            p.add(
                "server.client_ip.header",
                format!("{:?} is not a header field name", raw.header),
            );
            None
        }
    };
    ClientIpSettings {
        trusted_proxies: TrustedProxies::new(networks),
        header: header.unwrap_or(http::HeaderName::from_static("x-forwarded-for")),
    }
}
