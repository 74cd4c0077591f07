//! Test helpers: a throw-away SQLite file or PostgreSQL database per test,
//! the macros that run a suite function on each backend, and the seed most
//! store tests start from.
use super::{ApiKeyRecord, NewApiKey, SqlStore, StoreConfig};
use sqlx::AssertSqlSafe;
use sqlx::{Connection, Executor, PgConnection};
use std::time::Duration;

/// The admin url tests create their PostgreSQL databases from.
fn pg_admin_url() -> String {
    std::env::var("MPG_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database name replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let root = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

/// A database that exists for one test and is dropped afterwards.
pub(crate) enum TestDb {
    /// A SQLite file in a temp dir (removed with the dir).
    Sqlite(tempfile::TempDir),
    /// A PostgreSQL database `mpg_test_<random>` (dropped on drop).
    Postgres { name: String },
}

impl TestDb {
    /// A fresh SQLite file in a new temp dir (the file itself not created yet,
    /// in a subdirectory that does not exist yet).
    pub(crate) fn sqlite() -> TestDb {
        match tempfile::tempdir() {
            Ok(dir) => TestDb::Sqlite(dir),
            Err(e) => panic!("tempdir: {e}"),
        }
    }

    /// A fresh PostgreSQL database created from `MPG_TEST_PG_URL`.
    pub(crate) async fn postgres() -> TestDb {
        let name = crate::secret::generate_id("mpg_test_").to_ascii_lowercase();
        let mut admin = PgConnection::connect(&pg_admin_url())
            .await
            .unwrap_or_else(|e| panic!("connect to MPG_TEST_PG_URL: {e}"));
        admin
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap_or_else(|e| panic!("create database: {e}"));
        let _ = admin.close().await;
        TestDb::Postgres { name }
    }

    /// The store url of this database.
    pub(crate) fn url(&self) -> String {
        match self {
            TestDb::Sqlite(dir) => {
                format!("sqlite://{}/nested/dir/gateway.db", dir.path().display())
            }
            TestDb::Postgres { name } => with_database(&pg_admin_url(), name),
        }
    }

    /// A connected and migrated store on this database.
    pub(crate) async fn store(&self) -> SqlStore {
        let cfg = StoreConfig {
            url: self.url(),
            query_timeout: Duration::from_secs(5),
        };
        let store = SqlStore::connect(&cfg)
            .await
            .unwrap_or_else(|e| panic!("connect: {e:?}"));
        store
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("migrate: {e:?}"));
        store
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let TestDb::Postgres { name } = self else {
            return;
        };
        let name = name.clone();
        // Drop may run inside a runtime: do the async cleanup on its own thread.
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&pg_admin_url()).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = admin.execute(AssertSqlSafe(sql)).await;
                    let _ = admin.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Runs each suite function (`async fn name(store: &SqlStore)`, in the
/// module that invokes this) against a fresh PostgreSQL database, in a
/// module named `$module`.
macro_rules! on_postgres {
    ($module:ident: $($name:ident),* $(,)?) => {
        mod $module {
            $(#[tokio::test]
            async fn $name() {
                let db = $crate::store::testing::TestDb::postgres().await;
                let store = db.store().await;
                super::$name(&store).await;
                store.pool.close().await;
            })*
        }
    };
}
pub(crate) use on_postgres;

/// Runs each suite function against a fresh SQLite file and a fresh
/// PostgreSQL database.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                let db = $crate::store::testing::TestDb::sqlite();
                super::$name(&db.store().await).await;
            })*
        }
        $crate::store::testing::on_postgres!(postgres: $($name),*);
    };
}
pub(crate) use both_backends;

/// Organization `acme` (named `Acme`), user `alice` and her membership as
/// `admin`.
pub(crate) async fn seed(store: &SqlStore) {
    store.create_organization("acme", Some("Acme")).await.ok();
    store.create_user("alice", Some("a@example.com")).await.ok();
    store.set_member("acme", "alice", "admin").await.ok();
}

/// A key named `name` for alice in acme, with two scopes.
pub(crate) fn new_key(name: &str) -> NewApiKey {
    NewApiKey {
        organization_id: "acme".into(),
        user_id: "alice".into(),
        name: name.into(),
        scopes: vec!["clusters:read".into(), "clusters:write".into()],
        expires_at: None,
        rate_limit: None,
        controls: Default::default(),
    }
}

#[test]
fn with_database_replaces_the_path() {
    assert_eq!(
        with_database("postgres://u@h:5432/test?sslmode=disable", "x"),
        "postgres://u@h:5432/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
}

/// An active key of `alice` in `acme`, created at 0 and expiring at 100,
/// with two scopes: the record the unit tests start from.
pub(crate) fn api_key_record() -> ApiKeyRecord {
    ApiKeyRecord {
        id: "key_abc".into(),
        name: "ci".into(),
        organization_id: "acme".into(),
        user_id: "alice".into(),
        scopes: vec!["clusters:read".into(), "clusters:write".into()],
        prefix: "AbCdEfGh".into(),
        created_at: 0,
        expires_at: Some(100),
        revoked_at: None,
        last_used_at: None,
        replaced_by: None,
        rate_limit: None,
        controls: Default::default(),
    }
}
