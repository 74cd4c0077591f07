//! Deleting organizations and users, removing memberships, listing and
//! revoking sessions: what goes, what stays, and the changes logged. Each
//! test runs on SQLite and on the PostgreSQL at `MPG_TEST_PG_URL`.
use super::*;
use crate::secret::hash_secret;
use crate::store::testing::TestDb;
use crate::store::{KeyStore, NewApiKey};
use std::time::Duration;

/// Runs `check` on a fresh SQLite store, then on a fresh PostgreSQL one.
macro_rules! on_both {
    ($check:ident) => {{
        let db = TestDb::sqlite();
        $check(&db.store().await).await;
        let db = TestDb::postgres().await;
        let store = db.store().await;
        $check(&store).await;
        store.pool.close().await;
    }};
}

/// acme and globex; alice in both, bob in acme; a key of each in acme and
/// one of alice in globex; a session each. Returns (alice's acme key,
/// alice's globex key, bob's key, alice's session token, bob's session token).
async fn world(store: &SqlStore) -> (String, String, String, String, String) {
    for org in ["acme", "globex"] {
        assert!(store.create_organization(org, None).await.is_ok());
    }
    for user in ["alice", "bob"] {
        assert!(store.create_user(user, None).await.is_ok());
    }
    for (org, user) in [("acme", "alice"), ("globex", "alice"), ("acme", "bob")] {
        assert!(store.set_member(org, user, "member").await.is_ok());
    }
    let key = |org: &str, user: &str| NewApiKey {
        organization_id: org.into(),
        user_id: user.into(),
        name: "k".into(),
        scopes: vec!["clusters:read".into()],
        expires_at: None,
        rate_limit: None,
        controls: Default::default(),
    };
    let mut ids = Vec::new();
    for (org, user) in [("acme", "alice"), ("globex", "alice"), ("acme", "bob")] {
        let Ok((_, record)) = store.create_api_key(key(org, user)).await else {
            panic!("create key")
        };
        ids.push(record.id);
    }
    let mut tokens = Vec::new();
    for user in ["alice", "bob"] {
        let Ok((token, _)) = store.create_session(user, Duration::from_secs(60)).await else {
            panic!("create session")
        };
        tokens.push(token);
    }
    let [a, g, b] = <[String; 3]>::try_from(ids).unwrap_or_else(|_| panic!("three keys"));
    let [ta, tb] = <[String; 2]>::try_from(tokens).unwrap_or_else(|_| panic!("two sessions"));
    (a, g, b, ta, tb)
}

async fn changes_after(store: &SqlStore, seq: i64) -> Vec<Change> {
    match store.changes_since(seq).await {
        Ok((_, changes)) => changes,
        Err(e) => panic!("changes: {e:?}"),
    }
}

#[tokio::test]
async fn deleting_an_organization_removes_its_keys_and_memberships_and_keeps_its_users() {
    async fn check(store: &SqlStore) {
        let (alice_acme, alice_globex, bob_key, alice_token, _) = world(store).await;
        let start = store.latest_change_seq().await.unwrap_or(-1);
        let Ok(Some(removed)) = store.delete_organization("acme").await else {
            panic!("delete")
        };
        let mut keys = removed.api_keys.clone();
        keys.sort();
        let mut want = vec![alice_acme.clone(), bob_key.clone()];
        want.sort();
        assert_eq!(keys, want);
        assert!(removed.sessions.is_empty());
        let mut members = removed.memberships.clone();
        members.sort();
        assert_eq!(
            members,
            vec![
                ("acme".to_owned(), "alice".to_owned()),
                ("acme".to_owned(), "bob".to_owned())
            ]
        );
        let logged = changes_after(store, start).await;
        assert_eq!(logged.len(), 4, "{logged:?}");
        for id in [&alice_acme, &bob_key] {
            assert!(logged.contains(&Change::ApiKey { id: id.clone() }));
        }
        assert!(logged.contains(&Change::Member {
            organization_id: "acme".into(),
            user_id: "bob".into()
        }));
        assert_eq!(store.get_api_key(&alice_acme).await.ok(), Some(None));
        assert!(store
            .get_api_key(&alice_globex)
            .await
            .ok()
            .flatten()
            .is_some());
        // Alice keeps her session, now for globex alone.
        let session = store.find_session(&hash_secret(&alice_token)).await;
        let Ok(Some(session)) = session else {
            panic!("alice's session is gone")
        };
        assert_eq!(
            session.memberships,
            vec![("globex".into(), "member".into())]
        );
        assert!(matches!(
            store.list_members("acme").await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.delete_organization("acme").await.ok(), Some(None));
        // The id is free again.
        assert!(store.create_organization("acme", None).await.is_ok());
    }
    on_both!(check);
}

#[tokio::test]
async fn deleting_a_user_ends_their_sessions_and_removes_their_keys_everywhere() {
    async fn check(store: &SqlStore) {
        let (alice_acme, alice_globex, bob_key, alice_token, bob_token) = world(store).await;
        let start = store.latest_change_seq().await.unwrap_or(-1);
        let Ok(Some(removed)) = store.delete_user("alice").await else {
            panic!("delete")
        };
        assert_eq!(removed.sessions.len(), 1);
        let mut keys = removed.api_keys.clone();
        keys.sort();
        let mut want = vec![alice_acme, alice_globex];
        want.sort();
        assert_eq!(keys, want);
        assert_eq!(removed.memberships.len(), 2);
        let logged = changes_after(store, start).await;
        assert_eq!(logged.len(), 5, "{logged:?}");
        assert!(logged.contains(&Change::Session {
            id: removed.sessions[0].clone()
        }));
        assert_eq!(
            store.find_session(&hash_secret(&alice_token)).await.ok(),
            Some(None)
        );
        // Bob, his key and his session are untouched.
        assert!(store.get_api_key(&bob_key).await.ok().flatten().is_some());
        assert!(store
            .find_session(&hash_secret(&bob_token))
            .await
            .ok()
            .flatten()
            .is_some());
        let members = store.list_members("acme").await.unwrap_or_default();
        let members: Vec<(&str, &str, &str)> = (members.iter())
            .map(|m| {
                (
                    m.organization_id.as_str(),
                    m.user_id.as_str(),
                    m.role.as_str(),
                )
            })
            .collect();
        assert_eq!(members, [("acme", "bob", "member")]);
        assert_eq!(store.delete_user("alice").await.ok(), Some(None));
    }
    on_both!(check);
}

#[tokio::test]
async fn removing_a_membership_logs_a_member_change_and_keeps_the_key() {
    async fn check(store: &SqlStore) {
        let (_, _, bob_key, _, _) = world(store).await;
        let start = store.latest_change_seq().await.unwrap_or(-1);
        assert_eq!(
            store.remove_member("acme", "bob").await.ok(),
            Some(Some("member".into()))
        );
        assert_eq!(
            changes_after(store, start).await,
            vec![Change::Member {
                organization_id: "acme".into(),
                user_id: "bob".into()
            }]
        );
        assert_eq!(store.remove_member("acme", "bob").await.ok(), Some(None));
        assert!(matches!(
            store.remove_member("nope", "bob").await,
            Err(StoreError::NotFound(m)) if m == "organization nope"
        ));
        assert!(matches!(
            store.remove_member("acme", "carol").await,
            Err(StoreError::NotFound(m)) if m == "user carol"
        ));
        assert!(store.get_api_key(&bob_key).await.ok().flatten().is_some());
    }
    on_both!(check);
}

#[tokio::test]
async fn sessions_are_listed_without_their_token_and_revoked_with_a_change() {
    async fn check(store: &SqlStore) {
        let (_, _, _, alice_token, _) = world(store).await;
        let Ok((_, second)) = store.create_session("alice", Duration::from_secs(10)).await else {
            panic!("create session")
        };
        let Ok(listed) = store.list_sessions("alice").await else {
            panic!("list")
        };
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&second));
        assert_eq!(
            store.list_sessions("bob").await.map(|l| l.len()).ok(),
            Some(1)
        );
        assert!(matches!(
            store.list_sessions("carol").await,
            Err(StoreError::NotFound(m)) if m == "user carol"
        ));
        let first = listed.iter().find(|s| s.id != second.id).cloned();
        let Some(first) = first else { panic!("first") };
        let start = store.latest_change_seq().await.unwrap_or(-1);
        assert_eq!(
            store.revoke_session(&first.id).await.ok(),
            Some(Some(first.clone()))
        );
        assert_eq!(
            changes_after(store, start).await,
            vec![Change::Session {
                id: first.id.clone()
            }]
        );
        assert_eq!(
            store.find_session(&hash_secret(&alice_token)).await.ok(),
            Some(None)
        );
        assert_eq!(store.revoke_session(&first.id).await.ok(), Some(None));
        assert_eq!(store.list_sessions("alice").await.ok(), Some(vec![second]));
    }
    on_both!(check);
}

#[test]
fn a_large_removal_is_logged_as_one_drop_everything() {
    let mut removed = Removed {
        api_keys: (0..MAX_ITEMIZED).map(|i| format!("key_{i}")).collect(),
        ..Removed::default()
    };
    assert_eq!(removed.changes().len(), MAX_ITEMIZED);
    removed.sessions.push("ses_1".into());
    assert_eq!(removed.changes(), vec![Change::All]);
}
