//! The store schema as migrations shipped in the binary. Each migration is a
//! list of single statements (PostgreSQL's extended protocol runs one at a
//! time); a backend-specific variant exists only where the syntax differs, and
//! an empty list where one backend needs nothing.
//! Column types stay portable: TEXT and BIGINT unix seconds.

/// Which SQL dialect a statement list is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// SQLite (embedded).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// Creates the migration ledger; run before anything else.
pub(crate) const LEDGER: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
     version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)";

/// One schema version.
pub(crate) struct Migration {
    /// Strictly increasing version number.
    pub(crate) version: i64,
    /// Statements for SQLite.
    pub(crate) sqlite: &'static [&'static str],
    /// Statements for PostgreSQL.
    pub(crate) postgres: &'static [&'static str],
}

impl Migration {
    /// The statements for `dialect`.
    pub(crate) fn statements(&self, dialect: Dialect) -> &'static [&'static str] {
        match dialect {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres => self.postgres,
        }
    }
}

/// Tables every version shares, in dependency order.
macro_rules! v1_common {
    () => {
        [
            "CREATE TABLE organizations (id TEXT PRIMARY KEY, name TEXT, \
             created_at BIGINT NOT NULL)",
            "CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT, created_at BIGINT NOT NULL)",
            "CREATE TABLE memberships (\
             organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE, \
             user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE, \
             role TEXT NOT NULL, PRIMARY KEY (organization_id, user_id))",
            "CREATE INDEX memberships_user ON memberships (user_id)",
            "CREATE TABLE api_keys (id TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, \
             prefix TEXT NOT NULL, name TEXT NOT NULL, \
             organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE, \
             user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE, \
             scopes TEXT NOT NULL, created_at BIGINT NOT NULL, expires_at BIGINT, \
             revoked_at BIGINT, last_used_at BIGINT)",
            "CREATE INDEX api_keys_org_page ON api_keys (organization_id, created_at, id)",
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, \
             user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE, \
             created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL)",
            "CREATE INDEX changes_at ON changes (at)",
        ]
    };
}

/// Version 1 for SQLite: `changes` must exist before its index.
const V1_SQLITE: [&str; 9] = {
    let common = v1_common!();
    [
        "CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, \
         subject TEXT NOT NULL, at BIGINT NOT NULL)",
        common[0],
        common[1],
        common[2],
        common[3],
        common[4],
        common[5],
        common[6],
        common[7],
    ]
};

/// Version 1 for PostgreSQL.
const V1_POSTGRES: [&str; 9] = {
    let common = v1_common!();
    [
        "CREATE TABLE changes (seq BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, \
         subject TEXT NOT NULL, at BIGINT NOT NULL)",
        common[0],
        common[1],
        common[2],
        common[3],
        common[4],
        common[5],
        common[6],
        common[7],
    ]
};

/// Version 2, both dialects: the change log's pruning horizon, one row
/// holding the highest `changes.seq` ever pruned (0: none). A follower whose
/// cursor is below it may have missed a pruned change and clears its cache.
/// `seq` itself never goes back (AUTOINCREMENT / BIGSERIAL), even once
/// pruning has emptied the table.
const V2: [&str; 2] = [
    "CREATE TABLE changes_horizon (id INTEGER PRIMARY KEY, pruned_through BIGINT NOT NULL)",
    "INSERT INTO changes_horizon (id, pruned_through) VALUES (1, 0)",
];

/// Version 3, both dialects: the key that replaced a rotated one (null
/// until the key is rotated). A rotated key is never rotated again.
const V3: [&str; 1] = ["ALTER TABLE api_keys ADD COLUMN replaced_by TEXT"];

/// Version 4, SQLite: the audit trail of the key lifecycle. `seq` orders
/// events (newest first) and pages them; `key_id` is kept after the key is
/// deleted, so it is no foreign key.
const V4_SQLITE: [&str; 2] = [
    "CREATE TABLE audit_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
     action TEXT NOT NULL, key_id TEXT NOT NULL, organization_id TEXT NOT NULL, \
     actor TEXT NOT NULL, request_id TEXT, client TEXT, at BIGINT NOT NULL)",
    "CREATE INDEX audit_events_org ON audit_events (organization_id, seq)",
];

/// Version 4, PostgreSQL: as [`V4_SQLITE`].
const V4_POSTGRES: [&str; 2] = [
    "CREATE TABLE audit_events (seq BIGSERIAL PRIMARY KEY, \
     action TEXT NOT NULL, key_id TEXT NOT NULL, organization_id TEXT NOT NULL, \
     actor TEXT NOT NULL, request_id TEXT, client TEXT, at BIGINT NOT NULL)",
    "CREATE INDEX audit_events_org ON audit_events (organization_id, seq)",
];

/// Version 5, both dialects: a key's own rate limit (both columns null: the
/// policies' quotas) and organizations' overrides of policy quotas, keyed by
/// policy name (an override of a policy no longer configured is unused).
const V5: [&str; 3] = [
    "ALTER TABLE api_keys ADD COLUMN rate_limit_requests BIGINT",
    "ALTER TABLE api_keys ADD COLUMN rate_limit_per_ms BIGINT",
    "CREATE TABLE org_rate_limits (\
     organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE, \
     policy TEXT NOT NULL, requests BIGINT NOT NULL, per_ms BIGINT NOT NULL, \
     PRIMARY KEY (organization_id, policy))",
];

/// Version 6, PostgreSQL only: the secret hashes compare byte by byte (collation "C").
/// They are lowercase hex, so no order or equality changes, but under a database's
/// default collation every comparison of a batched lookup's index search goes through
/// the locale, a cost that buys nothing for hex. Each column keeps its type, so the table is not
/// rewritten; its unique index is rebuilt. SQLite compares bytes already.
const V6_POSTGRES: [&str; 2] = [
    "ALTER TABLE api_keys ALTER COLUMN key_hash TYPE TEXT COLLATE \"C\"",
    "ALTER TABLE sessions ALTER COLUMN token_hash TYPE TEXT COLLATE \"C\"",
];

/// Version 7, SQLite: audit events get opaque ids (`evt_` and random hex;
/// new events get `evt_` and 16 base62 characters from the gateway), so that
/// neither an id nor a cursor tells how many events other organizations had.
/// `seq` still orders and pages them. SQLite cannot add a column with a
/// random default, and one process writes it, so existing rows are filled once.
const V7_SQLITE: [&str; 3] = [
    "ALTER TABLE audit_events ADD COLUMN id TEXT",
    "UPDATE audit_events SET id = 'evt_' || lower(hex(randomblob(12)))",
    "CREATE UNIQUE INDEX audit_events_id ON audit_events (id)",
];

/// Version 7, PostgreSQL: as [`V7_SQLITE`], the random default filling
/// existing rows and any row an instance not yet upgraded still writes.
const V7_POSTGRES: [&str; 3] = [
    "ALTER TABLE audit_events ADD COLUMN id TEXT \
     DEFAULT ('evt_' || replace(gen_random_uuid()::text, '-', ''))",
    "ALTER TABLE audit_events ALTER COLUMN id SET NOT NULL",
    "CREATE UNIQUE INDEX audit_events_id ON audit_events (id)",
];

/// Version 8, both dialects: the admin API's bearer tokens, by SHA-256.
const V8: [&str; 1] = [
    "CREATE TABLE admin_tokens (id TEXT PRIMARY KEY, name TEXT NOT NULL, \
     token_hash TEXT NOT NULL UNIQUE, created_at BIGINT NOT NULL, revoked_at BIGINT)",
];

/// Version 9, SQLite: audit events of other things than keys (an
/// organization, a membership, a limit, a session): `key_id` may be null, and
/// `subject` names what was changed (a user, a policy, a session). SQLite
/// cannot drop a NOT NULL, so the table is rebuilt, ids and order kept.
const V9_SQLITE: [&str; 6] = [
    "CREATE TABLE audit_events_v9 (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, \
     action TEXT NOT NULL, key_id TEXT, subject TEXT, organization_id TEXT NOT NULL, \
     actor TEXT NOT NULL, request_id TEXT, client TEXT, at BIGINT NOT NULL)",
    "INSERT INTO audit_events_v9 (seq, id, action, key_id, organization_id, actor, \
     request_id, client, at) SELECT seq, id, action, key_id, organization_id, actor, \
     request_id, client, at FROM audit_events",
    "DROP TABLE audit_events",
    "ALTER TABLE audit_events_v9 RENAME TO audit_events",
    "CREATE INDEX audit_events_org ON audit_events (organization_id, seq)",
    "CREATE UNIQUE INDEX audit_events_id ON audit_events (id)",
];

/// Version 9, PostgreSQL: as [`V9_SQLITE`], in place.
const V9_POSTGRES: [&str; 2] = [
    "ALTER TABLE audit_events ALTER COLUMN key_id DROP NOT NULL",
    "ALTER TABLE audit_events ADD COLUMN subject TEXT",
];

/// Version 10, both dialects: a key's controls. `enabled` is 1 or 0;
/// `ip_allow` its networks one comma apart (null: any); `meta` a JSON
/// object's text; credits null for an unlimited key, else what is left in
/// refill period `credits_period`, and the refill (both null: none).
/// `credits_generation` grows each time the credits are set, so a count
/// kept for an older setting (in Redis, in an instance) is replaced.
const V10: [&str; 8] = [
    "ALTER TABLE api_keys ADD COLUMN enabled BIGINT NOT NULL DEFAULT 1",
    "ALTER TABLE api_keys ADD COLUMN ip_allow TEXT",
    "ALTER TABLE api_keys ADD COLUMN meta TEXT",
    "ALTER TABLE api_keys ADD COLUMN credits_remaining BIGINT",
    "ALTER TABLE api_keys ADD COLUMN credits_refill_amount BIGINT",
    "ALTER TABLE api_keys ADD COLUMN credits_refill_secs BIGINT",
    "ALTER TABLE api_keys ADD COLUMN credits_period BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE api_keys ADD COLUMN credits_generation BIGINT NOT NULL DEFAULT 0",
];

/// Versions where SQLite rebuilds a table that PostgreSQL alters in place, so
/// the two dialects' statements do not pair up one to one.
#[cfg(test)]
const REBUILT_ON_SQLITE: [i64; 1] = [9];

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sqlite: &V1_SQLITE,
        postgres: &V1_POSTGRES,
    },
    Migration {
        version: 2,
        sqlite: &V2,
        postgres: &V2,
    },
    Migration {
        version: 3,
        sqlite: &V3,
        postgres: &V3,
    },
    Migration {
        version: 4,
        sqlite: &V4_SQLITE,
        postgres: &V4_POSTGRES,
    },
    Migration {
        version: 5,
        sqlite: &V5,
        postgres: &V5,
    },
    Migration {
        version: 6,
        sqlite: &[],
        postgres: &V6_POSTGRES,
    },
    Migration {
        version: 7,
        sqlite: &V7_SQLITE,
        postgres: &V7_POSTGRES,
    },
    Migration {
        version: 8,
        sqlite: &V8,
        postgres: &V8,
    },
    Migration {
        version: 9,
        sqlite: &V9_SQLITE,
        postgres: &V9_POSTGRES,
    },
    Migration {
        version: 10,
        sqlite: &V10,
        postgres: &V10,
    },
];

/// The channel `NOTIFY` is sent on when a change is logged (PostgreSQL).
pub(crate) const NOTIFY_CHANNEL: &str = "mpg_gateway_changes";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_strictly_increase_and_dialects_align() {
        let mut last = 0;
        for m in MIGRATIONS {
            assert!(m.version > last);
            last = m.version;
            // A migration only one dialect needs leaves the other's list empty.
            let one_sided = m.sqlite.is_empty() || m.postgres.is_empty();
            let rebuilt = REBUILT_ON_SQLITE.contains(&m.version);
            assert!(one_sided || rebuilt || m.sqlite.len() == m.postgres.len());
        }
        assert!(MIGRATIONS[0].sqlite[0].starts_with("CREATE TABLE changes"));
    }
}
