//! A verified JWT's session: cached under its key, bound to the very token,
//! dropped by a membership change, served stale in an outage.
use super::*;

fn token_record(user: &str) -> SessionRecord {
    SessionRecord {
        id: "jwt".into(),
        user_id: user.into(),
        created_at: 0,
        expires_at: i64::MAX,
    }
}

#[tokio::test(start_paused = true)]
async fn a_verified_tokens_user_is_cached_under_the_tokens_hash_until_a_membership_changes() {
    let (store, cache) = setup();
    lock(&store.users).insert(
        "carol".into(),
        UserAccess {
            memberships: vec![("acme".into(), "viewer".into())],
            org_limits: vec![],
        },
    );
    const TOKEN_A: &str = "a.jwt.token";
    let hash = hash_secret(TOKEN_A);
    let first = cache
        .token_session(&hash, TOKEN_A, token_record("carol"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.role_in("acme"), Some("viewer"));
    let calls = store.calls();
    // The hot path's probe finds it fresh, without the store.
    let fresh = cache
        .fresh_session(&hash)
        .expect("fresh")
        .expect("positive");
    assert_eq!(fresh.session.user_id, "carol");
    assert_eq!(store.calls(), calls);
    cache.invalidate(&Change::Member {
        organization_id: "acme".into(),
        user_id: "carol".into(),
    });
    assert!(
        cache.fresh_session(&hash).is_none(),
        "a membership change drops it"
    );
    // Past cache_ttl it is no longer fresh either.
    cache
        .token_session(&hash, TOKEN_A, token_record("carol"))
        .await
        .unwrap();
    tokio::time::advance(CFG.ttl + Duration::from_millis(1)).await;
    assert!(cache.fresh_session(&hash).is_none());
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tokens_user_is_not_cached_and_an_outage_serves_the_stale_entry() {
    let (store, cache) = setup();
    const TOKEN_B: &str = "b.jwt.token";
    let hash = hash_secret(TOKEN_B);
    assert!(cache
        .token_session(&hash, TOKEN_B, token_record("dave"))
        .await
        .unwrap()
        .is_none());
    assert!(
        cache.fresh_session(&hash).is_none(),
        "no negative entry for a token"
    );
    lock(&store.users).insert("dave".into(), UserAccess::default());
    assert!(cache
        .token_session(&hash, TOKEN_B, token_record("dave"))
        .await
        .unwrap()
        .is_some());
    tokio::time::advance(CFG.ttl + Duration::from_millis(1)).await;
    store.down();
    let stale = cache
        .token_session(&hash, TOKEN_B, token_record("dave"))
        .await;
    assert_eq!(
        stale.unwrap().unwrap().session.user_id,
        "dave",
        "served stale"
    );
    tokio::time::advance(CFG.stale_if_error).await;
    assert!(cache
        .token_session(&hash, TOKEN_B, token_record("dave"))
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn a_cached_token_counts_only_for_the_very_token_it_holds() {
    let (store, cache) = setup();
    for user in ["erin", "frank"] {
        lock(&store.users).insert(user.into(), UserAccess::default());
    }
    // Two tokens under one key (a key hashes only a token's tail).
    let hash = hash_secret("shared tail");
    let erin = cache
        .token_session(&hash, "x.erin.tail", token_record("erin"))
        .await;
    assert_eq!(erin.unwrap().unwrap().session.user_id, "erin");
    let calls = store.calls();
    let frank = cache
        .token_session(&hash, "y.frank.tail", token_record("frank"))
        .await;
    assert_eq!(
        frank.unwrap().unwrap().session.user_id,
        "frank",
        "not erin's entry"
    );
    assert_eq!(
        store.calls(),
        calls + 1,
        "loaded, not served from erin's entry"
    );
}
