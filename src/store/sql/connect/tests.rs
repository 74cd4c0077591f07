//! Reaching the store: refused and silent servers, SQLite's connection
//! settings, query timeouts and bad urls.
use super::*;
use crate::secret::hash_secret;
use crate::store::testing::TestDb;
use crate::store::KeyStore;
use sqlx::Row;

#[tokio::test]
async fn a_refused_connect_is_unreachable_at_once_not_at_the_query_timeout() {
    // sqlx's pool retries a refused connect until its acquire deadline; the
    // store fails it at once.
    let cfg = StoreConfig {
        url: "postgres://postgres@127.0.0.1:1/none".into(),
        query_timeout: Duration::from_secs(2),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(store.backend(), "postgres");
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = store.ping().await.err();
        assert!(matches!(err, Some(StoreError::Unreachable(_))), "{err:?}");
        let lookup = store.find_api_key(&hash_secret("x")).await;
        assert!(
            matches!(lookup, Err(StoreError::Unreachable(_))),
            "{lookup:?}"
        );
        let took = started.elapsed();
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}

#[tokio::test]
async fn a_server_that_accepts_and_never_answers_is_unreachable_within_half_the_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let cfg = StoreConfig {
        url: format!("postgres://postgres@{addr}/none"),
        query_timeout: Duration::from_secs(1),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let started = std::time::Instant::now();
    let err = store.ping().await.err();
    let took = started.elapsed();
    assert!(matches!(err, Some(StoreError::Unreachable(_))), "{err:?}");
    assert!(took < Duration::from_millis(900), "{took:?}");
    hold.abort();
}

#[tokio::test]
async fn sqlite_connections_use_wal_and_busy_timeout() {
    let db = TestDb::sqlite();
    let store = db.store().await;
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_default();
    assert_eq!(mode, "wal");
    let busy: i64 = sqlx::query("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_default();
    assert_eq!(busy, 5000);
    assert_eq!(store.backend(), "sqlite");
}

#[tokio::test]
async fn slow_query_is_a_timeout() {
    let cfg = StoreConfig {
        url: std::env::var("MPG_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        query_timeout: Duration::from_millis(200),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let slow = store
        .timed(async {
            sqlx::query("SELECT 1 FROM pg_sleep(2)")
                .execute(&mut *conn)
                .await
                .db()
        })
        .await;
    assert!(matches!(slow, Err(StoreError::Timeout)), "{slow:?}");
}

#[tokio::test]
async fn bad_url_is_invalid() {
    let cfg = StoreConfig {
        url: "mysql://x".into(),
        query_timeout: Duration::from_secs(1),
    };
    assert!(matches!(
        SqlStore::connect(&cfg).await,
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn sqlite_path_finds_the_file() {
    assert_eq!(
        sqlite_path("sqlite://data/g.db?mode=rwc"),
        Some("data/g.db")
    );
    assert_eq!(sqlite_path("sqlite::memory:"), None);
}
