//! The server config: ALPN, resumption, PEM loading.
use super::*;

#[test]
fn self_signed_builds_a_config_with_alpn() {
    let (config, _) = server_config(self_signed().unwrap(), &KeyExchange::DEFAULT).unwrap();
    assert_eq!(
        config.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}

#[test]
fn the_config_issues_tickets_and_caches_sessions() {
    let (config, _) = server_config(self_signed().unwrap(), &KeyExchange::DEFAULT).unwrap();
    assert!(config.ticketer.enabled());
    assert!(config.session_storage.can_cache());
    // Bounded: past its size, the earliest sessions are gone.
    let ids: Vec<Vec<u8>> = (0..SESSION_CACHE_SIZE as u32 + 10)
        .map(|i| i.to_be_bytes().to_vec())
        .collect();
    for id in &ids {
        assert!(config.session_storage.put(id.clone(), vec![1]));
    }
    assert!(config.session_storage.get(ids.last().unwrap()).is_some());
    let kept = ids
        .iter()
        .filter(|id| config.session_storage.get(id).is_some())
        .count();
    assert!(kept <= SESSION_CACHE_SIZE, "{kept} sessions kept");
}

#[test]
fn pem_files_load_and_a_mismatched_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed_pem().unwrap();
    let (_, other_key) = self_signed_pem().unwrap();
    let (c, k, o) = (
        dir.path().join("c.pem"),
        dir.path().join("k.pem"),
        dir.path().join("o.pem"),
    );
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    std::fs::write(&o, other_key).unwrap();
    assert!(load_pem(&c, &k).is_ok());
    let err = load_pem(&c, &o).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch(_)), "{err}");
    let err = load_pem(&k, &k).unwrap_err().to_string();
    assert!(err.contains("k.pem"), "{err}");
}
