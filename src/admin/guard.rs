//! What the admin listener refuses before it answers, since it has no
//! authentication: a Host that does not name it (a DNS-rebinding page, whose
//! own host name resolves to the listener), and a `POST /reload` a browser
//! page could send from another site.
use http::header::{CONTENT_TYPE, HOST, ORIGIN};
use http::request;
use std::net::{IpAddr, SocketAddr};

/// The Host values the admin listener answers for.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// The address the listener was configured with.
    listen: IpAddr,
    /// `[admin] allowed_hosts`, lower-case.
    names: Vec<String>,
}

impl AllowedHosts {
    /// For a listener configured on `listen`, answering `names` too.
    pub fn new(listen: SocketAddr, names: Vec<String>) -> Self {
        AllowedHosts {
            listen: listen.ip(),
            names,
        }
    }

    /// Whether the request's Host (or HTTP/2 `:authority`) names this
    /// listener: `localhost`, a loopback address, the configured address (any
    /// address when it is `0.0.0.0` or `::`), or a listed name; any port.
    /// A rebinding page reaches the listener only under a DNS name of the
    /// attacker's, so an IP address is safe to answer. A request with no
    /// host at all comes from no browser and is answered; one whose Host
    /// field is not text is not.
    pub(super) fn allow(&self, head: &request::Parts) -> bool {
        // An absolute-form target's authority counts as much as the Host field.
        let authority = head.uri.authority().map(|a| a.as_str());
        let host = head.headers.get(HOST).map(|v| v.to_str().unwrap_or(""));
        [authority, host]
            .into_iter()
            .flatten()
            .all(|value| self.names_listener(value))
    }

    fn names_listener(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        if let Some(ip) = name.strip_prefix('[').and_then(|v6| v6.strip_suffix(']')) {
            return ip.parse::<IpAddr>().is_ok_and(|ip| self.allows_ip(ip));
        }
        if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
            return self.allows_ip(IpAddr::V4(ip));
        }
        name.eq_ignore_ascii_case("localhost")
            || self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || ip == self.listen || self.listen.is_unspecified()
    }
}

/// The host of a Host value without its port (`[::1]` keeps its brackets);
/// `None` when the value is malformed (an empty host, a port that is not a number).
fn host_name(value: &str) -> Option<&str> {
    let (name, port) = if value.starts_with('[') {
        let end = value.find(']')?;
        (&value[..=end], &value[end + 1..])
    } else {
        value.split_at(value.find(':').unwrap_or(value.len()))
    };
    let port_ok = match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => {
            (1..=5).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
        }
    };
    (!name.is_empty() && port_ok).then_some(name)
}

/// Whether a `POST /reload` could have come from a page in a browser: it
/// carries an `Origin` (browsers send one with every cross-site POST), or a
/// body type an HTML form sends without a CORS preflight. Tools such as curl
/// send neither unless asked to.
pub(super) fn cross_site(head: &request::Parts) -> bool {
    if head.headers.contains_key(ORIGIN) {
        return true;
    }
    head.headers.get_all(CONTENT_TYPE).iter().any(|v| {
        let Ok(v) = v.to_str() else {
            return true;
        };
        let essence = v.split(';').next().unwrap_or_default().trim();
        [
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "text/plain",
        ]
        .iter()
        .any(|form| essence.eq_ignore_ascii_case(form))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(host: Option<&str>, uri: &str) -> request::Parts {
        let mut b = http::Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn hosts_that_name_a_loopback_listener() {
        let hosts = AllowedHosts::new(
            "127.0.0.1:9901".parse().unwrap(),
            vec!["gw-1.internal".into()],
        );
        for ok in [
            "localhost",
            "LocalHost:9901",
            "localhost:8080",
            "127.0.0.1",
            "127.0.0.1:9901",
            "127.0.0.2:1",
            "[::1]",
            "[::1]:9901",
            "gw-1.internal:9901",
            "GW-1.internal",
        ] {
            assert!(hosts.allow(&head(Some(ok), "/metrics")), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:9901",
            "localhost.evil.example",
            "10.0.0.1:9901",
            "[::2]:9901",
            "",
            ":9901",
            "localhost:",
            "localhost:99999x",
            "[::1",
            "::1",
            "127.0.0.1:9901:1",
        ] {
            assert!(
                !hosts.allow(&head(Some(refused), "/metrics")),
                "{refused:?}"
            );
        }
        // No Host: the HTTP/2 authority stands in; with neither, no browser sent it.
        assert!(hosts.allow(&head(None, "http://localhost:9901/metrics")));
        assert!(!hosts.allow(&head(None, "http://evil.example/metrics")));
        assert!(hosts.allow(&head(None, "/metrics")));
    }

    #[test]
    fn a_listener_on_every_address_answers_any_ip_but_not_any_name() {
        let hosts = AllowedHosts::new("0.0.0.0:9901".parse().unwrap(), Vec::new());
        assert!(hosts.allow(&head(Some("10.1.2.3:9901"), "/metrics")));
        assert!(hosts.allow(&head(Some("[fd00::1]:9901"), "/metrics")));
        assert!(!hosts.allow(&head(Some("gw.internal:9901"), "/metrics")));
        let hosts = AllowedHosts::new("10.1.2.3:9901".parse().unwrap(), Vec::new());
        assert!(hosts.allow(&head(Some("10.1.2.3:9901"), "/metrics")));
        assert!(!hosts.allow(&head(Some("10.1.2.4:9901"), "/metrics")));
    }

    #[test]
    fn form_bodies_and_origins_are_cross_site() {
        let post = |headers: &[(&str, &str)]| {
            let mut b = http::Request::builder().method("POST").uri("/reload");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            cross_site(&b.body(()).unwrap().into_parts().0)
        };
        assert!(!post(&[]));
        assert!(!post(&[("content-type", "application/json")]));
        assert!(post(&[("origin", "null")]));
        assert!(post(&[("origin", "http://127.0.0.1:9901")]));
        assert!(post(&[("content-type", "text/plain;charset=UTF-8")]));
        assert!(post(&[("content-type", "Multipart/Form-Data; boundary=x")]));
        assert!(post(&[(
            "content-type",
            " application/x-www-form-urlencoded"
        )]));
    }
}
