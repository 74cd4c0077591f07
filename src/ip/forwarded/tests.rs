use super::*;
use http::header::HeaderValue;

const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");

fn trusted(nets: &[&str]) -> TrustedProxies {
    TrustedProxies::new(
        nets.iter()
            .map(|n| TrustedProxies::parse_entry(n).unwrap())
            .collect(),
    )
}

/// (client text, client key, X-Forwarded-For) for a request from `source`
/// carrying the `x-forwarded-for` lines given.
fn resolve(
    source: &str,
    source_trusted: bool,
    lines: &[&str],
    nets: &[&str],
) -> (String, String, String) {
    let source = ClientAddr::new(source.parse().unwrap());
    let mut headers = HeaderMap::new();
    for line in lines {
        headers.append(XFF, HeaderValue::from_bytes(line.as_bytes()).unwrap());
    }
    let client = Client::of(&source, source_trusted, &headers, &XFF, &trusted(nets));
    (
        client.addr().as_str().to_owned(),
        client.addr().limit_key().to_owned(),
        client.forwarded_for().to_owned(),
    )
}

fn client_and_chain(source: &str, lines: &[&str], nets: &[&str]) -> (String, String) {
    let (ip, _, chain) = resolve(source, true, lines, nets);
    (ip, chain)
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

const LB: &[&str] = &["10.0.0.0/8"];

#[test]
fn an_untrusted_source_is_the_client_whatever_its_header_says() {
    let (ip, key, chain) = resolve("203.0.113.9", false, &["198.51.100.1"], LB);
    assert_eq!(
        (ip.as_str(), key.as_str(), chain.as_str()),
        ("203.0.113.9", "203.0.113.9", "203.0.113.9")
    );
}

#[test]
fn the_client_is_the_rightmost_untrusted_entry_and_what_is_left_of_it_is_dropped() {
    assert_eq!(
        client_and_chain("10.0.0.1", &["6.6.6.6, 198.51.100.7"], LB),
        pair("198.51.100.7", "198.51.100.7, 10.0.0.1")
    );
    // Trusted hops right of the client stay in the chain, in order.
    assert_eq!(
        client_and_chain(
            "10.0.0.1",
            &["6.6.6.6, 198.51.100.7, 10.9.9.9,10.8.8.8"],
            LB
        ),
        pair("198.51.100.7", "198.51.100.7, 10.9.9.9, 10.8.8.8, 10.0.0.1")
    );
    // Several field lines are one list, in order.
    assert_eq!(
        client_and_chain("10.0.0.1", &["6.6.6.6", "198.51.100.7, 10.2.2.2"], LB),
        pair("198.51.100.7", "198.51.100.7, 10.2.2.2, 10.0.0.1")
    );
    // Garbage left of the client is never read.
    assert_eq!(
        client_and_chain("10.0.0.1", &["not an address, 198.51.100.7"], LB),
        pair("198.51.100.7", "198.51.100.7, 10.0.0.1")
    );
}

#[test]
fn when_every_entry_is_trusted_the_leftmost_is_the_client() {
    assert_eq!(
        client_and_chain("10.0.0.1", &["10.1.1.1, 10.2.2.2"], LB),
        pair("10.1.1.1", "10.1.1.1, 10.2.2.2, 10.0.0.1")
    );
}

#[test]
fn an_absent_empty_or_unparsable_header_leaves_the_source() {
    for lines in [
        &[][..],
        &[""],
        &[" , ,"],
        &["198.51.100.7, unknown"],
        &["198.51.100.7, 10.1.1.1, _hidden"],
        &["fe80::1%eth0"],
        &["198.51.100.7:99999"],
        &["[2001:db8::1"],
    ] {
        assert_eq!(
            client_and_chain("10.0.0.1", lines, LB),
            pair("10.0.0.1", "10.0.0.1"),
            "{lines:?}"
        );
    }
}

#[test]
fn entries_may_carry_ports_brackets_spaces_and_empty_elements() {
    for (line, want) in [
        ("198.51.100.7:4711", "198.51.100.7"),
        ("[2001:db8::7]", "2001:db8::7"),
        ("[2001:db8::7]:443", "2001:db8::7"),
        ("\t198.51.100.7 ,, ", "198.51.100.7"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
    ] {
        assert_eq!(client_and_chain("10.0.0.1", &[line], LB).0, want, "{line}");
    }
}

#[test]
fn a_forwarded_ipv6_client_is_keyed_by_its_64() {
    let (ip, key, chain) = resolve("10.0.0.1", true, &["2001:db8:1:2::abcd"], LB);
    assert_eq!(ip, "2001:db8:1:2::abcd");
    assert_eq!(key, "2001:db8:1:2::/64");
    assert_eq!(chain, "2001:db8:1:2::abcd, 10.0.0.1");
}

#[test]
fn trusted_networks_match_both_families_and_mapped_addresses() {
    let t = trusted(&[
        "10.0.0.0/8",
        "2001:db8::/32",
        "192.0.2.1",
        "::ffff:172.16.0.0/112",
    ]);
    for (ip, inside) in [
        ("10.255.0.1", true),
        ("11.0.0.1", false),
        ("::ffff:10.1.2.3", true),
        ("2001:db8:ffff::1", true),
        ("2001:db9::1", false),
        ("192.0.2.1", true),
        ("192.0.2.2", false),
        ("172.16.9.9", true),
        ("172.17.0.1", false),
    ] {
        assert_eq!(t.contains(ip.parse().unwrap()), inside, "{ip}");
    }
    assert!(!TrustedProxies::default().contains("10.0.0.1".parse().unwrap()));
}

#[test]
fn bad_entries_are_refused_with_a_reason() {
    for (text, says) in [
        ("10.0.0.1/8", "10.0.0.0/8"),
        ("10.0.0.0/33", "invalid network"),
        ("localhost", "invalid network"),
        ("", "invalid network"),
        ("2001:db8::1/32", "2001:db8::/32"),
    ] {
        let err = TrustedProxies::parse_entry(text).unwrap_err();
        assert!(err.contains(says), "{text}: {err}");
    }
    assert_eq!(
        TrustedProxies::parse_entry("192.0.2.1")
            .unwrap()
            .to_string(),
        "192.0.2.1/32"
    );
}
