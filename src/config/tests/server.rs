//! `[server]` and `[admin]`: TLS files, connection and header limits,
//! trusted proxies, the PROXY protocol, and the admin listener's host names.
use super::*;

#[test]
fn connection_and_header_counts_too_large_to_serve_are_refused_by_path() {
    // Past tokio's semaphore limit (usize::MAX >> 3) the server or an upstream
    // pool panics at start; past 2^31 the HTTP/2 header-list limit overflows.
    let huge = i64::MAX;
    for (section, key) in [
        ("[server.limits]", "max_connections"),
        ("[server.limits]", "max_header_bytes"),
    ] {
        let errs = problems(&MINIMAL.replace(
            "[server]\ninsecure_http = true",
            &format!("[server]\ninsecure_http = true\n{section}\n{key} = {huge}"),
        ));
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&format!("server.limits.{key}: at most"))),
            "{key}: {errs:?}"
        );
    }
    let errs = problems(&MINIMAL.replace(
        "targets = [",
        &format!("max_connections_per_target = {huge}\ntargets = ["),
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("upstreams.clusters.max_connections_per_target: at most")),
        "{errs:?}"
    );
    // Large but servable values stay accepted.
    let ok = MINIMAL.replace(
        "[server]\ninsecure_http = true",
        "[server]\ninsecure_http = true\n[server.limits]\nmax_connections = 1000000\nmax_header_bytes = 1048576",
    );
    assert!(Settings::parse(&ok).is_ok());
}

#[test]
fn admin_allowed_hosts_are_dns_names_without_port_or_scheme() {
    let s = Settings::parse(&format!(
        "{MINIMAL}[admin]\nallowed_hosts = [\"GW-1.internal\", \"gw-1.internal\", \"metrics\"]\n"
    ))
    .unwrap();
    assert_eq!(s.admin.allowed_hosts, ["gw-1.internal", "metrics"]);
    assert!(Settings::parse(MINIMAL)
        .unwrap()
        .admin
        .allowed_hosts
        .is_empty());
    let errs = problems(&format!(
        "{MINIMAL}[admin]\nallowed_hosts = [\"ok.internal\", \"gw:9901\", \"http://gw\", \"\", \"a..b\"]\n"
    ));
    for i in 1..=4 {
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&format!("admin.allowed_hosts[{i}]: invalid host name"))),
            "[{i}] not named in {errs:#?}"
        );
    }
    assert_eq!(errs.len(), 4, "{errs:#?}");
}

#[test]
fn client_ip_defaults_to_no_trusted_proxy_and_x_forwarded_for() {
    let s = Settings::parse(MINIMAL).unwrap();
    assert!(s.server.client_ip.trusted_proxies.is_empty());
    assert_eq!(s.server.client_ip.header, "x-forwarded-for");
    assert!(!s.server.proxy_protocol);
    let s = Settings::parse(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\nproxy_protocol = true\n[server.client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.1\"]\nheader = \"X-Real-Client\"",
    ))
    .unwrap();
    assert!(s.server.proxy_protocol);
    assert_eq!(s.server.client_ip.header, "x-real-client");
    let trusted = &s.server.client_ip.trusted_proxies;
    assert!(trusted.contains("10.1.2.3".parse().unwrap()));
    assert!(trusted.contains("2001:db8::5".parse().unwrap()));
    assert!(trusted.contains("192.0.2.1".parse().unwrap()));
    assert!(!trusted.contains("192.0.2.2".parse().unwrap()));
}

#[test]
fn bad_client_ip_settings_are_each_named() {
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\n[server.client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.1/8\", \"nlb.internal\"]\nheader = \"x forwarded\"",
    ));
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(
        errs[0].starts_with("server.client_ip.trusted_proxies[1]: ")
            && errs[0].contains("10.0.0.0/8"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("server.client_ip.trusted_proxies[2]: ")
            && errs[1].contains("nlb.internal"),
        "{errs:?}"
    );
    assert!(errs[2].starts_with("server.client_ip.header: "), "{errs:?}");
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\n[server.client_ip]\nheader = \"Forwarded\"",
    ));
    assert!(
        errs[0].starts_with("server.client_ip.header: ") && errs[0].contains("RFC 7239"),
        "{errs:?}"
    );
}

#[test]
fn the_proxy_protocol_needs_trusted_proxies() {
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\nproxy_protocol = true",
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("server.proxy_protocol: ")
            && errs[0].contains("server.client_ip.trusted_proxies"),
        "{errs:?}"
    );
}

#[test]
fn tls_is_required_and_files_must_exist() {
    let text = MINIMAL.replace("insecure_http = true", "");
    assert!(problems(&text)[0].starts_with("server.tls: required"));
    let text = MINIMAL.replace(
        "insecure_http = true",
        "[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"",
    );
    let errs = problems(&text);
    assert!(
        errs.iter().any(|e| e.starts_with("server.tls.cert: file")),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.starts_with("server.tls.key: file")),
        "{errs:?}"
    );
    let text = MINIMAL.replace("insecure_http = true", "[server.tls]\nself_signed = true");
    assert_eq!(
        Settings::parse(&text).unwrap().server.tls,
        Some(TlsSettings::SelfSigned)
    );
}
