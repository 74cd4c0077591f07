//! The strict query parser and the credential-in-URL detector: never a
//! panic; a parsed query never holds a name twice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpg_gateway::routes::{find_secret_param, Query};

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let _ = find_secret_param(raw);
    if let Ok(q) = Query::parse(Some(raw)) {
        for piece in raw.split('&').filter(|p| !p.is_empty()).take(8) {
            let name = piece.split_once('=').map_or(piece, |(n, _)| n);
            let _ = q.get(name);
            let _ = q.require(name);
        }
    }
});
