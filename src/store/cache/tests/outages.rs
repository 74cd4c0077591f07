//! The circuit breaker: lookups never wait on a store seen down, and a probe
//! closes it.
use super::*;

#[tokio::test(start_paused = true)]
async fn once_the_store_is_seen_down_no_lookup_waits_on_it_until_a_probe_finds_it() {
    let (store, cache) = setup();
    assert!(key_id(&cache, "k1").await.is_some());
    assert!(key_id(&cache, "k2").await.is_some());
    store.down();
    tokio::time::advance(CFG.ttl + Duration::from_secs(1)).await;
    // The first due lookup sees the failure and is served stale...
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    let calls = store.calls();
    // ...and from then on no lookup asks the store or waits: due keys are
    // served stale at once, an unseen key is refused at once.
    let started = Instant::now();
    for _ in 0..100 {
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        assert_eq!(key_id(&cache, "k2").await.as_deref(), Some("key_2"));
        let err = cache.api_key(&hash_secret("unseen")).await;
        assert!(matches!(err, Err(StoreError::Unreachable(_))), "{err:?}");
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(store.calls(), calls);
    // Meanwhile one probe pings the store every PROBE_EVERY.
    tokio::time::sleep(PROBE_EVERY * 10 + PROBE_EVERY / 2).await;
    let pings = store.pings.load(Ordering::SeqCst);
    assert!((9..=11).contains(&pings), "{pings} pings");
    assert_eq!(store.calls(), calls);
    // Back, with k2 deleted meanwhile: seen within one probe interval.
    store.up();
    lock(&store.keys).remove(&hash_secret("k2"));
    let back = Instant::now();
    while key_id(&cache, "k2").await.is_some() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(back.elapsed() <= PROBE_EVERY, "{:?}", back.elapsed());
    assert_eq!(key_id(&cache, "unseen").await, None);
}

#[tokio::test(start_paused = true)]
async fn lookups_waiting_on_a_hung_query_are_answered_when_the_breaker_opens() {
    let (store, cache) = setup();
    assert!(key_id(&cache, "k1").await.is_some());
    tokio::time::advance(CFG.ttl + Duration::from_secs(1)).await;
    // The refresh of k1 hangs, as a query on a connection that went dead does.
    store.delay_ms.store(2_000, Ordering::SeqCst);
    let started = Instant::now();
    let waiters: Vec<_> = (0..50)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { (key_id(&cache, "k1").await, started.elapsed()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Then another lookup finds the store refusing connections.
    store.down();
    let err = cache.api_key(&hash_secret("unseen")).await;
    assert!(matches!(err, Err(StoreError::Unreachable(_))), "{err:?}");
    for waiter in waiters {
        let (found, took) = waiter.await.unwrap();
        assert_eq!(found.as_deref(), Some("key_1"));
        assert!(took < Duration::from_millis(20), "{took:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn one_slow_query_does_not_open_the_breaker_but_several_in_a_row_do() {
    let (store, cache) = setup();
    assert!(key_id(&cache, "k1").await.is_some());
    assert!(key_id(&cache, "k2").await.is_some());
    tokio::time::advance(CFG.ttl + Duration::from_secs(1)).await;
    store.fail_with(Some(StoreError::Timeout));
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    assert_eq!(store.calls(), 3);
    // The next lookup still asks the store, and a success clears the count.
    store.fail_with(None);
    assert_eq!(key_id(&cache, "k2").await.as_deref(), Some("key_2"));
    assert_eq!(store.calls(), 4);
    store.fail_with(Some(StoreError::Timeout));
    for i in 0..OPEN_AFTER_FAILURES {
        let err = cache.api_key(&hash_secret(&format!("u{i}"))).await;
        assert!(matches!(err, Err(StoreError::Timeout)), "{err:?}");
    }
    let calls = store.calls();
    let err = cache.api_key(&hash_secret("u-next")).await;
    assert!(matches!(err, Err(StoreError::Unreachable(_))), "{err:?}");
    assert_eq!(store.calls(), calls, "an open breaker asked the store");
}

#[tokio::test(start_paused = true)]
async fn a_store_that_answers_pings_but_fails_lookups_does_not_flap_the_breaker() {
    let (store, cache) = setup();
    store.fail_with(Some(refused()));
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let _ = cache.api_key(&hash_secret(&format!("u{i}"))).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Each reopening soon after a close waits twice as long before its probe.
    let pings = store.pings.load(Ordering::SeqCst);
    assert!(
        (3..=8).contains(&pings),
        "{pings} probes (and as many closes) in 3 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unknown_secrets_stays_in_its_own_bound_keeps_known_keys_and_expires() {
    const KNOWN: usize = 500;
    const FLOOD: usize = 200_000;
    const BOUND: u64 = 1_000;
    let store = Arc::new(FakeStore::default());
    for i in 0..KNOWN {
        let id = format!("key_{i}");
        lock(&store.keys).insert(hash_secret(&id), key(&id, "acme", "alice", "admin"));
    }
    let cache = CachedKeyStore::new(
        store.clone(),
        CacheConfig {
            capacity: 1_000,
            negative_capacity: BOUND,
            ..CFG
        },
    );
    // Known keys come and come back during the flood, each every 50 000
    // unknown ones: with one bound for both, the flood evicted nearly every
    // known key before its next use.
    let mut known_lookups = 0;
    for i in 0..FLOOD {
        let found = cache.api_key(&hash_secret(&format!("unknown-{i}"))).await;
        assert!(matches!(found, Ok(None)));
        if i % 100 == 0 {
            let id = format!("key_{}", known_lookups % KNOWN);
            assert!(key_id(&cache, &id).await.is_some());
            known_lookups += 1;
        }
    }
    assert_eq!(known_lookups, 4 * KNOWN);
    assert_eq!(store.calls(), FLOOD + KNOWN, "known keys were evicted");
    let negatives = cache.negative_count();
    assert!(negatives <= BOUND, "{negatives} negative entries");
    assert!(negatives >= BOUND / 2, "{negatives} negative entries");
    assert_eq!(cache.entry_count(), KNOWN as u64 + negatives);
    // Kept while fresh, swept within SWEEP_EVERY once expired.
    tokio::time::sleep(CFG.negative_ttl - Duration::from_millis(100)).await;
    assert_eq!(cache.negative_count(), negatives);
    tokio::time::sleep(negative::SWEEP_EVERY + Duration::from_millis(100)).await;
    assert_eq!(cache.negative_count(), 0);
    assert_eq!(cache.entry_count(), KNOWN as u64);
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_a_lookup_begun_before_the_breaker_closed_does_not_open_it_again() {
    let store = Arc::new(FakeStore::default());
    let breaker = breaker::Breaker::new(store.clone());
    let before = breaker.epoch();
    breaker.failed(&refused(), before);
    assert!(breaker.is_open());
    // The store answers the probe: closed.
    tokio::time::sleep(PROBE_EVERY * 2).await;
    assert!(!breaker.is_open());
    // A lookup from before the close (a connect of the outage) fails now.
    breaker.failed(&refused(), before);
    assert!(
        !breaker.is_open(),
        "a failure from the outage opened it again"
    );
    // One begun since does open it.
    breaker.failed(&refused(), breaker.epoch());
    assert!(breaker.is_open());
}
