//! The strict query parser and the credential-in-URL detector: never a
//! panic; a parsed query never holds a name twice, and gives each name the
//! value an independent decoder finds.

use mpg_gateway::routes::{find_secret_param, Query};
use std::collections::HashSet;

/// One input.
pub fn run(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let _ = find_secret_param(raw);
    let Ok(q) = Query::parse(Some(raw)) else {
        return;
    };
    // An independent decoder (the `form_urlencoded` crate, which the URL
    // standard's parsers share) must find each name once, and the value the
    // parser gives for it.
    let mut seen = HashSet::new();
    for (name, value) in form_urlencoded::parse(raw.as_bytes()) {
        assert!(seen.insert(name.clone()), "{name:?} twice in the accepted {raw:?}");
        if !name.is_empty() {
            assert_eq!(q.get(&name).unwrap_or(""), value, "{name:?} in {raw:?}");
            assert!(q.require(&name).is_ok() || value.is_empty());
        }
    }
}
